"""Execution-order policies on hand-made step graphs whose best orders are known by hand."""

from __future__ import annotations

import pytest

from onnxplan.errors import UsageError
from onnxplan.ir.graph import StepGraph
from onnxplan.offsets.buffers import ALIGNMENT
from onnxplan.orders import ORDERS, check_order, live_bytes_of_order, memory_model, order_nodes, peak_of_order
from onnxplan.orders.ilp import pin_updates, solve_order, update_pins
from onnxplan.orders.nntrainer import Stage, assign_layers
from tests.graphs import all_orders, make_graph

FAST = 2.0  # ilp time limit in tests (seconds)


def diamond() -> StepGraph:
    """a -> (b1 -> c1), (b2 -> c2) -> d; the b's make 100 units, the c's 1 unit (a unit: the
    64-byte ALIGNMENT, so that the bytes the orders count, aligned, keep these ratios).

    File order runs both b's first: 10 + 100 + 100 = 210 units at b2. Finishing one branch
    before the other peaks at x + y1 + z1 = 111 units (at c1, and again at b2).
    """
    nodes = [("a", ["in"], ["x"]), ("b1", ["x"], ["y1"]), ("b2", ["x"], ["y2"]),
             ("c1", ["y1"], ["z1"]), ("c2", ["y2"], ["z2"]), ("d", ["z1", "z2"], ["out"])]
    sizes = {"in": 0, "x": 10, "y1": 100, "y2": 100, "z1": 1, "z2": 1, "out": 1}
    return make_graph(nodes, {v: b * ALIGNMENT for v, b in sizes.items()}, inputs=["in"], outputs=["out"])


def three_linear(*, frozen_middle=False, split=True, cd_first=True) -> StepGraph:
    """NNTrainer Figure 5/6: three linear layers, a loss, ORT-named gradients, SGD updates.

    Activations 40 bytes, derivatives 40 bytes, weight gradients 400 bytes. The file keeps
    ONNX Runtime's layout: the backward pass, then every update at the end (`split`: one
    onnxplan.SGDUpdate per parameter; else one SGDOptimizerV2 node).
    """
    ws = ["W1", "W2", "W3"]
    trainable = [w for w in ws if not (frozen_middle and w == "W2")]
    nodes = [("fc1", ["x", "W1"], ["a1"]), ("fc2", ["a1", "W2"], ["a2"]),
             ("fc3", ["a2", "W3"], ["a3"]), ("loss", ["a3", "t"], ["L", "aux"]),
             ("loss_Grad/LossGrad_0", ["aux", "t"], ["d3"], "backward")]
    for i, (act_in, d_out) in ((3, ("a2", "d2")), (2, ("a1", "d1")), (1, ("x", None))):
        cg = (f"fc{i}_Grad/Gemm_1", [act_in, f"d{i}"], [f"W{i}_grad"], "backward")
        cd = (f"fc{i}_Grad/Gemm_0", [f"d{i}", f"W{i}"], [d_out], "backward") if d_out else None
        steps = [s for s in ((cd, cg) if cd_first else (cg, cd)) if s is not None]
        if f"W{i}" not in trainable:
            steps = [cd] if cd else []
        nodes.extend(steps)
    if split:
        nodes += [(f"upd_{w}", ["lr", w, f"{w}_grad"], [f"{w}.updated"], "optimizer", "SGDUpdate", "onnxplan")
                  for w in reversed(trainable)]
    else:
        nodes.append(("opt", ["lr", *trainable, *[f"{w}_grad" for w in trainable]],
                      ["flag", *[f"{w}.updated" for w in trainable]], "optimizer",
                      "SGDOptimizerV2", "com.microsoft"))
    sizes = {"x": 40, "t": 40, "lr": 4, "a1": 40, "a2": 40, "a3": 40, "L": 4, "aux": 40,
             "d3": 40, "d2": 40, "d1": 40, "flag": 1, **{f"{w}_grad": 400 for w in ws}}
    return make_graph(nodes, sizes, inputs=["x", "t", "lr"], params=trainable,
                      frozen=[w for w in ws if w not in trainable],
                      outputs=["L"], grads=[f"{w}_grad" for w in ws])


# ---- the memory model ------------------------------------------------------------------

def test_memory_model_excludes_persistent_and_keeps_inputs_and_outputs_live():
    g = three_linear()
    mm = memory_model(g)
    assert "W1" not in mm.size and "W1.updated" not in mm.size
    assert mm.inputs == {"x", "t", "lr"} and mm.outputs == {"L"}
    live = live_bytes_of_order(mm, mm.nodes)
    assert live[0] == 4 * ALIGNMENT  # x, t, lr fed before EO 0, a1 created at EO 0 (40, 40, 4, 40 B, aligned)
    order = mm.nodes
    assert all(live[i] >= 4 for i in range(order.index("loss"), len(order)))  # the loss stays


def test_memory_model_adds_update_after_parameter_readers():
    mm = memory_model(three_linear(cd_first=False))
    # the update of W3 overwrites W3: the derivative Gemm that reads W3 must run first
    assert "fc3_Grad/Gemm_0" in mm.preds["upd_W3"] and "fc3" in mm.preds["upd_W3"]


def test_memory_model_merged_buffers_and_views():
    nodes = [("a", ["in"], ["x"]), ("r", ["x"], ["x2"], "forward", "Reshape", ""),
             ("u", ["x"], ["y"]), ("relu", ["x2"], ["z"]), ("d", ["y", "z"], ["out"])]
    g = make_graph(nodes, {"in": 1, "x": 8, "x2": 8, "y": 8, "z": 8, "out": 8},
                   inputs=["in"], outputs=["out"])
    g.node("r").aliases["x2"] = ("x", "rv")
    g.node("relu").aliases["z"] = ("x2", "mv")
    mm = memory_model(g, {"x2": "x", "z": "x"})
    assert mm.creates["a"] == ("x",) and mm.creates["relu"] == () and "x" in mm.reads["relu"]
    assert "u" not in mm.preds["r"]  # a read-only view needs no write-after-read edge
    assert "u" in mm.preds["relu"]  # the in-place relu clobbers x: its reader u goes first
    assert mm.size["x"] == ALIGNMENT  # 8 B, aligned as the plan places it


def test_memory_model_refuses_unknown_control_dependency():
    g = diamond()
    g.node("d").after = ["ghost"]
    with pytest.raises(Exception, match="ghost"):
        memory_model(g)


# ---- policies ---------------------------------------------------------------------------

@pytest.mark.parametrize("policy", list(ORDERS))
@pytest.mark.parametrize("build", [diamond, three_linear, lambda: three_linear(split=False),
                                   lambda: three_linear(frozen_middle=True)])
def test_every_policy_orders_every_node(policy, build):
    g = build()
    res = order_nodes(g, policy, time_limit=FAST)
    mm = memory_model(g)
    check_order(mm, res.order)
    assert res.policy == policy and res.peak_bytes == peak_of_order(mm, res.order)


def test_unknown_policy_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown execution order"):
        order_nodes(diamond(), "random")


def test_diamond_finishes_one_branch_first():
    g = diamond()
    assert order_nodes(g, "given").peak_bytes == 210 * ALIGNMENT
    assert order_nodes(g, "greedy").peak_bytes == 111 * ALIGNMENT
    res = order_nodes(g, "ilp", time_limit=FAST)
    assert res.peak_bytes == 111 * ALIGNMENT and res.optimal and res.gap == 0.0


def test_nntrainer_three_linear_layers_order():
    res = order_nodes(three_linear(), "nntrainer")
    assert res.order == (
        "fc1", "fc2", "fc3", "loss", "loss_Grad/LossGrad_0",
        "fc3_Grad/Gemm_1", "fc3_Grad/Gemm_0", "upd_W3",  # CG, CD, AG of fc3
        "fc2_Grad/Gemm_1", "fc2_Grad/Gemm_0", "upd_W2",
        "fc1_Grad/Gemm_1", "upd_W1",
    )
    # one weight gradient alive at a time instead of all three until the end
    assert res.peak_bytes < order_nodes(three_linear(), "given").peak_bytes


def test_nntrainer_stages():
    layers = assign_layers(three_linear())
    assert layers["fc3"] == (2, Stage.F)
    assert layers["fc3_Grad/Gemm_1"] == (2, Stage.CG)
    assert layers["fc3_Grad/Gemm_0"] == (2, Stage.CD)
    assert layers["upd_W3"] == (2, Stage.AG)
    assert layers["loss_Grad/LossGrad_0"] == (3, Stage.CD)


def test_nntrainer_frozen_layer_has_no_gradient_work():
    res = order_nodes(three_linear(frozen_middle=True), "nntrainer")
    assert res.order[res.order.index("fc2_Grad/Gemm_0"):] == (
        "fc2_Grad/Gemm_0", "fc1_Grad/Gemm_1", "upd_W1")
    assert "upd_W2" not in res.order


def test_nntrainer_unsplit_optimizer_goes_last():
    res = order_nodes(three_linear(split=False), "nntrainer")
    assert res.order[-1] == "opt"
    assert res.order[5:7] == ("fc3_Grad/Gemm_1", "fc3_Grad/Gemm_0")


def test_nntrainer_maps_unnamed_backward_nodes_by_data():
    nodes = [("fc1", ["x", "W1"], ["a1"]), ("fc2", ["a1", "W2"], ["L"]),
             ("g2", ["L"], ["d2"], "backward"),  # no _Grad name: reads fc2's output
             ("gw2", ["a1", "d2"], ["W2_grad"], "backward"),
             ("gd2", ["d2", "W2"], ["d1"], "backward"),
             ("gw1", ["x", "d1"], ["W1_grad"], "backward"),
             ("acc1", ["W1_grad"], ["W1_acc"], "backward")]
    g = make_graph(nodes, {"x": 4, "a1": 4, "L": 4, "d2": 4, "d1": 4, "W1_grad": 4, "W2_grad": 4,
                           "W1_acc": 4}, inputs=["x"], params=["W1", "W2"], outputs=["L"],
                   grads=["W1_grad", "W2_grad", "W1_acc"])
    layers = assign_layers(g)
    assert layers["gw2"][0] == 1 and layers["acc1"] == (0, Stage.CG) and layers["gw1"] == (0, Stage.CG)


def test_nntrainer_fixes_up_a_misleading_name():
    # "fc1_Grad/..." names layer fc1 but needs fc2's derivative: the order stays valid
    nodes = [("fc1", ["x"], ["a1"]), ("fc2", ["a1"], ["L"]),
             ("fc1_Grad/Odd_0", ["L"], ["d2"], "backward"),
             ("fc2_Grad/G_0", ["d2"], ["d1"], "backward")]
    g = make_graph(nodes, {"x": 4, "a1": 4, "L": 4, "d2": 4, "d1": 4}, inputs=["x"], outputs=["L"])
    res = order_nodes(g, "nntrainer")
    assert res.order.index("fc1_Grad/Odd_0") < res.order.index("fc2_Grad/G_0")


def test_greedy_runs_updates_early():
    res = order_nodes(three_linear(), "greedy")
    assert res.order.index("upd_W3") < res.order.index("fc2_Grad/Gemm_1")


def test_ilp_is_optimal_on_three_linear_and_pins_updates():
    g = three_linear()
    mm = memory_model(g)
    pins = update_pins(g, mm)
    assert set(pins) == {"upd_W1", "upd_W2", "upd_W3"}
    pinned = pin_updates(mm, mm.nodes, pins)
    check_order(mm, pinned)
    assert pinned.index("upd_W3") == pinned.index("fc3_Grad/Gemm_1") + 1  # right after its last pred
    res = order_nodes(g, "ilp", time_limit=FAST)
    assert res.optimal and res.gap == 0.0
    assert res.peak_bytes <= min(order_nodes(g, p).peak_bytes for p in ("given", "nntrainer", "greedy"))


def test_ilp_matches_brute_force_on_a_small_backward_graph():
    g = three_linear(split=True)
    mm = memory_model(g)
    order, optimal, bound, _ = solve_order(mm, mm.nodes, time_limit=FAST)
    assert optimal and bound == peak_of_order(mm, order)
    assert peak_of_order(mm, order) == min(peak_of_order(mm, o) for o in all_orders(mm))


def test_ilp_falls_back_to_the_seed_when_too_large(monkeypatch):
    from onnxplan.orders import ilp

    monkeypatch.setattr(ilp, "VARS_PER_SECOND", 0)
    g = diamond()
    res = order_nodes(g, "ilp", time_limit=FAST)
    assert res.optimal is False and res.gap is None and "too large" in res.notes[0]
    assert res.peak_bytes == 111 * ALIGNMENT  # the best heuristic (greedy) is the seed


def test_ilp_with_inputs_only_read_late_and_reader_created_buffers():
    # "acc" has no producer and is not a step input: its first reader creates it
    nodes = [("a", ["x"], ["y"]), ("b", ["y"], ["z"]), ("c", ["acc", "z"], ["w"]),
             ("d", ["acc", "in2"], ["v"]), ("e", ["w", "v"], ["out"])]
    g = make_graph(nodes, {"x": 5, "in2": 7, "y": 3, "z": 3, "acc": 50, "w": 2, "v": 2, "out": 1},
                   inputs=["x", "in2"], outputs=["out"])
    mm = memory_model(g)
    res = order_nodes(g, "ilp", time_limit=FAST)
    assert res.optimal and res.peak_bytes == peak_of_order(mm, res.order)
    brute = min(peak_of_order(mm, o) for o in all_orders(mm))
    assert res.peak_bytes == brute


# ---- a real zoo model ------------------------------------------------------------------

@pytest.fixture(scope="module")
def mlp_steps():
    """The zoo `mlp` (batch 8) as loaded, and after realize / interleave / in-place."""
    from onnxplan.ir.analysis import alias_roots
    from onnxplan.loading import load_step
    from onnxplan.loading.request import LoadRequest
    from onnxplan.pipeline import run_pipeline

    raw = load_step(LoadRequest("mlp", batch=8))
    rewritten, _ = run_pipeline(raw, ["realize", "interleave", "inplace"])
    return {"raw": (raw, None), "rewritten": (rewritten, alias_roots(rewritten))}


@pytest.mark.parametrize("which", ["raw", "rewritten"])
def test_zoo_mlp_every_policy(mlp_steps, which):
    g, buffer_of = mlp_steps[which]
    mm = memory_model(g, buffer_of)
    peaks = {}
    for policy in ORDERS:
        res = order_nodes(g, policy, buffer_of=buffer_of, time_limit=FAST)
        check_order(mm, res.order)
        peaks[policy] = res.peak_bytes
    assert peaks["ilp"] <= min(peaks["given"], peaks["nntrainer"], peaks["greedy"])
    if which == "rewritten":  # per-parameter updates: gradients die early
        assert peaks["nntrainer"] < peaks["given"]


def test_zoo_mlp_orders_keep_the_in_place_merges_legal(mlp_steps):
    from onnxplan.passes.lifetimes import lifetimes

    g, buffer_of = mlp_steps["rewritten"]
    for policy in ORDERS:
        order = order_nodes(g, policy, buffer_of=buffer_of, time_limit=FAST).order
        lifetimes(g, order)  # raises IntegrityError when an order breaks a merge


def test_zoo_mlp_nntrainer_layers(mlp_steps):
    g, _ = mlp_steps["raw"]
    layers = assign_layers(g)
    fwd = [n.name for n in g.nodes if n.phase == "forward"]
    assert layers["fc3_Grad/Gemm_1"] == (fwd.index("fc3"), Stage.CG)
    assert layers["fc3_Grad/Gemm_0"] == (fwd.index("fc3"), Stage.CD)
    opt = next(n.name for n in g.nodes if n.phase == "optimizer")
    assert layers[opt][1] == Stage.LAST
