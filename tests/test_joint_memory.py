"""onnxplan.joint.evaluate.memory (summed over the decisions) against the model's definition
written out buffer by buffer and stage by stage (the direct reading, O(stages x buffers)), on
random points of real problems: recomputations, keeps, page-outs held while their writes run,
page-ins issued one stage ahead and earlier. Valid schedules or not: memory is a formula of the
decisions, and both readings must give the same numbers for any."""

from __future__ import annotations

import random

import pytest

from onnxplan.ir.load import read_step
from onnxplan.joint import build_problem
from onnxplan.joint.evaluate import alive_at, consumers, memory, minimal_keeps
from onnxplan.joint.hints import keep_all
from onnxplan.joint.problem import Decisions, JointProblem
from onnxplan.pipeline import run_pipeline
from tests.zoo_small import small_artifacts


def restored_at(prob: JointProblem, d: Decisions, t: int, n: int, readers: list[list[int]]) -> list[int]:
    """The restored (recomputed or paged-in) buffers held while node n is recomputed in stage t."""
    out = []
    for k, b in enumerate(prob.buffers):
        if not d.present(prob, t, k) or (t, k) in d.keep:
            continue
        alive = alive_at(prob, k, n, readers) if (t, k) not in d.page_in else (
            True if any(c >= n for c in readers[k]) else None)
        if alive is None:
            alive = t in b.reads or (t + 1, k) in d.keep
        if alive:
            out.append(k)
    return out


def memory_by_definition(prob: JointProblem, d: Decisions) -> tuple[int, list[int], list[int]]:
    B = prob.buffers
    F = prob.n_forward
    fwd = []
    for e in range(F):
        m = prob.fixed[e] + sum(b.nbytes for b in B if b.born <= e <= b.last_forward)
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
        m = max(prob.fixed[e] for e in prob.stage_range(t)) + at_anchor + ahead
        kept = sum(b.nbytes for k, b in enumerate(B) if (t, k) in d.keep)
        for tt, n in d.recompute:
            if tt == t:
                held = restored_at(prob, d, t, n, readers)
                m = max(m, prob.carried[prob.starts[t - 1]] + kept + ahead + prob.node_scratch[n]
                        + sum(B[k].nbytes for k in held))
        stage.append(m)
    return prob.persistent + max(fwd + stage), fwd, stage


def random_point(prob: JointProblem, rng: random.Random) -> Decisions:
    T, nb = prob.stages, len(prob.buffers)
    recompute = frozenset((rng.randint(1, T), rng.randrange(len(prob.nodes)))
                          for _ in range(rng.randint(0, 3 * len(prob.nodes) // 2)))
    page_out = frozenset(k for k, b in enumerate(prob.buffers) if b.swappable and rng.random() < 0.4)
    page_in = frozenset((rng.randint(1, T), k) for k in page_out for _ in range(rng.randint(0, 2)))
    early = frozenset((t, k, rng.randint(1, max(1, t - 2))) for t, k in page_in if t > 2 and rng.random() < 0.5)
    keep = set(minimal_keeps(prob, recompute, page_in)) if rng.random() < 0.5 else set()
    keep.update((rng.randint(1, T), rng.randrange(nb)) for _ in range(rng.randint(0, 2 * nb)))
    return Decisions(recompute, frozenset(keep), page_out, page_in, early)


@pytest.mark.parametrize("model, bandwidth", [("transformer", 1e7), ("resnet18", 1e9), ("gpt", None)])
def test_memory_equals_the_definition_on_random_points(model, bandwidth):
    pre = run_pipeline(read_step(small_artifacts(model)), ["realize", "interleave"])[0]
    costs = {n.name: 1e-3 for n in pre.nodes}
    prob = build_problem(pre, costs, swap_min_bytes=1024, swap_bandwidth=bandwidth)
    assert prob.nodes and any(b.swappable for b in prob.buffers)
    rng = random.Random(25)
    points = [keep_all(prob), Decisions()] + [random_point(prob, rng) for _ in range(12)]
    assert sum(bool(p.recompute and p.page_in and p.early) for p in points) >= 3, "the points exercise every term"
    for d in points:
        assert memory(prob, d) == memory_by_definition(prob, d)
