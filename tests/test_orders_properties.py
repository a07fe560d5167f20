"""Property tests of the execution-order policies over random step graphs."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnxplan.orders import ORDERS, check_order, live_bytes_of_order, memory_model, order_nodes, peak_of_order
from onnxplan.orders.greedy import greedy_order
from onnxplan.orders.ilp import solve_order
from tests.graphs import all_orders, make_graph

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def step_graphs(draw, max_nodes: int = 8):
    """A random DAG laid out as a step: forward nodes, backward nodes (some named
    `<fwd>_Grad/...`, some not, some misleadingly), per-parameter updates at the end."""
    n_fwd = draw(st.integers(1, max(1, max_nodes // 2)))
    n_bwd = draw(st.integers(0, max_nodes - n_fwd))
    n_upd = draw(st.integers(0, 2))
    sizes = st.integers(0, 100)
    nodes, size, made = [], {"x": draw(sizes), "acc": draw(sizes)}, ["x"]
    params = [f"W{i}" for i in range(n_upd)]
    fwd_names = []
    for i in range(n_fwd + n_bwd):
        backward = i >= n_fwd
        pool = made if not backward else made + ["acc"]
        ins = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True))
        if params and draw(st.booleans()):
            ins.append(draw(st.sampled_from(params)))
        outs = [f"v{i}"] + ([f"u{i}"] if draw(st.booleans()) else [])
        for o in outs:
            size[o] = draw(sizes)
        if backward and draw(st.booleans()):
            name = f"{draw(st.sampled_from(fwd_names))}_Grad/Op_{i}"
        else:
            name = f"n{i}"
        if not backward:
            fwd_names.append(name)
        nodes.append((name, ins, outs, "backward" if backward else "forward"))
        made.extend(outs)
    for j, w in enumerate(params):
        grad = draw(st.sampled_from(made[1:]))
        nodes.append((f"upd{j}", ["x", w, grad], [f"{w}.updated"], "optimizer", "SGDUpdate", "onnxplan"))
    loss = draw(st.sampled_from(made[1:]))
    return make_graph(nodes, size, inputs=["x"], params=params, outputs=[loss])


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
