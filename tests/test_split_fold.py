"""passes/split_fold.py: a transposed weight folded into its products (the split pass's K = 1),
on a tied LM head in small: Y = X W^T through Transpose(W), dX = dY (W^T)^T, dW = (A^T dY)^T;
folded, the same products within one dot product's float32 rounding; refusals; the plan file and
the chunk checker."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from onnxplan.errors import ModelError
from onnxplan.executor.prepare import adopt_plan
from onnxplan.executor.runner import Executor
from onnxplan.ir import ValueClass
from onnxplan.passes.split import SplitRefused, SplitSpec, split_pass, split_pass_name
from onnxplan.passes.split_fold import fold_refusal
from onnxplan.plan import Plan
from onnxplan.planning import PlanOptions, plan_step
from onnxplan.verify import PlanError, verify_chunks
from tests.graphs import GraphBuilder

MS = "com.microsoft"
B, S, D, V = 4, 8, 16, 1024
FOLDS = (SplitSpec("w.t", 1), SplitSpec("dw.t", 1))
OUTS = ["y", "dx", "dw"]


def _head():
    b = GraphBuilder("tied-head")
    for name, shape in (("x", (B, S, D)), ("w", (V, D)), ("dy", (B, S, V)), ("a", (B * S, D)), ("dy2", (B * S, V))):
        b.value(name, shape, ValueClass.INPUT)
    b.node("Transpose", ["w"], ["wt"], [(D, V)], name="w.t", perm=[1, 0])
    b.node("MatMul", ["x", "wt"], ["y"], [(B, S, V)], name="head")
    b.node("FusedMatMul", ["dy", "wt"], ["dx"], [(B, S, D)], domain=MS, phase="backward", name="head.dx",
           transB=1, transA=0, alpha=1.0, transBatchA=0, transBatchB=0)
    b.node("Gemm", ["a", "dy2"], ["dwt"], [(D, V)], phase="backward", name="head.dw", transA=1, transB=0,
           alpha=1.0, beta=1.0)
    b.node("Transpose", ["dwt"], ["dw"], [(V, D)], phase="backward", name="dw.t", perm=[1, 0])
    for o in OUTS:
        b.node("Neg", [o], [f"{o}.out"], name=f"after.{o}", phase="backward")
        b.g.outputs.append(f"{o}.out")
    b.g.loss = "y.out"
    return b.g


def _run(g, specs, feed) -> list[np.ndarray]:
    res = plan_step(g, PlanOptions(interleave=False, splits=specs))
    ex = Executor(res.graph, res.plan)
    ex.load_state({})
    ex.step(feed)
    got = [-ex.binding.arrays[f"{o}.out"] for o in OUTS]
    if ex.pieces is not None:
        ex.pieces.close()
    return got


def test_a_folded_head_computes_the_same_products():
    g = _head()
    rng = np.random.default_rng(31)
    feed = {i: rng.standard_normal(g.values[i].spec.shape).astype(np.float32) for i in g.inputs}
    whole = _run(g, (), feed)
    out = split_pass(split_pass_name(FOLDS)[6:])(g).graph
    assert not any(n.op_type == "Transpose" for n in out.nodes) and not {"wt", "dwt"} & set(out.values)
    head, dx, dw = out.node("head"), out.node("head.dx"), out.node("head.dw")
    assert (head.op_type, head.inputs, head.attrs["transB"]) == ("FusedMatMul", ["x", "w"], 1)
    assert (dx.inputs, dx.attrs["transB"]) == (["dy", "w"], 0)
    assert (dw.inputs, dw.outputs, dw.attrs["transA"]) == (["dy2", "a"], ["dw"], 1)
    folded = _run(g, FOLDS, feed)
    x, w, dy, a, dy2 = (np.abs(feed[k]).astype(np.float64) for k in ("x", "w", "dy", "a", "dy2"))
    scales = [x @ w.T, dy @ w, (a.T @ dy2).T]  # the sums of |terms|
    for name, ours, theirs, scale in zip(OUTS, whole, folded, scales, strict=True):
        assert np.all(np.abs(ours - theirs) <= 4 * np.finfo(np.float32).eps * scale), name
    wrong = folded[2].copy()
    wrong[0] = 0
    assert not np.all(np.abs(whole[2] - wrong) <= 4 * np.finfo(np.float32).eps * scales[2])
    split = _run(g, (*FOLDS, SplitSpec("head", 4), SplitSpec("head.dw", 4)), feed)  # folded, then split
    for ours, theirs, scale in zip(whole, split, scales, strict=True):
        assert np.all(np.abs(ours - theirs) <= 8 * np.finfo(np.float32).eps * scale)


@pytest.mark.parametrize("change, why", [
    ("relu", "read otherwise"),
    ("perm", "not a transpose of a matrix"),
    ("shared", "read otherwise"),
])
def test_refused_folds_say_why(change, why):
    g = _head()
    if change == "relu":  # W^T also read by an elementwise op
        g.nodes.append(dataclasses.replace(g.node("after.y"), name="relu", op_type="Relu", inputs=["wt"],
                                           outputs=["r"]))
        g.values["r"] = dataclasses.replace(g.values["wt"], name="r")
        node = "w.t"
    elif change == "perm":
        g.node("w.t").attrs["perm"] = [0, 1]
        node = "w.t"
    else:  # the weight gradient before its transpose is read by another node too
        g.nodes.append(dataclasses.replace(g.node("after.y"), name="relu", op_type="Relu", inputs=["dwt"],
                                           outputs=["r"]))
        g.values["r"] = dataclasses.replace(g.values["dwt"], name="r")
        node = "dw.t"
    assert why in fold_refusal(g, g.node(node))
    with pytest.raises(SplitRefused, match=why):
        split_pass(split_pass_name([SplitSpec(node, 1)])[6:])(g)


def test_a_plan_with_folds_survives_its_file_and_the_checker_refuses_a_transpose_left_in():
    g = _head()
    res = plan_step(g, PlanOptions(interleave=False, splits=FOLDS))
    text = json.loads(res.plan.dumps())
    assert {s["node"]: (s["k"], s["op"]) for s in text["splits"]} == {"w.t": (1, "fold"), "dw.t": (1, "fold")}
    assert adopt_plan(g, Plan.from_json(text)) is not None
    verify_chunks(res.plan.splits, res.plan.order)
    with pytest.raises(PlanError, match="whole"):
        verify_chunks(res.plan.splits, [*res.plan.order, "w.t"])
    with pytest.raises(PlanError, match="beyond K"):
        verify_chunks(res.plan.splits, [*res.plan.order, "w.t#0"])
    bad = json.loads(res.plan.dumps())
    bad["splits"] = [s for s in bad["splits"] if s["node"] != "dw.t"]  # the record leaves a fold out
    with pytest.raises(ModelError):
        adopt_plan(g, Plan.from_json(bad))
