"""Invariants of every offset planner over random lifetime sets (hypothesis)."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnxplan.offsets import (
    ALIGNMENT,
    PLANNERS,
    Buffer,
    OffsetPlan,
    align,
    best_fit_offsets,
    greedy_size_offsets,
    ilp_offsets,
    lower_bound,
    naive_offsets,
)
from onnxplan.offsets.ilp import best_heuristic_offsets
from onnxplan.verify import PlanError, verify_offsets

HEURISTICS = ["naive", "sort", "greedy-size", "best-fit"]

sizes = st.one_of(
    st.sampled_from([0, 1, 63, 64, 65, 100, 1000, 4096, 5000]),
    st.integers(min_value=0, max_value=200_000),
)


@st.composite
def lifetime_sets(draw, max_buffers=60):
    n = draw(st.integers(min_value=0, max_value=max_buffers))
    out = []
    for i in range(n):
        first = draw(st.integers(min_value=0, max_value=40))
        span = draw(st.integers(min_value=0, max_value=20))
        vclass = draw(st.sampled_from(["activation", "activation", "gradient", "temporary"]))
        out.append(Buffer(f"b{i}", draw(sizes), first, first + span, vclass))
    return out


def reference_greedy_by_size(buffers):
    """Pisarchyk & Lee's greedy by size, the plain quadratic way (placed scanned by offset)."""
    placed: list[tuple[int, int, Buffer]] = []
    offsets = {}
    order = sorted(
        (b for b in buffers if b.nbytes), key=lambda b: (-align(b.nbytes), b.first - b.last, b.name)
    )
    for b in order:
        best, best_gap, cursor = None, None, 0
        for low, high, other in sorted(placed, key=lambda p: (p[0], p[1])):
            if other.last < b.first or b.last < other.first:
                continue
            gap = low - cursor
            if gap >= align(b.nbytes) and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, high)
        low = cursor if best is None else best
        placed.append((low, low + align(b.nbytes), b))
        offsets[b.name] = low
    return offsets


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lifetime_sets())
def test_heuristics_pass_the_verifier_and_respect_the_bound(bufs):
    bound = lower_bound(bufs)
    for name in HEURISTICS:
        plan = PLANNERS[name](bufs)
        verify_offsets(bufs, plan)
        assert plan.planner == name
        assert plan.arena_bytes >= bound
        assert set(plan.offsets) == {b.name for b in bufs}
        assert all(o % ALIGNMENT == 0 for o in plan.offsets.values())
        assert all(plan.offsets[b.name] == 0 for b in bufs if b.nbytes == 0)
    assert naive_offsets(bufs).arena_bytes == sum(align(b.nbytes) for b in bufs)


@settings(max_examples=60, deadline=None)
@given(lifetime_sets(), st.randoms(use_true_random=False))
def test_heuristics_ignore_input_order(bufs, rng):
    shuffled = list(bufs)
    rng.shuffle(shuffled)
    for name in HEURISTICS:
        assert PLANNERS[name](bufs).offsets == PLANNERS[name](shuffled).offsets


@settings(max_examples=100, deadline=None)
@given(lifetime_sets())
def test_greedy_size_matches_the_quadratic_reference(bufs):
    plan = greedy_size_offsets(bufs)
    expected = reference_greedy_by_size(bufs)
    assert {n: o for n, o in plan.offsets.items() if n in expected} == expected


@pytest.mark.parametrize("seed", range(4))
def test_greedy_size_matches_the_reference_past_its_batching(seed):
    """Hundreds of buffers, many with one shared lifetime: exercises merging and coalescing."""
    rng = random.Random(seed)
    bufs = []
    for i in range(400):
        kind = rng.random()
        if kind < 0.3:
            first, last = 0, 80  # live all step, like parameters
        elif kind < 0.45:
            first, last = 20, 30
        else:
            first = rng.randrange(80)
            last = first + rng.randrange(12)
        bufs.append(Buffer(f"b{i}", rng.choice([1, 64, 65, 200, 1000, 4096, 9999]), first, last))
    plan = greedy_size_offsets(bufs)
    verify_offsets(bufs, plan)
    assert plan.offsets == reference_greedy_by_size(bufs)


@pytest.mark.parametrize("seed", range(2))
def test_greedy_size_past_int64_packing_gives_the_same_layout_scaled(seed):
    """Arenas past 2**31 alignment units (128 GiB) are packed in Python ints: the layout of
    sizes scaled by 2**40 is the small layout scaled by 2**40 (greedy by size is scale-free),
    and it passes the verifier."""
    rng = random.Random(seed)
    small, big = [], []
    for i in range(300):
        first = rng.randrange(60)
        last = first + rng.randrange(15)
        nbytes = 64 * rng.choice([1, 3, 16, 100, 700])
        small.append(Buffer(f"b{i}", nbytes, first, last))
        big.append(Buffer(f"b{i}", nbytes << 40, first, last))
    plan_small, plan_big = greedy_size_offsets(small), greedy_size_offsets(big)
    verify_offsets(big, plan_big)
    assert plan_big.arena_bytes == plan_small.arena_bytes << 40 > 2**31 * 64
    assert plan_big.offsets == {n: o << 40 for n, o in plan_small.offsets.items()}


@settings(max_examples=8, deadline=None)
@given(lifetime_sets(max_buffers=40))
def test_ilp_is_sound_and_never_worse_than_its_seed(bufs):
    seed = best_heuristic_offsets(bufs)
    plan = ilp_offsets(bufs, time_limit=2.0, seed_plan=seed)
    verify_offsets(bufs, plan)
    assert lower_bound(bufs) <= plan.arena_bytes <= seed.arena_bytes
    assert plan.optimal is not None and plan.gap is not None and plan.gap >= 0.0
    if plan.arena_bytes == lower_bound(bufs):
        assert plan.optimal is True


@settings(max_examples=5, deadline=None)
@given(lifetime_sets(max_buffers=30))
def test_ilp_never_worse_than_a_poor_seed(bufs):
    seed = naive_offsets(bufs)
    plan = ilp_offsets(bufs, time_limit=2.0, seed_plan=seed)
    verify_offsets(bufs, plan)
    assert plan.arena_bytes <= seed.arena_bytes


def _time_overlapping_pair(bufs):
    sized = [b for b in bufs if b.nbytes]
    for i, a in enumerate(sized):
        for b in sized[i + 1 :]:
            if a.first <= b.last and b.first <= a.last:
                return a, b
    return None


@settings(max_examples=150, deadline=None)
@given(lifetime_sets(), st.sampled_from(HEURISTICS), st.integers(0, 3))
def test_verifier_detects_planted_faults(bufs, planner, fault):
    good = PLANNERS[planner](bufs)
    verify_offsets(bufs, good)
    offsets = dict(good.offsets)
    arena = good.arena_bytes
    if fault == 0:
        pair = _time_overlapping_pair(bufs)
        if pair is None:
            return
        a, b = pair
        offsets[a.name] = offsets[b.name]  # a now shares b's first byte while both live
        arena = max(arena, offsets[a.name] + align(a.nbytes))
        match = "overlap"
    elif fault == 1:
        sized = [b for b in bufs if b.nbytes]
        if not sized:
            return
        offsets[sized[0].name] += 8
        match = "not a multiple"
    elif fault == 2:
        if not bufs:
            return
        del offsets[bufs[-1].name]
        match = "no offset"
    else:
        if not any(b.nbytes for b in bufs):
            return
        arena = max(offsets[b.name] + b.nbytes for b in bufs if b.nbytes) - 1
        match = "outside the arena"
    with pytest.raises(PlanError, match=match):
        verify_offsets(bufs, OffsetPlan("planted", offsets, arena, 0.0))


def test_verifier_catches_a_random_swap_on_a_large_set():
    rng = random.Random(3)
    bufs = []
    for i in range(3000):
        first = rng.randrange(1000)
        bufs.append(Buffer(f"v{i}", rng.randrange(1, 100_000), first, first + rng.randrange(30)))
    good = best_fit_offsets(bufs)
    verify_offsets(bufs, good)
    overlapping = [
        (a, b)
        for a, b in zip(bufs, bufs[1:])
        if a.first <= b.last and b.first <= a.last and good.offsets[a.name] != good.offsets[b.name]
    ]
    a, b = overlapping[0]
    bad = dict(good.offsets)
    bad[a.name] = bad[b.name]
    arena = max(good.arena_bytes, bad[a.name] + align(a.nbytes))
    with pytest.raises(PlanError, match="overlap"):
        verify_offsets(bufs, OffsetPlan("planted", bad, arena, 0.0))
