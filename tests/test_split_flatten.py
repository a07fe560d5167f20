"""A product whose left operand is batched, split over its flattened rows (split_ops.flattens,
piece_shape): GPT-2's LM head, [B, S, M] x W^T -> [B, S, N], whose batch B = 4 left each chunk
the tied W whole beside a quarter of the logits. Rows of a contiguous [B, S, M] are rows of
[B*S, M]: in K that does not divide B, piece j is rows [j B*S/K, (j+1) B*S/K) of the flattened
tensor, the same bytes as before, so the views (Reshape to [B*S, N]) stay views and the dW
product (Gemm over the flattened rows, transA = 1) sums K chunks. Checked against numpy in
float64 (brute force), and the row checker (verify.verify_row_chunks) both ways."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from onnxplan.errors import ModelError
from onnxplan.executor.prepare import adopt_plan
from onnxplan.ir import ValueClass
from onnxplan.passes.split import SplitSpec, row_chunks, split_pass, split_pass_name, why_not
from onnxplan.passes.split_ops import piece_shape
from onnxplan.plan import Plan
from onnxplan.planning import PlanOptions, plan_step, verify_plan
from onnxplan.verify import PlanError, RowChunk, verify_row_chunks
from tests.graphs import GraphBuilder
from tests.test_split_products import _close, _feed, _run, _step

MS = "com.microsoft"
B, S, M, N = 4, 32, 128, 256  # 128 rows; a piece in K = 8, 16 is 8 / 16 rows: whole pages of 128, 256 floats
NODES = ("head", "view", "dx", "dyview", "xview", "dw")
OUTS = ["scores.out", "dx.out", "dw.out"]


def _lm_head():
    """x [B, S, M] times w [N, M] (transB) -> logits [B, S, N], viewed as scores [B*S, N]; its
    gradients: dx = dy w (FusedMatMul) and dw = dy2^T x2 (Gemm transA = 1 over the B*S rows of
    their [B*S, .] views), as ONNX Runtime's MatMul gradient makes them."""
    b = GraphBuilder("lm-head")
    b.value("x", (B, S, M), ValueClass.INPUT)
    b.value("w", (N, M), ValueClass.INPUT)
    b.value("dy", (B, S, N), ValueClass.INPUT)
    b.const("shape_y", np.array([B * S, N], dtype=np.int64))
    b.const("shape_x", np.array([B * S, M], dtype=np.int64))
    b.node("FusedMatMul", ["x", "w"], ["y"], [(B, S, N)], domain=MS, name="head", transB=1, alpha=1.0)
    b.node("Reshape", ["y", "shape_y"], ["scores"], [(B * S, N)], name="view")
    b.node("FusedMatMul", ["dy", "w"], ["dx"], [(B, S, M)], domain=MS, name="dx", transB=0, alpha=1.0)
    b.node("Reshape", ["dy", "shape_y"], ["dy2"], [(B * S, N)], name="dyview")
    b.node("Reshape", ["x", "shape_x"], ["x2"], [(B * S, M)], name="xview")
    b.node("Gemm", ["dy2", "x2"], ["dw"], [(N, M)], name="dw", transA=1, transB=0)
    return _step(b, ["scores", "dx", "dw"])


def _specs(k: int) -> tuple[SplitSpec, ...]:
    return tuple(SplitSpec(n, k) for n in NODES)


def test_piece_shapes_are_the_leading_axis_where_k_divides_it_else_the_flattened_rows():
    assert piece_shape((4, 32, 128), 4) == (1, 32, 128)  # as before: the batch
    assert piece_shape((4, 32, 128), 8) == (16, 128) and piece_shape((4, 32, 128), 16) == (8, 128)
    assert piece_shape((128, 256), 8) == (16, 256)
    assert piece_shape((4, 32, 128), 3) is None and piece_shape((6, 256), 4) is None  # rank 2: no flattening


@pytest.mark.parametrize("k", [2, 4, 8, 16])
def test_the_lm_head_and_its_gradients_split_over_the_flattened_rows_match_float64(k):
    g = _lm_head()
    assert all(why_not(g, g.node(n), k) == "" for n in NODES)
    feed = _feed(g, 5)
    x, w, dy = (feed[v].astype(np.float64) for v in ("x", "w", "dy"))
    refs = [(x @ w.T).reshape(B * S, N), dy @ w, dy.reshape(B * S, N).T @ x.reshape(B * S, M)]
    scales = [np.abs(x).reshape(B * S, M) @ np.abs(w).T, np.abs(dy) @ np.abs(w),
              np.abs(dy).reshape(B * S, N).T @ np.abs(x).reshape(B * S, M)]
    whole = _run(g, PlanOptions(), feed, OUTS)
    split = _run(g, PlanOptions(splits=_specs(k)), feed, OUTS)
    for name, ref, sc, a, s in zip(OUTS, refs, scales, whole, split, strict=True):
        ulps = 2 * k + 4 if name == "dw.out" else 4  # dW: K partial sums added in chunk order
        assert _close(np.maximum(ref, 0), s, sc, ulps), (name, k, float(np.max(np.abs(np.maximum(ref, 0) - s))))
        assert _close(a, s, sc, ulps + 4), (name, k)
    wrong = split[0].copy()
    wrong[: B * S // k] = 0  # a chunk's rows never written: far outside the tolerance
    assert not _close(np.maximum(refs[0], 0), wrong, scales[0], 4)


def test_the_flattened_pieces_are_views_passed_producer_to_consumer():
    g = _lm_head()
    out = split_pass(split_pass_name(_specs(8))[6:])(g).graph
    head = out.node("head#3")
    assert head.inputs == ["x#3", "w"] and out.values["x#3"].spec.shape == (16, M)
    assert out.values["y#3"].spec.shape == (16, N)
    assert out.node("view#3").aliases == {"scores#3": ("y#3", "rv")}  # no transfer, no copy
    assert out.node("dw#3").inputs[:2] == ["dy2#3", "x2#3"]  # dW over the same rows, summed
    assert not {"y", "dy2"} & {str(n.attrs.get("slot")) for n in out.nodes if n.domain == "onnxplan"}


@pytest.mark.parametrize("node, attrs, k, why", [
    ("head", {"transA": 1}, 8, "does not divide the 4 rows"),  # a transposed left operand: by its batch only
    ("head", {}, 3, "does not divide the 128 rows"),
    ("view", {}, 3, "does not divide the 128 rows"),
])
def test_refused_flattened_splits_say_why(node, attrs, k, why):
    g = _lm_head()
    g.node(node).attrs.update(attrs)
    assert why in why_not(g, g.node(node), k)
    with pytest.raises(Exception, match=why):
        split_pass(split_pass_name([SplitSpec(node, k)])[6:])(g)


def test_a_batched_right_operand_keeps_the_split_by_the_batch():
    b = GraphBuilder("batched")
    b.value("x", (4, 32, M), ValueClass.INPUT)
    b.value("w", (4, M, N), ValueClass.INPUT)
    b.node("MatMul", ["x", "w"], ["y"], [(4, 32, N)], name="target")
    g = _step(b, ["y"])
    assert why_not(g, g.node("target"), 4) == "" and "does not divide the 4 rows" in why_not(g, g.node("target"), 8)


def _swap_inputs(graph, a: str, b: str, slot: int):
    """The graph with input `slot` of chunks `a` and `b` exchanged (chunk a reads b's piece)."""
    bad = graph.copy()
    na, nb = bad.node(a), bad.node(b)
    ia, ib = list(na.inputs), list(nb.inputs)
    ia[slot], ib[slot] = ib[slot], ia[slot]
    bad.nodes[bad.nodes.index(na)] = dataclasses.replace(na, inputs=ia)
    bad.nodes[bad.nodes.index(nb)] = dataclasses.replace(nb, inputs=ib)
    return bad


def _swap_outputs(graph, a: str, b: str):
    bad = graph.copy()
    na, nb = bad.node(a), bad.node(b)
    bad.nodes[bad.nodes.index(na)] = dataclasses.replace(na, outputs=list(nb.outputs))
    bad.nodes[bad.nodes.index(nb)] = dataclasses.replace(nb, outputs=list(na.outputs))
    return bad


@pytest.mark.parametrize("k", [4, 8])
def test_the_row_checker_accepts_the_flattened_chunks_and_refuses_wrong_ones(k):
    g = _lm_head()
    res = plan_step(g, PlanOptions(interleave=False, splits=_specs(k)))
    verify_plan(res.graph, res.plan)
    chunks = [c for c in row_chunks(res.graph) if c.node in ("head", "dx")]
    assert len(chunks) == 2 * k and all(c.piece_start == c.start and c.stop - c.start == B * S // k for c in chunks)
    assert adopt_plan(g, Plan.from_json(json.loads(res.plan.dumps()))) is not None
    with pytest.raises(PlanError, match="left operand's piece from row"):  # chunk 1 reads chunk 2's rows of x
        verify_plan(_swap_inputs(res.graph, "head#1", "head#2", 0), res.plan)
    with pytest.raises(PlanError, match="must partition"):  # chunk 0 writes chunk 1's rows of the output
        verify_row_chunks(row_chunks(_swap_outputs(res.graph, "dx#0", "dx#1")), res.plan.splits)
    good = [c for c in row_chunks(res.graph) if c.node == "head"]
    for bad in ([*good[:-1], dataclasses.replace(good[-1], piece_rows=good[-1].piece_rows // 2)],  # a half piece
                [dataclasses.replace(c, rows=c.rows + 1) for c in good],  # the last row left out
                good[:-1]):  # a chunk dropped
        with pytest.raises(PlanError):
            verify_row_chunks(bad, [s for s in res.plan.splits if s.node == "head"])
    dropped = json.loads(res.plan.dumps())
    dropped["order"] = [n for n in dropped["order"] if n != "head#1"]  # a chunk's rows never computed
    with pytest.raises(ModelError):
        adopt_plan(g, Plan.from_json(dropped))


def test_a_whole_left_operand_in_a_chunk_is_refused():
    """A chunk reading the whole x (not its rows) would write every row: the checker says so."""
    g = _lm_head()
    res = plan_step(g, PlanOptions(interleave=False, splits=(SplitSpec("head", 8),)))
    bad = res.graph.copy()
    chunk = bad.node("head#2")
    bad.nodes[bad.nodes.index(chunk)] = dataclasses.replace(chunk, inputs=["x", *chunk.inputs[1:]])
    assert RowChunk("head", 2, 32, 48, 128, -1, -1) in row_chunks(bad)
    with pytest.raises(PlanError, match="head"):
        verify_plan(bad, res.plan)
