"""Property tests of the execution-order policies over random step graphs."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from onnxplan.orders import ORDERS, check_order, live_bytes_of_order, memory_model, order_nodes, peak_of_order
from onnxplan.orders.greedy import greedy_order
from onnxplan.orders.ilp import solve_order
from tests.graphs import all_orders, step_graphs

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=40, **SETTINGS)
@given(step_graphs())
def test_every_policy_returns_a_valid_order(g):
    mm = memory_model(g)
    check_order(mm, mm.nodes)
    peaks = {}
    for policy in ORDERS:
        res = order_nodes(g, policy, time_limit=2.0)
        check_order(mm, res.order)
        assert res.peak_bytes == peak_of_order(mm, res.order) == max(live_bytes_of_order(mm, res.order))
        peaks[policy] = res.peak_bytes
    assert peaks["ilp"] <= min(peaks["given"], peaks["nntrainer"], peaks["greedy"])


@settings(max_examples=25, **SETTINGS)
@given(step_graphs(max_nodes=6))
def test_ilp_reaches_the_brute_force_optimum(g):
    mm = memory_model(g)
    order, optimal, bound, _ = solve_order(mm, greedy_order(mm), time_limit=2.0)
    check_order(mm, order)
    best = min(peak_of_order(mm, o) for o in all_orders(mm))
    assert bound <= best <= peak_of_order(mm, order)
    if optimal:
        assert peak_of_order(mm, order) == best


@settings(max_examples=30, **SETTINGS)
@given(step_graphs(max_nodes=60))
def test_greedy_and_nntrainer_handle_larger_graphs(g):
    mm = memory_model(g)
    for policy in ("greedy", "nntrainer"):
        check_order(mm, order_nodes(g, policy).order)
