"""The independent checker and evaluators of a joint schedule (onnxplan.joint.problem's model): whether
a point of the model is a schedule (`violations`), its memory per forward EO and per stage
(`memory`), and its predicted step time (`step_seconds`). The solver's output is checked here,
as offsets are checked by onnxplan.verify."""

from __future__ import annotations

from onnxplan.joint.problem import Decisions, JointProblem
from onnxplan.swap.pricing import TRANSFER_SECONDS, Transfer, io_stalls

__all__ = ["alive_at", "consumers", "early_issue", "memory", "minimal_keeps", "needs", "restored_at", "step_seconds",
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
    """(peak with persistent bytes, bytes per forward EO, bytes per stage) of the model."""
    B = prob.buffers
    F = prob.n_forward
    fwd = []
    for e in range(F):
        m = prob.forward_base(e)
        for k, b in enumerate(B):
            if b.last_forward < e:
                m += b.nbytes * ((1, k) in d.keep)
            if b.last_forward < e <= b.held_until:
                m += b.nbytes * (k in d.page_out)
        fwd.append(m)
    stage = []
    readers = consumers(prob)
    issued = d.issued()
    for t in range(1, prob.stages + 1):
        ahead = sum(B[k].nbytes for (tt, k), s in issued.items() if s <= t < tt)
        if t == 1:
            ahead += sum(b.nbytes for k, b in enumerate(B) if k in d.page_out and b.held_until >= F)
        at_anchor = 0
        for k, b in enumerate(B):
            is_kept = (t, k) in d.keep
            is_restored = d.present(prob, t, k) and not is_kept
            at_anchor += b.nbytes * (is_kept or (is_restored and (t in b.reads or (t + 1, k) in d.keep)))
        m = prob.stage_fixed(t) + at_anchor + ahead
        kept = sum(b.nbytes for k, b in enumerate(B) if (t, k) in d.keep)
        here = [n for tt, n in d.recompute if tt == t]
        restored = [k for k in range(len(B)) if d.present(prob, t, k) and (t, k) not in d.keep] if here else []
        for n in here:
            m = max(m, prob.carried[prob.starts[t - 1]] + kept + ahead + prob.node_scratch[n]
                    + sum(B[k].nbytes for k in restored_at(prob, d, t, n, readers, restored)))
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


def restored_at(prob: JointProblem, d: Decisions, t: int, n: int, readers: list[list[int]] | None = None,
                restored: list[int] | None = None) -> list[int]:
    """The restored (recomputed or paged-in) buffers held while node n is recomputed in stage t
    (`readers`: consumers(prob); `restored`: the buffers present in t and not kept, when the
    caller has them)."""
    readers = readers if readers is not None else consumers(prob)
    if restored is None:
        restored = [k for k in range(len(prob.buffers)) if d.present(prob, t, k) and (t, k) not in d.keep]
    out = []
    for k in restored:
        b = prob.buffers[k]
        alive = alive_at(prob, k, n, readers) if (t, k) not in d.page_in else (
            True if any(c >= n for c in readers[k]) else None)
        if alive is None:
            alive = t in b.reads or (t + 1, k) in d.keep
        if alive:
            out.append(k)
    return out


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
