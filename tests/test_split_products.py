"""passes/split_ops.py's products, views and sums over rows: a MatMul / FusedMatMul / Gemm over
the rows of its left operand, a Reshape of pieces, the weight gradient (Gemm transA = 1) and a bias
gradient (ReduceSum over axis 0) as K-way sums, LayerNormalizationGrad by rows with its dscale and
dbias summed (its per-row mean and inv_std copied by rows), each whole and in 2, 4 and 8 chunks on
seeded inputs. Products: the same rows of the same operands (bitwise unless BLAS blocks fewer
rows otherwise: held to one dot product's float32 rounding); sums: the order of the K partial
sums changes, held to a few ulps of the sum of |terms|."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from onnxplan.errors import ModelError
from onnxplan.executor.prepare import adopt_plan
from onnxplan.executor.runner import Executor
from onnxplan.ir import ValueClass
from onnxplan.passes.split import SplitRefused, SplitSpec, split_pass, split_pass_name, why_not
from onnxplan.plan import Plan
from onnxplan.planning import PlanOptions, plan_step
from tests.graphs import GraphBuilder

MS = "com.microsoft"
R, M, N = 64, 128, 256  # 64 rows: a piece of 8 / K rows of 128 or 256 float32 is whole pages
KS = (2, 4, 8)


def _run(graph, opts: PlanOptions, feed: dict[str, np.ndarray], outs: list[str]) -> list[np.ndarray]:
    res = plan_step(graph, dataclasses.replace(opts, interleave=False))
    ex = Executor(res.graph, res.plan)
    ex.load_state({})
    ex.step(feed)
    got = [ex.binding.arrays[o].copy() for o in outs]
    if ex.pieces is not None:
        ex.pieces.close()
    return got


def _feed(g, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i: rng.standard_normal(g.values[i].spec.shape).astype(np.float32) for i in g.inputs}


def _step(b: GraphBuilder, outs: list[str]):
    """Each of `outs` through a Relu to a step output (the split node's outputs stay values)."""
    for o in outs:
        b.node("Relu", [o], [f"{o}.out"], name=f"after.{o}")
        b.g.outputs.append(f"{o}.out")
    b.g.loss = b.g.outputs[0]
    return b.g


def _product(op: str, **attrs):
    """x [R, M] (or batched [8, R/8, M]) times w -> y, through `op`."""
    b = GraphBuilder(f"product-{op}")
    if op == "BatchedMatMul":
        b.value("x", (8, R // 8, M), ValueClass.INPUT)
        b.value("w", (8, M, N), ValueClass.INPUT)
        b.node("MatMul", ["x", "w"], ["y"], [(8, R // 8, N)], name="target")
    elif op == "Gemm":
        b.value("x", (R, M), ValueClass.INPUT)
        b.value("w", (N, M), ValueClass.INPUT)
        b.value("c", (R, N), ValueClass.INPUT)
        b.node("Gemm", ["x", "w", "c"], ["y"], [(R, N)], name="target", transB=1, alpha=0.5, beta=2.0)
    else:
        b.value("x", (R, M), ValueClass.INPUT)
        b.value("w", (N, M) if attrs.get("transB") else (M, N), ValueClass.INPUT)
        b.node(op, ["x", "w"], ["y"], [(R, N)], domain=MS if op == "FusedMatMul" else "", name="target", **attrs)
    return _step(b, ["y"])


def _close(whole: np.ndarray, split: np.ndarray, scale: np.ndarray, ulps: float) -> bool:
    """|whole - split| within `ulps` float32 ulps of `scale` (the sum of |terms| per element)."""
    return bool(np.all(np.abs(whole - split) <= ulps * np.finfo(np.float32).eps * scale))


@pytest.mark.parametrize("op, attrs", [("MatMul", {}), ("BatchedMatMul", {}), ("FusedMatMul", {"transB": 1, "alpha": 0.5}),
                                       ("Gemm", {})], ids=["MatMul", "batched", "FusedMatMul", "Gemm"])
def test_a_product_over_rows_matches_the_whole_one(op, attrs):
    g = _product(op, **attrs)
    feed = _feed(g, 7)
    whole, = _run(g, PlanOptions(), feed, ["y"])
    x, w = feed["x"].astype(np.float64), feed["w"].astype(np.float64)
    scale = np.abs(x) @ np.abs(np.swapaxes(w, -1, -2) if op in ("Gemm", "FusedMatMul") else w) + 4 * np.abs(feed.get("c", 0))
    for k in KS:
        assert why_not(g, g.nodes[0], k) == ""
        split, = _run(g, PlanOptions(splits=(SplitSpec("target", k),)), feed, ["y"])
        # each row is the same dot products; BLAS may block a product of fewer rows otherwise
        assert _close(whole, split, scale, 4), (op, k, float(np.max(np.abs(whole - split))))


def _weight_grad():
    """dW = A^T dY (Gemm transA = 1, ORT's MatMul gradient) and db = ReduceSum(dY, axes 0):
    both sums over the R rows of A and dY."""
    b = GraphBuilder("weight-grad")
    b.value("a", (R, M), ValueClass.INPUT)
    b.value("dy", (R, N), ValueClass.INPUT)
    b.const("axes", np.array([0], dtype=np.int64))
    b.node("Gemm", ["a", "dy"], ["dw"], [(M, N)], name="dw", transA=1, transB=0, alpha=1.0, beta=1.0)
    b.node("ReduceSum", ["dy", "axes"], ["db"], [(N,)], name="db", keepdims=0)
    return _step(b, ["dw", "db"])


def test_a_weight_gradient_and_a_bias_gradient_sum_their_chunks():
    g = _weight_grad()
    feed = _feed(g, 11)
    whole = _run(g, PlanOptions(), feed, ["dw", "db"])
    a, dy = feed["a"].astype(np.float64), feed["dy"].astype(np.float64)
    scales = [np.abs(a).T @ np.abs(dy), np.abs(dy).sum(axis=0)]
    for k in KS:
        specs = (SplitSpec("dw", k), SplitSpec("db", k))
        split = _run(g, PlanOptions(splits=specs), feed, ["dw", "db"])
        for w, s, sc in zip(whole, split, scales, strict=True):
            assert _close(w, s, sc, 2 * k), k  # K partial sums added in chunk order: a few ulps a sum
        nodes = {n.name: n for n in split_pass(split_pass_name(specs)[6:])(g).graph.nodes}
        assert nodes[f"dw#{k - 1}"].inputs[2] == f"dw#acc{k - 2}" and nodes[f"dw#{k - 1}"].outputs == ["dw"]
        assert nodes[f"db#{k - 1}.add0"].outputs == ["db"]
        planned = plan_step(g, PlanOptions(interleave=False, splits=specs)).graph
        assert planned.node("dw#0").op_type == "GemmAdd" and not planned.node("dw#0").aliases
        for j in range(1, k):  # the running sum updated in place: one dW-sized buffer, not two
            chunk = planned.node(f"dw#{j}")
            assert chunk.op_type == "GemmAdd" and chunk.aliases == {chunk.outputs[0]: (chunk.inputs[2], "mv")}


def test_a_summed_split_is_not_the_unsplit_sum_bit_for_bit_but_the_check_sees_a_wrong_one():
    """The tolerance above is tight enough to catch a chunk left out of the sum."""
    g = _weight_grad()
    feed = _feed(g, 11)
    whole, _ = _run(g, PlanOptions(), feed, ["dw", "db"])
    a, dy = feed["a"], feed["dy"]
    missing = a[R // 4:].T @ dy[R // 4:]  # the sum without the first of 4 chunks
    assert not _close(whole, missing, np.abs(a).T @ np.abs(dy), 8)


def _layer_norm_grad():
    """LayerNormalizationGrad over [R, 8, M/8... ] rows: dX by rows, dscale and dbias summed."""
    b = GraphBuilder("ln-grad")
    for name, shape in (("dy", (16, 8, M)), ("x", (16, 8, M)), ("mean", (16, 8, 1)), ("inv", (16, 8, 1))):
        b.value(name, shape, ValueClass.INPUT)
    b.value("scale", (M,), ValueClass.INPUT)
    b.node("LayerNormalizationGrad", ["dy", "x", "scale", "mean", "inv"], ["dx", "dscale", "dbias"],
           [(16, 8, M), (M,), (M,)], domain=MS, name="target", axis=-1, epsilon=1e-5)
    return _step(b, ["dx", "dscale", "dbias"])


def test_a_layer_norm_gradient_splits_by_rows_and_sums_its_scale_gradients():
    g = _layer_norm_grad()
    feed = _feed(g, 5)
    feed["inv"] = np.abs(feed["inv"]) + 0.5
    outs = ["dx", "dscale", "dbias"]
    whole = _run(g, PlanOptions(), feed, outs)
    dy, x = np.abs(feed["dy"]).reshape(-1, M), np.abs(feed["x"]) + np.abs(feed["mean"])
    xhat = (x * feed["inv"]).reshape(-1, M)
    for k in (2, 4):  # mean and inv_std pieces (4 KiB / K) are copied by rows, off the store's page
        out = split_pass(split_pass_name([SplitSpec("target", k)])[6:])(g).graph
        assert sum(n.op_type == "PieceRows" for n in out.nodes) == 2 * k
        split = _run(g, PlanOptions(splits=(SplitSpec("target", k),)), feed, outs)
        assert np.array_equal(whole[0], split[0])  # dX: each row from its own row, the same bits
        assert _close(whole[1], split[1], (dy * xhat).sum(axis=0), 4 * k)
        assert _close(whole[2], split[2], dy.sum(axis=0), 4 * k)


def test_a_view_of_pieces_is_a_view_of_each_piece():
    """Reshape of a split producer's pieces: each chunk a view of its piece, no transfer, no copy."""
    b = GraphBuilder("view")
    b.value("x", (16, 4, M), ValueClass.INPUT)
    b.const("shape", np.array([R, M], dtype=np.int64))
    b.node("Relu", ["x"], ["h"], name="relu")
    b.node("Reshape", ["h", "shape"], ["v"], [(R, M)], name="view")
    b.node("Sigmoid", ["v"], ["s"], name="sig")
    g = _step(b, ["s"])
    from onnxplan.passes.realize import realize

    g = realize(g).graph
    specs = (SplitSpec("relu", 4), SplitSpec("view", 4), SplitSpec("sig", 4))
    out = split_pass(split_pass_name(specs)[6:])(g).graph
    nodes = {n.name: n for n in out.nodes}
    assert nodes["view#2"].aliases == {"v#2": ("h#2", "rv")} and nodes["sig#2"].inputs == ["v#2"]
    assert not {"h", "v"} & {str(n.attrs.get("slot")) for n in out.nodes if n.domain == "onnxplan"}  # no transfer
    feed = _feed(g, 3)
    assert np.array_equal(_run(g, PlanOptions(), feed, ["s.out"])[0],
                          _run(g, PlanOptions(splits=specs), feed, ["s.out"])[0])


@pytest.mark.parametrize("graph, node, attrs, why", [
    (_product, "target", {"transBatchA": 1}, "batch-axis transpose"),
    (_product, "target", {"transA": 1}, "left operand is transposed"),
    (_weight_grad, "dw", {"transB": 1}, "transB"),
    (_weight_grad, "db", {"axes": [1]}, "is not split"),
    (_layer_norm_grad, "target", {"axis": 0}, "across axis 0"),
])
def test_refused_products_and_sums_say_why(graph, node, attrs, why):
    g = graph("FusedMatMul") if graph is _product else graph()
    n = g.node(node)
    if "axes" in attrs:  # a ReduceSum keeping axis 0 is no sum over the rows
        g.initializers["axes"] = np.array(attrs["axes"], dtype=np.int64)
    else:
        n.attrs.update(attrs)
    assert why in why_not(g, n, 2)
    with pytest.raises(SplitRefused, match=why):
        split_pass(split_pass_name([SplitSpec(node, 2)])[6:])(g)


def test_a_plan_of_summed_splits_survives_its_file_and_an_edited_one_is_refused():
    g = _weight_grad()
    res = plan_step(g, PlanOptions(interleave=False, splits=(SplitSpec("dw", 4), SplitSpec("db", 2))))
    text = json.loads(res.plan.dumps())
    assert {s["node"]: s["k"] for s in text["splits"]} == {"dw": 4, "db": 2}
    assert adopt_plan(g, Plan.from_json(text)) is not None
    bad = json.loads(res.plan.dumps())
    next(s for s in bad["splits"] if s["node"] == "dw")["k"] = 2  # the record says 2 chunks, the passes made 4
    with pytest.raises(ModelError, match="split"):
        adopt_plan(g, Plan.from_json(bad))


def _conv_weight_grad(group: int = 1):
    """dW only of ConvGrad(dY, X, W) (split_grad's dW half): W [64, 128 / group, 3, 3]."""
    b = GraphBuilder("conv-dw")
    b.value("dy", (4, 64, 8, 8), ValueClass.INPUT)
    b.value("x", (4, 128, 8, 8), ValueClass.INPUT)
    b.value("w", (64, 128 // group, 3, 3), ValueClass.INPUT)
    b.node("ConvGrad", ["dy", "x", "w"], ["", "dw"], [None, (64, 128 // group, 3, 3)], domain=MS, name="target",
           kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], group=group)
    return _step(b, ["dw"])


def test_a_conv_weight_gradient_splits_over_its_output_channels():
    """Chunk j: dW[j M/K:(j+1) M/K] from dY's channels (copied) and X whole; W is not read."""
    g = _conv_weight_grad()
    feed = _feed(g, 13)
    whole, = _run(g, PlanOptions(), feed, ["dw"])
    dy, x = np.abs(feed["dy"]).astype(np.float64), np.abs(feed["x"]).astype(np.float64)
    scale = np.einsum("nmhw,nc->mc", dy, x.sum(axis=(2, 3)))[:, :, None, None]  # >= the sum of |terms|
    for k in KS:
        out = split_pass(split_pass_name([SplitSpec("target", k)])[6:])(g).graph
        chunks = [n for n in out.nodes if n.op_type == "ConvGradWeight"]
        assert len(chunks) == k and all("w" not in n.inputs for n in chunks)
        assert chunks[1].attrs["w_shape"] == [64 // k, 128, 3, 3]
        split, = _run(g, PlanOptions(splits=(SplitSpec("target", k),)), feed, ["dw"])
        assert _close(whole, split, scale, 4), (k, float(np.max(np.abs(whole - split))))
    wrong = whole.copy()
    wrong[:8] = 0  # a chunk's channels left out: far outside the tolerance
    assert not _close(whole, wrong, scale, 4)
    assert "grouped" in why_not(_conv_weight_grad(2), _conv_weight_grad(2).node("target"), 2)
    fused = g.node("target")
    fused.outputs = ["x", "dw"]  # a ConvGrad making dX too: refused, saying so
    assert "making dX or dB too" in why_not(g, fused, 2)


def test_the_chunk_checker_passes_every_chunk_and_refuses_one_left_out():
    """verify_chunks: a sum's chunks each once; a chunk left out of the order (a term missing
    from the sum) or a chunk beyond K is refused."""
    from onnxplan.verify import PlanError, verify_chunks

    g = _weight_grad()
    res = plan_step(g, PlanOptions(interleave=False, splits=(SplitSpec("dw", 4), SplitSpec("db", 2))))
    verify_chunks(res.plan.splits, res.plan.order)
    assert "db#1.add0" in res.plan.order
    with pytest.raises(PlanError, match=r"chunks \[2\] missing"):
        verify_chunks(res.plan.splits, [n for n in res.plan.order if n != "dw#2"])
    with pytest.raises(PlanError, match=r"\[4\] beyond K"):
        verify_chunks(res.plan.splits, [*res.plan.order, "dw#4"])
    with pytest.raises(PlanError, match="whole"):
        verify_chunks(res.plan.splits, [*res.plan.order, "dw"])


def _conv(op: str):
    """Conv (X [8, 64, 8, 8], W [64, 64, 3, 3], bias) or ConvGradInput (dY, W -> dX) over 8 images."""
    b = GraphBuilder(f"conv-{op}")
    b.value("x", (8, 64, 8, 8), ValueClass.INPUT)
    b.value("w", (64, 64, 3, 3), ValueClass.INPUT)
    attrs = {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "group": 1}
    if op == "Conv":
        b.value("b", (64,), ValueClass.INPUT)
        b.node("Conv", ["x", "w", "b"], ["y"], [(8, 64, 8, 8)], name="target", **attrs)
    else:
        b.node("ConvGradInput", ["x", "w"], ["y"], [(8, 64, 8, 8)], domain="onnxplan", name="target",
               x_shape=[8, 64, 8, 8], **attrs)
    return _step(b, ["y"])


@pytest.mark.parametrize("op", ["Conv", "ConvGradInput"])
def test_a_convolution_splits_over_its_images(op):
    g = _conv(op)
    feed = _feed(g, 17)
    whole, = _run(g, PlanOptions(), feed, ["y"])
    scale = np.einsum("nchw,mc->nmhw", np.abs(feed["x"]).astype(np.float64),
                      np.abs(feed["w"]).astype(np.float64).sum(axis=(2, 3))).max() + np.abs(feed.get("b", 0)).max()
    for k in KS:
        out = split_pass(split_pass_name([SplitSpec("target", k)])[6:])(g).graph
        chunk = out.node("target#1")
        assert chunk.inputs[1] == "w" and out.values[chunk.inputs[0]].spec.shape[0] == 8 // k
        if op == "ConvGradInput":
            assert chunk.attrs["x_shape"] == [8 // k, 64, 8, 8]
        split, = _run(g, PlanOptions(splits=(SplitSpec("target", k),)), feed, ["y"])
        assert _close(whole, split, np.full(whole.shape, scale), 4), (op, k, float(np.max(np.abs(whole - split))))
    wrong = whole.copy()
    wrong[1] = 0
    assert not _close(whole, wrong, np.full(whole.shape, scale), 4)


def test_an_elementwise_sum_whose_rows_do_not_split_splits_flat():
    """Sum of two [67, 1024] (67 rows: no K divides them): pieces of whole pages of the flattened
    tensors, the last the rest; elementwise, the same bits. A broadcast input: not flat."""
    b = GraphBuilder("flat-sum")
    b.value("x", (67, 1024), ValueClass.INPUT)
    b.value("y", (67, 1024), ValueClass.INPUT)
    b.node("Sum", ["x", "y"], ["s"], name="target")
    g = _step(b, ["s"])
    feed = _feed(g, 19)
    whole, = _run(g, PlanOptions(), feed, ["s.out"])
    for k in KS:
        assert why_not(g, g.node("target"), k) == ""
        out = split_pass(split_pass_name([SplitSpec("target", k)])[6:])(g).graph
        shapes = [out.values[f"s#{j}"].spec.shape for j in range(k)]
        assert all(len(s) == 1 for s in shapes) and sum(s[0] for s in shapes) == 67 * 1024
        split, = _run(g, PlanOptions(splits=(SplitSpec("target", k),)), feed, ["s.out"])
        assert np.array_equal(whole, split), k
    g.values["y"] = dataclasses.replace(g.values["y"], spec=dataclasses.replace(g.values["y"].spec, shape=(1024,)))
    assert "does not divide" in why_not(g, g.node("target"), 2)  # y broadcast over the rows: no flat cut


def test_a_weight_gradient_with_its_own_c_and_beta_keeps_them_in_its_first_chunk():
    """dW = A^T dY + 2 C: chunk 0 (onnxplan.GemmAdd, by blocks of rows) adds beta C, the others the sum so far."""
    b = GraphBuilder("weight-grad-c")
    b.value("a", (R, M), ValueClass.INPUT)
    b.value("dy", (R, N), ValueClass.INPUT)
    b.value("c", (M, N), ValueClass.INPUT)
    b.node("Gemm", ["a", "dy", "c"], ["dw"], [(M, N)], name="dw", transA=1, transB=0, alpha=0.5, beta=2.0)
    g = _step(b, ["dw"])
    feed = _feed(g, 37)
    whole, = _run(g, PlanOptions(), feed, ["dw"])
    scale = 0.5 * np.abs(feed["a"]).T.astype(np.float64) @ np.abs(feed["dy"]) + 2 * np.abs(feed["c"])
    for k in KS:
        split, = _run(g, PlanOptions(splits=(SplitSpec("dw", k),)), feed, ["dw"])
        assert _close(whole, split, scale, 2 * k), k
    assert not _close(whole, whole - feed["c"], scale, 2 * KS[-1])  # C left out: far outside
