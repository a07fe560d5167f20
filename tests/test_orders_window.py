"""The windowed order ILP (orders/window.py): exact sub-models, never worse, reaches known optima."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnxplan.offsets.buffers import ALIGNMENT
from onnxplan.orders import check_order, live_bytes_of_order, memory_model, order_nodes, peak_of_order
from onnxplan.orders.ilp import solve_order
from onnxplan.orders.window import improve_by_windows, sub_model
from tests.graphs import all_orders, make_graph, step_graphs

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _window_orders(sub, limit=200):
    """Every valid order of a sub-model's nodes (at most `limit`), by brute force."""
    out = []
    for perm in itertools.permutations(sub.nodes):
        pos = {n: i for i, n in enumerate(perm)}
        if all(pos[p] < pos[n] for n in perm for p in sub.preds[n]):
            out.append(perm)
            if len(out) >= limit:
                break
    return out


@settings(max_examples=40, **SETTINGS)
@given(step_graphs(max_nodes=9), st.data())
def test_sub_model_profile_is_the_global_profile_inside_the_window(g, data):
    mm = memory_model(g)
    order = mm.nodes
    n = len(order)
    start = data.draw(st.integers(0, n - 1))
    stop = data.draw(st.integers(start + 1, min(n, start + 6)))
    sub, across = sub_model(mm, order, start, stop)
    before = live_bytes_of_order(mm, order)
    for perm in _window_orders(sub):
        full = (*order[:start], *perm, *order[stop:])
        check_order(mm, full)
        live = live_bytes_of_order(mm, full)
        assert live[:start] == before[:start] and live[stop:] == before[stop:]
        assert live[start:stop] == [x + across for x in live_bytes_of_order(sub, perm)]


def _diamond_chain(k: int):
    """k diamonds in a row (each a -> b1,b2 -> c1,c2 -> d, as test_orders.diamond), file order
    running both b's first: 10 + 100 + 100 = 210 units in each; one branch at a time: 111 units
    (a unit: the 64-byte ALIGNMENT, as the orders count bytes aligned)."""
    nodes, sizes, prev = [], {"in": 10}, "in"
    for i in range(k):
        x, y1, y2, z1, z2, out = (f"{v}{i}" for v in ("x", "y1_", "y2_", "z1_", "z2_", "out"))
        nodes += [(f"a{i}", [prev], [x]), (f"b1_{i}", [x], [y1]), (f"b2_{i}", [x], [y2]),
                  (f"c1_{i}", [y1], [z1]), (f"c2_{i}", [y2], [z2]), (f"d{i}", [z1, z2], [out])]
        sizes.update({x: 10, y1: 100, y2: 100, z1: 1, z2: 1, out: 10})
        prev = out
    return make_graph(nodes, {v: b * ALIGNMENT for v, b in sizes.items()}, inputs=["in"], outputs=[prev])


def test_windows_reach_the_optimum_of_a_graph_too_large_to_solve_whole(monkeypatch):
    from onnxplan.orders import ilp

    g = _diamond_chain(30)  # 180 nodes
    mm = memory_model(g)
    assert peak_of_order(mm, mm.nodes) == 210 * ALIGNMENT
    whole = solve_order(mm, mm.nodes, time_limit=5.0)
    assert whole[1] and peak_of_order(mm, whole[0]) == 111 * ALIGNMENT  # the optimum, solved whole
    monkeypatch.setattr(ilp, "VARS_PER_SECOND", 50)  # the whole model no longer fits
    res = improve_by_windows(mm, mm.nodes, time_limit=20.0, solve=solve_order, width=24)
    check_order(mm, res.order)
    assert res.peak_bytes == peak_of_order(mm, res.order) == 111 * ALIGNMENT
    assert res.improved >= 15 and res.local_optimum and "windowed" in res.note  # a window holds <= 4 diamonds
    policy = order_nodes(g, "ilp", time_limit=10.0)  # too large whole: the ilp policy decomposes
    assert policy.peak_bytes <= 111 * ALIGNMENT and any("windowed" in note for note in policy.notes)


@settings(max_examples=25, **SETTINGS)
@given(step_graphs(max_nodes=7), st.integers(2, 7))
def test_windows_never_worse_and_whole_window_is_optimal(g, width):
    mm = memory_model(g)
    seed = mm.nodes
    res = improve_by_windows(mm, seed, time_limit=5.0, solve=solve_order, width=width)
    check_order(mm, res.order)
    assert res.peak_bytes == peak_of_order(mm, res.order) <= peak_of_order(mm, seed)
    if width >= len(mm.nodes) and res.local_optimum:  # one window is the whole graph
        assert res.peak_bytes == min(peak_of_order(mm, o) for o in all_orders(mm))
