"""Each pass: rewrites what needs it, reports no change on a second run."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan.errors import UsageError
from onnxplan.ir import ValueClass
from onnxplan.passes import Pass, PassError
from onnxplan.passes.inplace import inplace
from onnxplan.passes.interleave import interleave
from onnxplan.passes.lifetimes import IntegrityError, lifetimes
from onnxplan.passes.realize import realize
from onnxplan.pipeline import PASSES, run_pipeline
from tests.graphs import GraphBuilder, three_linear_step


def _shape_chain_graph():
    b = GraphBuilder()
    b.value("x", (2, 3, 4), ValueClass.INPUT)
    b.node("Shape", ["x"], ["s"], [(3,)], vclass=ValueClass.TEMPORARY)
    b.g.values["s"].spec = b.g.values["s"].spec.with_dtype("int64")
    b.const("idx", np.array(0, dtype=np.int64))
    b.node("Gather", ["s", "idx"], ["s0"], [()])
    b.g.folded.update({"s": np.array([2, 3, 4]), "s0": np.array(2)})
    b.const("m1", np.array([-1], dtype=np.int64))
    b.node("Unsqueeze", ["s0", "m1"], ["s0u"], [(1,)])
    b.g.folded["s0u"] = np.array([2])
    b.const("rest", np.array([12], dtype=np.int64))
    b.node("Concat", ["s0u", "rest"], ["shape"], [(2,)], axis=0)
    b.g.folded["shape"] = np.array([2, 12])
    b.node("Reshape", ["x", "shape"], ["flat"], [(2, 12)])
    b.node("Identity", ["flat"], ["flat2"])
    b.node("Relu", ["flat2"], ["out"])
    b.g.outputs.append("out")
    return b.g


def test_realize_folds_shape_chain_drops_identity_marks_views():
    g = _shape_chain_graph()
    res = realize(g)
    assert res.modified
    ops = [n.op_type for n in res.graph.nodes]
    assert ops == ["Reshape", "Relu"]
    reshape, relu = res.graph.nodes
    assert reshape.aliases == {"flat": ("x", "rv")}
    assert relu.inputs == ["flat"]  # reads the Identity's input
    assert res.graph.values["shape"].vclass == ValueClass.CONSTANT
    np.testing.assert_array_equal(res.graph.initializers["shape"], [2, 12])
    assert "s" not in res.graph.values and "idx" not in res.graph.values
    assert [n.op_type for n in g.nodes][0] == "Shape"  # input graph untouched
    again = realize(res.graph)
    assert not again.modified and again.notes == []


def test_inplace_aliases_dying_inputs_only():
    g = realize(three_linear_step()).graph
    res = inplace(g)
    assert res.modified
    aliases = {o: src for n in res.graph.nodes for o, (src, k) in n.aliases.items() if k == "mv"}
    # Relu outputs are read by the backward pass -> their inputs a0/a1 die at the Relu
    assert aliases["r0"] == "a0" and aliases["r1"] == "a1"
    # ReluGrad: the incoming derivative dies there
    assert aliases["da1"] == "dr1" and aliases["da0"] == "dr0"
    # parameters are updated in place by the optimizer, never clobbered by anything else
    assert aliases["W0.updated"] == "W0"
    for o, src in aliases.items():
        if src.startswith("W"):
            assert o == src + ".updated"
    assert not inplace(res.graph).modified


def test_inplace_refuses_value_read_later():
    b = GraphBuilder()
    b.value("x", (4,), ValueClass.INPUT)
    b.node("Relu", ["x"], ["y"])
    b.node("Sigmoid", ["x"], ["z"])  # x is read after the Relu, in no fixed order
    b.node("Add", ["y", "z"], ["out"])
    b.g.outputs.append("out")
    res = inplace(b.g)
    aliased = {o: s for n in res.graph.nodes for o, (s, _k) in n.aliases.items()}
    assert "y" not in aliased and "z" not in aliased  # x has two readers, neither ancestor
    assert aliased.get("out") in ("y", "z")


def test_interleave_splits_optimizer_per_parameter():
    for opt, op in (("SGD", "SGDUpdate"), ("AdamW", "AdamWUpdate")):
        g = three_linear_step(opt)
        res = interleave(g)
        assert res.modified
        ups = [n for n in res.graph.nodes if n.op_type == op]
        assert len(ups) == 3 and all(n.domain == "onnxplan" for n in ups)
        w2 = next(n for n in ups if "W2" in n.inputs)
        assert "dW2" in w2.inputs and w2.outputs[0] == "W2.updated"
        if opt == "AdamW":
            assert w2.inputs == ["lr", "step", "W2", "dW2", "W2.m", "W2.v"]
            assert w2.outputs == ["W2.updated", "W2.m.updated", "W2.v.updated"]
        assert not interleave(res.graph).modified


def test_interleave_then_inplace_adds_control_edges_before_updates():
    g, _ = run_pipeline(three_linear_step(), ["realize", "interleave", "inplace"])
    up = next(n for n in g.nodes if n.op_type == "SGDUpdate" and "W2" in n.inputs)
    # W2 is read by the dr1 Gemm, which does not feed dW2: it must run before the update
    dr1 = next(n for n in g.nodes if n.outputs == ["dr1"])
    assert dr1.name in up.after
    assert up.aliases["W2.updated"] == ("W2", "mv")


def test_lifetimes_and_integrity_rule():
    g, _ = run_pipeline(three_linear_step(), ["realize", "interleave", "inplace"])
    order = [n.name for n in g.nodes]
    lt = lifetimes(g, order)
    names = {b.name for b in lt.buffers}
    assert "a0" in names and "r0" not in names  # r0 lives in a0's buffer
    a0 = next(b for b in lt.buffers if b.name == "a0")
    assert "r0" in a0.aliases
    assert lt.persistent_bytes == sum(g.values[w].nbytes for w in ("W0", "W1", "W2"))
    x = next(b for b in lt.buffers if b.name == "x")
    assert x.first == 0


def test_integrity_rule_rejects_order_reading_an_overwritten_value():
    b = GraphBuilder()
    b.value("x", (4,), ValueClass.INPUT)
    relu = b.node("Relu", ["x"], ["y"])
    b.node("Sigmoid", ["x"], ["z"])
    b.node("Add", ["y", "z"], ["out"])
    b.g.outputs.append("out")
    relu.aliases["y"] = ("x", "mv")  # legal only if the Sigmoid runs first
    lt = lifetimes(b.g, ["Sigmoid_1", "Relu_0", "Add_2"])
    assert {buf.name for buf in lt.buffers} == {"x", "z", "out"}
    with pytest.raises(IntegrityError, match="'x' is read at EO 1"):
        lifetimes(b.g, ["Relu_0", "Sigmoid_1", "Add_2"])


def test_pipeline_failure_names_passes_run_before():
    def _explode(graph):
        raise RuntimeError("boom")

    table = PASSES.with_passes(Pass("explode-for-test", _explode))
    with pytest.raises(PassError, match="passes run before it: realize, interleave"):
        run_pipeline(three_linear_step(), ["realize", "interleave", "explode-for-test"], table)


@pytest.mark.parametrize("names", [["inplace"], ["interleave", "realize"], ["recompute:dag.given.3.1:0", "realize"]])
def test_a_pipeline_whose_requirement_is_not_met_is_refused_in_one_line(names):
    """Every pass but realize needs a realized graph: a pipeline that runs one before realize is
    refused before any pass runs (UsageError, one line naming the pass and the requirement)."""
    with pytest.raises(UsageError) as err:
        run_pipeline(three_linear_step(), names)
    msg = str(err.value)
    assert "\n" not in msg and f"pass {names[0]!r} requires 'realized'" in msg


def test_a_graph_remembers_what_its_passes_ensured():
    """A pipeline may start where another stopped: the graph records what its passes ensured."""
    pre, _ = run_pipeline(three_linear_step(), ["realize", "interleave"])
    assert pre.ensured == ("realized", "interleaved")
    post, _ = run_pipeline(pre, ["inplace"])
    assert post.ensured == ("realized", "interleaved", "inplace") and pre.ensured == ("realized", "interleaved")
    assert pre.copy().ensured == pre.ensured


def test_the_pass_list_is_explicit():
    """Every pass a plan can name is listed in onnxplan.pipeline, nothing registers on import."""
    assert set(PASSES.passes) == {"realize", "interleave", "split-grad", "inplace", "inplace-state"}
    assert set(PASSES.families) == {"recompute", "split"}


def test_nntrainer_figure5_sigmoid_flatten_merges():
    """NNTrainer Figure 5: L0 (fully connected), L1 sigmoid (Modify View), L2 flatten
    (Read-only View). X1 (L0's output), X2 (sigmoid output, MV of X1) and X3 (flatten, RV of
    X2) merge into one buffer living from L0's forward to the sigmoid's derivative, which
    needs X2 (its output), not X1: X1's last use equals X2's first, so the MV merge is legal."""
    T = ValueClass.TEMPORARY
    b = GraphBuilder("figure5")
    b.value("x", (2, 3), ValueClass.INPUT)
    b.value("W0", (3, 4), ValueClass.PARAMETER, trainable=True)
    b.const("shape", np.array([2, 2, 2], dtype=np.int64))
    b.value("lr", (1,), ValueClass.INPUT)
    b.node("MatMul", ["x", "W0"], ["X1"], [(2, 4)], name="L0")
    b.node("Sigmoid", ["X1"], ["X2"], name="L1")
    b.node("Flatten", ["X2"], ["X3"], name="L2", axis=1)
    b.node("ReduceSumSquare", ["X3"], ["loss"], [()], name="loss", keepdims=0)
    b.g.outputs.append("loss")
    b.node("Scale", ["X3"], ["dX3"], domain="com.microsoft", phase="backward", vclass=T, name="loss_grad")
    b.node("Reshape", ["dX3", "shape"], ["dX2"], [(2, 4)], phase="backward", vclass=T, name="L2_grad")
    b.node("SigmoidGrad", ["dX2", "X2"], ["dX1"], domain="com.microsoft", phase="backward", vclass=T,
           name="L1_grad")
    b.node("Gemm", ["x", "dX1"], ["dW0"], [(3, 4)], phase="backward", vclass=ValueClass.GRADIENT,
           name="L0_grad", transA=1)
    b.value("W0.updated", (3, 4), ValueClass.PARAMETER, trainable=True)
    b.node("SGDOptimizerV2", ["lr", "W0", "dW0"], ["flag", "W0.updated"], [(1,), (3, 4)],
           domain="com.microsoft", phase="optimizer", vclass=T, num_params=1, name="AG")
    b.g.outputs.append("W0.updated")
    g, results = run_pipeline(b.g, ["realize", "interleave", "inplace"])
    kinds = {o: (src, k) for n in g.nodes for o, (src, k) in n.aliases.items()}
    assert kinds["X2"] == ("X1", "mv") and kinds["X3"] == ("X2", "rv")
    order = [n.name for n in g.nodes]
    lt = lifetimes(g, order)
    (x1,) = [buf for buf in lt.buffers if buf.name == "X1"]
    assert set(x1.aliases) >= {"X2", "X3"}
    assert (x1.first, x1.last) == (order.index("L0"), order.index("L1_grad"))


def test_inplace_state_only_updates_parameters_in_place():
    g, _ = run_pipeline(three_linear_step("AdamW"), ["realize", "interleave", "inplace-state"])
    aliased = {o: src for n in g.nodes for o, (src, _k) in n.aliases.items() if _k == "mv"}
    assert aliased == {**{f"W{i}.updated": f"W{i}" for i in range(3)},
                       **{f"W{i}.{s}.updated": f"W{i}.{s}" for i in range(3) for s in "mv"}}
    from onnxplan.passes.inplace import inplace_state

    assert not inplace_state(g).modified
