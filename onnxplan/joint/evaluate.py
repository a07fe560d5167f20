"""The independent checker and evaluators of a joint schedule (onnxplan.joint.problem's model): whether
a point of the model is a schedule (`violations`), its memory per forward EO and per stage
(`memory`), and its predicted step time (`step_seconds`). The solver's output is checked here,
as offsets are checked by onnxplan.verify."""

from __future__ import annotations

from onnxplan.joint.problem import Decisions, JointProblem
from onnxplan.swap.pricing import TRANSFER_SECONDS, Transfer, io_stalls

__all__ = ["alive_at", "consumers", "early_issue", "memory", "minimal_keeps", "needs", "step_seconds",
           "violations"]


def early_issue(prob: JointProblem, t: int, b: int, bandwidth: float) -> tuple[int, float] | None:
    """(issue stage, seconds left unhidden) of an early page-in of buffer b for stage t: the
    latest stage s <= t - 2 whose start leaves stages s .. t-1 (their compute, no recomputation)
    at least b's transfer time at `bandwidth`; when none does, the earliest allowed (stage 1,
    or the stage after the last one before t whose anchor reads b) with what stays exposed.
    None when stage t-1 alone hides it or no stage before t - 1 is allowed (the one-stage
    prefetch is all there is)."""
    buf = prob.buffers[b]
    low = max([1] + [r + 1 for r in buf.reads if r < t])
    need = buf.nbytes / bandwidth
    window = prob.stage_seconds[t - 2] if t >= 2 else 0.0  # stage t-1's compute (the one-stage prefetch)
    if window >= need:
        return None  # one stage ahead hides it
    for s in range(t - 2, low - 1, -1):
        window += prob.stage_seconds[s - 1]
        if window >= need:
            return s, 0.0
    return (low, need - window) if low <= t - 2 else None


def needs(prob: JointProblem, recompute) -> list[set[int]]:
    """Per buffer: the stages it must be in memory in (its anchors, and each recomputation
    that reads it)."""
    out = [set(b.reads) for b in prob.buffers]
    for t, n in recompute:
        for b in prob.node_inputs[n]:
            out[b].add(t)
    return out


def minimal_keeps(prob: JointProblem, recompute, page_in=()) -> frozenset[tuple[int, int]]:
    """The fewest keeps that give every need its buffer: kept from the last restore (forward
    pass, recomputation, page-in) up to each need."""
    restores: set[tuple[int, int]] = {(t, b) for t, b in page_in}
    for t, n in recompute:
        restores.update((t, b) for b in prob.node_outputs[n])
    keep = set()
    for b, ts in enumerate(needs(prob, recompute)):
        pending = False
        for t in range(prob.buffers[b].last_need, 0, -1):
            pending = pending or t in ts
            if (t, b) in restores:
                pending = False
            elif pending:
                keep.add((t, b))
    return frozenset(keep)


def violations(prob: JointProblem, d: Decisions) -> list[str]:
    """What makes `d` not a schedule (empty: it is one): a need not in memory, a keep of a
    buffer absent the stage before, a buffer both kept and restored, a page-in of a buffer
    never written, a recomputation of a paged buffer or of a stage past its need."""
    bad = []
    for b, ts in enumerate(needs(prob, d.recompute)):
        for t in ts:
            if not d.present(prob, t, b):
                bad.append(f"buffer {prob.buffers[b].root} needed at stage {t} is not in memory")
    for t, b in d.keep:
        if t > 1 and not d.present(prob, t - 1, b):
            bad.append(f"buffer {prob.buffers[b].root} kept into stage {t} was not in memory at {t - 1}")
        p = prob.buffers[b].producer
        if (t, b) in d.page_in or (p >= 0 and (t, p) in d.recompute):
            bad.append(f"buffer {prob.buffers[b].root} kept and restored at stage {t}")
    for t, b in d.page_in:
        if b not in d.page_out:
            bad.append(f"buffer {prob.buffers[b].root} paged in at stage {t} but never written")
    for t, b, s in d.early:
        if (t, b) not in d.page_in or not 1 <= s < t - 1:
            bad.append(f"buffer {prob.buffers[b].root}: an early page-in for stage {t} issued at stage {s}")
    for t, n in d.recompute:
        if any(b in d.page_out for b in prob.node_outputs[n]):
            bad.append(f"node {prob.nodes[n]} recomputed although an output is paged")
    return bad


def memory(prob: JointProblem, d: Decisions) -> tuple[int, list[int], list[int]]:
    """(peak with persistent bytes, bytes per forward EO, bytes per stage) of the model.

    A buffer adds its bytes to the forward EOs between its producer and last forward reader
    (always), after that to the end of the forward pass when kept into stage 1, and up to
    `held_until` when paged out; to a stage when kept into it, or restored in it (recomputed or
    paged in) and read by its anchor or kept into the next; to the stages a page-in is in flight
    (issued at or before them, due after); and, while a node is recomputed in a stage, what that
    node needs held (`restored_at`). Each term is summed over the decisions that make it, so a
    call costs the model's size plus the decisions' count (the solver's hints call it hundreds
    of times a plan)."""
    B = prob.buffers
    F = prob.n_forward
    T = prob.stages
    on_fwd = [0] * (F + 1)  # difference array over the forward EOs

    def hold(first: int, last: int, nbytes: int) -> None:
        first, last = max(0, first), min(last, F - 1)
        if first <= last:
            on_fwd[first] += nbytes
            on_fwd[last + 1] -= nbytes

    for b in B:
        hold(b.born, b.last_forward, b.nbytes)
    for t, k in d.keep:
        if t == 1:
            hold(B[k].last_forward + 1, F - 1, B[k].nbytes)
    for k in d.page_out:
        hold(B[k].last_forward + 1, B[k].held_until, B[k].nbytes)
    fwd, held = [], 0
    for e in range(F):
        held += on_fwd[e]
        fwd.append(prob.fixed[e] + held)

    in_flight = [0] * (T + 2)  # difference array over the stages: page-ins issued, not yet due
    for (tt, k), s in d.issued().items():
        first, last = max(1, s), min(tt - 1, T)
        if first <= last:
            in_flight[first] += B[k].nbytes
            in_flight[last + 1] -= B[k].nbytes
    writing = sum(B[k].nbytes for k in d.page_out if B[k].held_until >= F)  # writes pending into stage 1
    kept_at: dict[int, set[int]] = {}
    for t, k in d.keep:
        kept_at.setdefault(t, set()).add(k)
    page_in_at: dict[int, set[int]] = {}
    for t, k in d.page_in:
        page_in_at.setdefault(t, set()).add(k)
    brought_at = {t: set(ks) for t, ks in page_in_at.items()}  # paged in or recomputed
    recomputed_at: dict[int, list[int]] = {}
    made_by: dict[int, list[int]] = {}
    for k, b in enumerate(B):
        if b.producer >= 0:
            made_by.setdefault(b.producer, []).append(k)
    for t, n in d.recompute:
        recomputed_at.setdefault(t, []).append(n)
        brought_at.setdefault(t, set()).update(made_by.get(n, ()))
    none: set[int] = set()
    last_read = [max(r, default=-1) for r in consumers(prob)] if d.recompute else []
    stage, ahead = [], 0
    for t in range(1, T + 1):
        ahead += in_flight[t]
        kept_here, kept_next = kept_at.get(t, none), kept_at.get(t + 1, none)
        kept = sum(B[k].nbytes for k in kept_here)
        restored = sorted(brought_at.get(t, none) - kept_here)
        at_anchor = kept + sum(B[k].nbytes for k in restored if t in B[k].reads or k in kept_next)
        pending = ahead + (writing if t == 1 else 0)
        m = prob.stage_fixed(t) + at_anchor + pending
        if t in recomputed_at:
            # held while node n is recomputed (alive_at): a restored buffer made by n or read at or
            # after it, or (not before its producer) read by the anchor or kept into the next
            # stage; a paged-in one has no producer here
            paged = page_in_at.get(t, none)
            restored_facts = [(B[k].nbytes, -1 if k in paged else B[k].producer, last_read[k],
                     t in B[k].reads or k in kept_next) for k in restored]
            base = prob.carried[prob.starts[t - 1]] + kept + pending
            for n in recomputed_at[t]:
                m = max(m, base + prob.node_scratch[n] + sum(
                    nbytes for nbytes, p, last, anchored in restored_facts if p <= n and (p == n or last >= n or anchored)))
        stage.append(m)
    return prob.persistent + max(fwd + stage), fwd, stage


def consumers(prob: JointProblem) -> list[list[int]]:
    """Per buffer: the recomputable nodes that read it."""
    out: list[list[int]] = [[] for _ in prob.buffers]
    for n, ins in enumerate(prob.node_inputs):
        for b in ins:
            out[b].append(n)
    return out


def alive_at(prob: JointProblem, b: int, n: int, readers: list[list[int]]) -> bool | None:
    """Whether buffer b, restored in a stage, is still held when node n is recomputed there:
    True when n makes it or a node at or after n may read it, None when only if the anchor reads
    it or it is kept into the next stage, False when n comes before its producer."""
    p = prob.buffers[b].producer
    if p > n:
        return False
    if p == n or any(c >= n for c in readers[b]):
        return True
    return None


def step_seconds(prob: JointProblem, d: Decisions, bandwidth: float | None = None) -> tuple[float, float, float]:
    """(predicted step seconds, recompute seconds, exposed transfer seconds): every node once,
    the recomputations, the executor's CPU per transfer (TRANSFER_SECONDS), and the larger of
    the I/O thread's CPU (prob.io_cpu_per_byte) and what one I/O worker cannot hide
    (onnxplan.swap.pricing.io_stalls, the swap module's footing) on the model's segments (each
    forward EO, then each stage with its recomputations): a page-out is issued after its
    buffer's last forward use and due where its memory is freed (Buffer.held_until), a stage's
    page-ins issued as the stage before starts (an early one as its issue stage starts) and due
    at its own start."""
    rec = [0.0] * (prob.stages + 1)
    for t, n in d.recompute:
        rec[t] += prob.node_seconds[n]
    stall = 0.0
    if bandwidth and (d.page_out or d.page_in):
        B = prob.buffers
        # one segment per forward EO, then one per stage: stage t starts at boundary F - 1 + t
        F = len(prob.forward_eo_seconds)
        segments = prob.forward_eo_seconds + [prob.stage_seconds[t - 1] + rec[t] for t in range(1, prob.stages + 1)]
        transfers = [Transfer(B[b].nbytes, B[b].last_forward + 1, min(B[b].held_until + 1, F), write=True)
                     for b in sorted(d.page_out)]
        transfers += [Transfer(B[b].nbytes, F - 1 + max(0, s), F - 1 + t)
                      for (t, b), s in sorted(d.issued().items())]
        transfers.sort(key=lambda tr: tr.issue)
        # the I/O thread's CPU delays the compute stream where it waits for nothing (pricing.StepPrice)
        moved = sum(tr.nbytes for tr in transfers)
        stall = max(sum(io_stalls(segments, transfers, bandwidth)), moved * prob.io_cpu_per_byte)
    handled = TRANSFER_SECONDS * (len(d.page_out) + len(d.page_in))
    return prob.step_seconds + sum(rec) + handled + stall, sum(rec), stall
