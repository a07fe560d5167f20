"""passes/split_ops.py's loss over rows: SoftmaxCrossEntropyLoss and SoftmaxCrossEntropyLossGrad
in 2, 4 and 8 chunks of the scores' rows (onnxplan.SoftmaxCrossEntropyLoss(Grad)Rows), whole and
split on seeded inputs with ignored labels and class weights: the gradient the same bits, the loss
within a few float32 ulps of its sum of |terms| (K shares added in chunk order); a plan file of the
split adopted and an edited one refused; pieces off the store's page (GPT-2's 50257-wide rows)
moved by read-modify-write of their end pages."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from onnxplan.errors import ModelError
from onnxplan.executor.piece_io import PieceRuntime
from onnxplan.executor.prepare import adopt_plan
from onnxplan.executor.runner import Executor
from onnxplan.ir import ValueClass
from onnxplan.passes.split import (
    OFF_PAGE_MIN,
    PIECE_ALIGN,
    SplitRefused,
    SplitSpec,
    split_pass,
    split_pass_name,
    why_not,
)
from onnxplan.plan import Plan
from onnxplan.planning import PlanOptions, plan_step
from onnxplan.verify import PlanError, verify_pieces
from tests.graphs import GraphBuilder

MS = "com.microsoft"
R = 64
KS = (2, 4, 8)
IGNORE = -100


def _loss_graph(classes: int, reduction: str = "mean", weighted: bool = False):
    """scores [R, classes] -> SoftmaxCrossEntropyLoss (loss, log_prob) -> its gradient (dY a
    scalar input) -> dlogits; the loss and dlogits through a Neg to the step's outputs."""
    b = GraphBuilder(f"sce-{classes}")
    b.value("scores", (R, classes), ValueClass.INPUT)
    b.value("labels", (R,), ValueClass.INPUT, dtype="int64")
    b.value("dy", (), ValueClass.INPUT)
    extra = [b.value("weight", (classes,), ValueClass.INPUT)] if weighted else []
    attrs = {"reduction": reduction, "ignore_index": IGNORE}
    b.node("SoftmaxCrossEntropyLoss", ["scores", "labels", *extra], ["loss", "log_prob"], [(), (R, classes)],
           name="loss", **attrs)
    b.node("SoftmaxCrossEntropyLossGrad", ["dy", "log_prob", "labels", *extra], ["dlogits"], [(R, classes)],
           domain=MS, phase="backward", name="grad", **attrs)
    for o in ("loss", "dlogits"):
        b.node("Neg", [o], [f"{o}.out"], name=f"after.{o}", phase="backward")
        b.g.outputs.append(f"{o}.out")
    b.g.loss = "loss.out"
    return b.g


def _feed(g, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    classes = g.values["scores"].spec.shape[1]
    labels = rng.integers(0, classes, R)
    labels[rng.random(R) < 0.2] = IGNORE  # some rows ignored: the mean's denominator is the kept count
    feed = {"scores": (3 * rng.standard_normal((R, classes))).astype(np.float32), "labels": labels.astype(np.int64),
            "dy": np.array(1.0, np.float32)}
    if "weight" in g.values:
        feed["weight"] = rng.uniform(0.5, 1.5, classes).astype(np.float32)
    return feed


def _run(g, specs: tuple[SplitSpec, ...], feed: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    res = plan_step(g, PlanOptions(interleave=False, splits=specs))
    ex = Executor(res.graph, res.plan)
    ex.load_state({})
    ex.step(feed)
    got = (-ex.binding.arrays["loss.out"], -ex.binding.arrays["dlogits.out"])  # through a Neg: exact
    if ex.pieces is not None:
        ex.pieces.close()
    return got


def _reference(feed: dict[str, np.ndarray], reduction: str, start: int = 0) -> float:
    """The loss in float64 over rows start.. (the denominator the whole labels'); its terms are
    all >= 0, so it is also their sum of |terms|."""
    s = feed["scores"].astype(np.float64)
    logp = s - s.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    kept = feed["labels"] != IGNORE
    safe = np.where(kept, feed["labels"], 0)
    w = feed["weight"][safe] * kept if "weight" in feed else kept.astype(np.float64)
    total = float(np.sum(-logp[np.arange(R), safe][start:] * w[start:]))
    return total / float(w.sum()) if reduction == "mean" else total


def _close(whole: np.ndarray, split: np.ndarray, scale: float, ulps: float) -> bool:
    return bool(np.abs(whole.astype(np.float64) - split) <= ulps * np.finfo(np.float32).eps * scale)


@pytest.mark.parametrize("classes, reduction, weighted", [(1024, "mean", False), (1024, "sum", True),
                                                          (2048, "mean", True)], ids=["mean", "sum-weighted", "mean-weighted"])
def test_the_loss_and_its_gradient_split_over_rows_match_the_whole_ones(classes, reduction, weighted):
    g = _loss_graph(classes, reduction, weighted)
    feed = _feed(g, 23)
    loss, dlogits = _run(g, (), feed)
    scale = _reference(feed, reduction)
    for k in KS:
        specs = (SplitSpec("loss", k), SplitSpec("grad", k))
        split_loss, split_grad = _run(g, specs, feed)
        assert np.array_equal(dlogits, split_grad), k  # each row from the whole labels' factor: the same bits
        assert _close(loss, split_loss, scale, 2 * k), (k, float(loss), float(split_loss))
        out = split_pass(split_pass_name(specs)[6:])(g).graph
        chunk = out.node(f"loss#{k - 1}")
        assert (chunk.domain, chunk.op_type) == ("onnxplan", "SoftmaxCrossEntropyLossRows")
        assert (chunk.attrs["start"], chunk.attrs["stop"]) == ((k - 1) * R // k, R)
        assert chunk.inputs[1] == "labels" and out.node(f"grad#{k - 1}").inputs[1] == f"log_prob#{k - 1}"
        assert not any(n.op_type in ("PieceIn", "PieceOut") and n.attrs["slot"] == "log_prob" for n in out.nodes)
    assert _close(loss, np.float32(scale), scale, 16)  # the tolerance holds against float64 too
    wrong = np.float32(_reference(feed, reduction, R // 4))  # the first of 4 chunks' share left out
    assert not _close(loss, wrong, scale, 8)


def test_a_loss_off_the_page_moves_its_pieces_by_read_modify_write():
    """50257-wide rows (GPT-2's vocabulary): no K makes whole pages; pieces of at least
    OFF_PAGE_MIN bytes go through the slot anyway. The forward whole, the gradient split: log_prob
    read by range from its slot, dlogits written by range and read whole by the Neg after it."""
    g = _loss_graph(50257)
    feed = _feed(g, 29)
    loss, dlogits = _run(g, (), feed)
    for k in KS:
        assert why_not(g, g.node("grad"), k) == ""
        out = split_pass(split_pass_name([SplitSpec("grad", k)])[6:])(g).graph
        ranges = [n for n in out.nodes if n.op_type in ("PieceIn", "PieceOut") and int(n.attrs["offset"]) % PIECE_ALIGN]
        assert len(ranges) == 2 * (k - 1)  # every piece but the first starts off the page
        split_loss, split_grad = _run(g, (SplitSpec("grad", k),), feed)
        assert np.array_equal(dlogits, split_grad) and np.array_equal(loss, split_loss), k
        res = plan_step(g, PlanOptions(interleave=False, splits=(SplitSpec("grad", k),)))
        with pytest.raises(PlanError, match="not a multiple of 4096"):  # without the allowance: refused
            verify_pieces(res.plan.pieces, res.plan.order, {"log_prob": 64 * 50257 * 4, "dlogits": 64 * 50257 * 4},
                          PIECE_ALIGN)


def test_the_piece_runtime_keeps_a_neighbours_bytes_on_a_shared_page(tmp_path):
    g = _loss_graph(50257)
    out = split_pass(split_pass_name([SplitSpec("grad", 8)])[6:])(g).graph
    rt = PieceRuntime(out, tmp_path)
    try:
        size = rt.store.sizes["dlogits"]
        data = np.random.default_rng(3).integers(0, 255, size, dtype=np.uint8)
        cuts = [0, 5, PIECE_ALIGN + 3, 3 * PIECE_ALIGN, size // 3 + 1, size - 7, size]
        for a, b in reversed(list(zip(cuts, cuts[1:], strict=False))):  # written last to first
            rt.move("dlogits", data[a:b], a, write=True)
        whole = np.empty(size, np.uint8)
        rt.move("dlogits", whole, 0, write=False)
        assert np.array_equal(whole, data)
        part = np.empty(2 * PIECE_ALIGN + 11, np.uint8)
        rt.move("dlogits", part, PIECE_ALIGN - 5, write=False)
        assert np.array_equal(part, data[PIECE_ALIGN - 5:3 * PIECE_ALIGN + 6])
    finally:
        rt.close()


def test_a_plan_of_a_split_loss_survives_its_file_and_an_edited_one_is_refused():
    g = _loss_graph(1024)
    specs = (SplitSpec("loss", 4), SplitSpec("grad", 4))
    res = plan_step(g, PlanOptions(interleave=False, splits=specs))
    text = json.loads(res.plan.dumps())
    assert {s["node"]: (s["k"], s["op"]) for s in text["splits"]} == {
        "loss": (4, "onnxplan.SoftmaxCrossEntropyLossRows"), "grad": (4, "onnxplan.SoftmaxCrossEntropyLossGradRows")}
    assert adopt_plan(g, Plan.from_json(text)) is not None
    bad = json.loads(res.plan.dumps())
    bad["order"] = [n for n in bad["order"] if n != "loss#2.add0"]  # a chunk's share left out of the loss
    with pytest.raises(ModelError):
        adopt_plan(g, Plan.from_json(bad))
    bad = json.loads(res.plan.dumps())
    next(s for s in bad["splits"] if s["node"] == "loss")["k"] = 2
    with pytest.raises(ModelError, match="split"):
        adopt_plan(g, Plan.from_json(bad))


def test_a_large_range_off_the_page_passes_the_piece_checker_only_with_the_allowance():
    g = _loss_graph(50257)
    res = plan_step(g, PlanOptions(interleave=False, splits=(SplitSpec("grad", 4),)))
    slots = {"log_prob": 64 * 50257 * 4, "dlogits": 64 * 50257 * 4}
    verify_pieces(res.plan.pieces, res.plan.order, slots, PIECE_ALIGN, (), OFF_PAGE_MIN)
    short = [dataclasses.replace(p, nbytes=PIECE_ALIGN + 4, offset=p.offset + 4) if p.kind == "in" else p
             for p in res.plan.pieces]  # a small range off the page: refused even with the allowance
    with pytest.raises(PlanError, match="offset not a multiple"):
        verify_pieces(short, res.plan.order, slots, PIECE_ALIGN, (), OFF_PAGE_MIN)


@pytest.mark.parametrize("node, attrs, why", [
    ("loss", {"reduction": "none"}, "reduction 'none'"),
    ("grad", {"reduction": "none"}, "reduction 'none'"),
])
def test_refused_losses_say_why(node, attrs, why):
    g = _loss_graph(1024)
    g.node(node).attrs.update(attrs)
    assert why in why_not(g, g.node(node), 2)
    with pytest.raises(SplitRefused, match=why):
        split_pass(split_pass_name([SplitSpec(node, 2)])[6:])(g)
