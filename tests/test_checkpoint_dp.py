"""rotor's dynamic program against brute-force enumeration of schedules on random small chains."""

from __future__ import annotations

import heapq
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnxplan.checkpoint.rotor import rotor_schedule, rotor_table
from onnxplan.checkpoint.schedule import (
    BWD,
    FALL,
    FCK,
    FNONE,
    ChainCosts,
    ScheduleError,
    decode,
    encode,
    segments_schedule,
    simulate,
    store_all,
)


def brute_force(c: ChainCosts, limit: int, persistent: bool = True) -> float:
    """Least time over every op sequence whose memory stays within `limit` (Dijkstra over the
    memory states of `simulate`'s model). `persistent`: a standalone a^k may only be consumed
    by F_none right after the op that made it (a kept checkpoint lives until its backward)."""
    L = c.length
    start = (frozenset({("a", 0), ("d", L)}), None, frozenset())
    best = {start: 0.0}
    heap = [(0.0, 0, start)]
    tie = 0
    while heap:
        t, _, state = heapq.heappop(heap)
        if t > best.get(state, math.inf):
            continue
        held, fresh, ran = state
        if held == {("d", 0)}:
            return t
        for s in range(1, L + 1):
            for kind in (FCK, FNONE, FALL, BWD):
                nxt = _step(c, held, fresh, ran, kind, s, limit, persistent)
                if nxt is None:
                    continue
                tt = t + (c.ub[s] if kind == BWD else c.uf[s])
                if tt < best.get(nxt, math.inf):
                    best[nxt] = tt
                    tie += 1
                    heapq.heappush(heap, (tt, tie, nxt))
    return math.inf


def _step(c, held, fresh, ran, kind, s, limit, persistent):
    size = {("a", k): c.wa[k] for k in range(c.length + 1)}
    size.update({("abar", k): c.wabar[k] for k in range(1, c.length + 1)})
    size.update({("d", k): c.wdelta[k] for k in range(c.length + 1)})
    cur = sum(size[x] for x in held)
    has_input = ("a", s - 1) in held or ("abar", s - 1) in held
    if kind == BWD:
        if ("d", s) not in held or ("abar", s) not in held or not has_input:
            return None
        if cur + c.wdelta[s - 1] + c.ob[s] > limit:
            return None
        new = set(held) - {("d", s), ("abar", s), ("a", s - 1)}
        new.add(("d", s - 1))
        return frozenset(new), None, ran
    out = ("abar", s) if kind == FALL else ("a", s)
    if not has_input or out in held:
        return None
    if s in ran and not c.can_recompute(s):
        return None
    if cur + size[out] + (c.of_all(s) if kind == FALL else c.of[s]) > limit:
        return None
    new = set(held)
    if kind == FNONE and ("abar", s - 1) not in held:
        if persistent and fresh != ("a", s - 1):
            return None  # would drop a kept checkpoint before its backward
        new.discard(("a", s - 1))
    new.add(out)
    return frozenset(new), (out if out[0] == "a" else None), ran | {s}


@st.composite
def chains(draw, max_len=5):
    L = draw(st.integers(1, max_len))
    small = st.integers(0, 4)
    wa = [draw(st.integers(0, 2))] + [draw(st.integers(1, 5)) for _ in range(L)]
    wabar = [wa[s] + draw(small) for s in range(1, L + 1)]
    wdelta = [draw(st.integers(0, 1))] + [wa[s] if draw(st.booleans()) else draw(st.integers(1, 5))
                                          for s in range(1, L)] + [draw(st.integers(0, 1))]
    uf = [draw(st.integers(0, 6)) for _ in range(L)]
    ub = [draw(st.integers(0, 6)) for _ in range(L)]
    of = [draw(st.integers(-wa[s], 4)) for s in range(1, L + 1)]  # values may die inside an op
    ofall = [draw(st.integers(-wabar[s - 1], 4)) for s in range(1, L + 1)]
    ob = [draw(st.integers(-wabar[s - 1], 4)) for s in range(1, L + 1)]
    rec = [draw(st.integers(0, 5)) > 0 for _ in range(L)]
    return ChainCosts.make(uf, ub, wa, wabar, wdelta, of, ob, rec, ofall)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains(), st.floats(0.2, 1.0))
def test_dp_equals_brute_force_over_persistent_schedules(c, frac):
    peak_all = simulate(c, store_all(c.length)).peak
    limit = round(frac * peak_all)
    tab = rotor_table(c, limit, slots=max(limit, 1))  # one byte per slot: the program is exact
    m = tab.slots_for(limit)
    dp = tab.best_time(m)
    assert dp == brute_force(c, limit, persistent=True)
    sched = rotor_schedule(tab, m)
    if math.isinf(dp):
        assert sched is None
        return
    sim = simulate(c, sched.ops)
    assert sim.time == dp and sim.peak <= limit
    assert brute_force(c, limit, persistent=False) <= dp  # non-persistent schedules may beat it


@settings(max_examples=100, deadline=None)
@given(chains(max_len=7))
def test_dp_with_room_for_everything_recomputes_nothing(c):
    peak_all = simulate(c, store_all(c.length)).peak
    tab = rotor_table(c, peak_all, slots=max(peak_all, 1))
    sched = rotor_schedule(tab, tab.slots_for(peak_all))
    assert sched is not None
    assert simulate(c, sched.ops).time == sum(c.uf) + sum(c.ub)


@settings(max_examples=100, deadline=None)
@given(chains(max_len=8), st.integers(10, 200))
def test_discretised_dp_is_feasible_in_bytes(c, slots):
    peak_all = simulate(c, store_all(c.length)).peak
    tab = rotor_table(c, peak_all, slots=slots)
    for m in range(0, tab.slots + 1, max(1, tab.slots // 7)):
        sched = rotor_schedule(tab, m)
        if sched is not None:  # sizes rounded up: the real peak is within the limit
            sim = simulate(c, sched.ops)
            assert sim.peak <= (m + math.ceil(c.wa[0] / tab.slot_bytes - 1e-9)) * tab.slot_bytes + 1e-6
            assert math.isclose(sim.time, tab.best_time(m))


def test_non_recomputable_stage_runs_once():
    c = ChainCosts.make([1] * 6, [1] * 6, [0, 4, 4, 4, 4, 4, 4], [9] * 6, [0, 4, 4, 4, 4, 4, 1],
                        [0] * 6, [0] * 6, [True, True, False, True, True, True])
    tab = rotor_table(c, 40, slots=40)
    for m in range(41):
        sched = rotor_schedule(tab, tab.slots_for(m)) if tab.slots_for(m) >= 0 else None
        if sched is not None:
            assert sched.executions(6)[3] == 1


def test_segments_and_store_all_are_valid_and_codes_round_trip():
    c = ChainCosts.make([2] * 9, [3] * 9, [1] * 10, [4] * 9, [1] * 10, [1] * 9, [1] * 9)
    for ops in (store_all(9), segments_schedule(9, [3, 6]), segments_schedule(9, [2, 5], keep={4})):
        simulate(c, ops)
        assert decode(encode(ops, 9)) == (9, tuple(ops))
    sqrt = simulate(c, segments_schedule(9, [3, 6]))
    everything = simulate(c, store_all(9))
    assert sqrt.peak < everything.peak and sqrt.time == everything.time + 2 * 6  # 2 segments re-run


def test_simulator_rejects_invalid_sequences():
    c = ChainCosts.make([1, 1], [1, 1], [0, 1, 1], [2, 2], [0, 1, 1], [0, 0], [0, 0])
    for ops in ([(BWD, 2)], [(FNONE, 2)], [(FALL, 1), (FALL, 2), (BWD, 2)], [(FCK, 1), (FNONE, 2), (BWD, 2)]):
        try:
            simulate(c, ops)
        except ScheduleError:
            continue
        raise AssertionError(f"accepted {ops}")
