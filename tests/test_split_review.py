"""Defects a review found in node splitting (issue 28), each pinned: a split node reading homed
state whole, a second layout shared by two consumers, a read of a homed range after its
write-back, a short range inside a slot."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from onnxplan.executor.runner import Executor
from onnxplan.ir import ValueClass
from onnxplan.passes.split import PIECE_ALIGN, SplitSpec, homed_slots, slot_bytes
from onnxplan.planning import PlanOptions, plan_step, verify_plan
from onnxplan.swap.store import PAGE, SwapStore
from onnxplan.verify import PlanError, verify_pieces
from tests.graphs import GraphBuilder

COLS = 2048


def _homed_bcast(reader: str = ""):
    """Mul(x[8, COLS], P[COLS]) -> Relu -> out; SGDUpdate(P); with `reader` "before" / "after",
    a second reader of P whole (of the old bytes) before / after the update in the node list."""
    b = GraphBuilder("homed-bcast")
    b.value("x", (8, COLS), ValueClass.INPUT)
    b.value("gP", (COLS,), ValueClass.INPUT)
    b.value("P", (COLS,), ValueClass.PARAMETER, trainable=True)
    b.const("lr", np.array([0.5], np.float32))
    if reader == "before":
        b.node("Add", ["P", "gP"], ["late"], [(COLS,)], name="late")
    b.node("Mul", ["x", "P"], ["z"], [(8, COLS)], name="mul")
    b.node("Relu", ["z"], ["out"], [(8, COLS)], name="after")
    b.node("SGDUpdate", ["lr", "P", "gP"], ["P_new"], [(COLS,)], domain="onnxplan", phase="optimizer",
           vclass=ValueClass.PARAMETER, name="upd")
    if reader == "after":  # not a valid order unsplit (the update overwrites P): split, P's home keeps it
        b.node("Add", ["P", "gP"], ["late"], [(COLS,)], name="late")
    b.g.outputs += ["out", "P_new"] + (["late"] if reader else [])
    b.g.loss = "out"
    return b.g


def _step(g, splits: tuple[SplitSpec, ...], outs: tuple[str, ...]):
    rng = np.random.default_rng(0)
    feed = {"x": rng.standard_normal((8, COLS)).astype(np.float32),
            "gP": rng.standard_normal(COLS).astype(np.float32)}
    res = plan_step(g, PlanOptions(interleave=False, splits=splits))
    ex = Executor(res.graph, res.plan)
    ex.load_state({"P": rng.standard_normal(COLS).astype(np.float32)})
    ex.step(feed)
    return [ex.binding.arrays[o].copy() for o in outs], ex.parameters()["P"]


@pytest.mark.parametrize("reader", ["", "after"])
def test_a_split_node_reads_homed_state_whole_before_its_write_back(reader):
    """A split Mul broadcasting a parameter whose update is split: P is read whole from its home
    (the old bytes) before any range of it goes home, also by a reader placed after the update;
    same bits as unsplit."""
    outs = ("out", "late") if reader else ("out",)
    want, p_want = _step(_homed_bcast("before" if reader else ""), (), outs)
    got, p_got = _step(_homed_bcast(reader), (SplitSpec("mul", 2), SplitSpec("upd", 2)), outs)
    assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True)) and np.array_equal(p_want, p_got)


def test_the_plan_checker_refuses_a_value_nothing_makes():
    res = plan_step(_homed_bcast(), PlanOptions(interleave=False, splits=(SplitSpec("mul", 2), SplitSpec("upd", 2))))
    verify_plan(res.graph, res.plan)  # as made: passes
    g = res.graph.copy()
    g.nodes = [n for n in g.nodes if n.name != "piece-in:P"]
    with pytest.raises(PlanError, match="neither persistent"):
        verify_plan(g, res.plan)


def test_two_consumers_share_a_second_layout():
    """x made in 2 pieces, read by two split consumers in 4: one second layout, read once."""
    b = GraphBuilder("dup")
    for n in ("a", "p", "q"):
        b.value(n, (64, 1024), ValueClass.INPUT)
    b.node("Relu", ["a"], ["x"], name="r")
    b.node("Add", ["x", "p"], ["y"], name="add")
    b.node("Mul", ["x", "q"], ["z"], name="mul")
    b.node("Add", ["y", "z"], ["out"], name="sum")
    b.g.outputs.append("out")
    b.g.loss = "out"
    res = plan_step(b.g, PlanOptions(interleave=False, splits=(SplitSpec("r", 2), SplitSpec("add", 4),
                                                                  SplitSpec("mul", 4))))
    reads = [n for n in res.plan.order if n.startswith("piece-in:x:")]
    assert sorted(reads) == [f"piece-in:x:4.{j}" for j in range(4)]


def _homed_plan():
    from onnxplan.ir.load import read_step
    from tests.zoo_small import small_artifacts

    g = read_step(small_artifacts("mlp"))
    node = next(n for n in plan_step(g, PlanOptions()).plan.order if n.endswith("/fc1.weight") and "Optimizer" in n)
    return plan_step(g, PlanOptions(splits=(SplitSpec(node, 2),)))


def test_the_piece_checker_refuses_a_homed_read_after_its_write_back():
    res = _homed_plan()
    homes, slots, order = homed_slots(res.graph), slot_bytes(res.graph), list(res.plan.order)
    verify_pieces(res.plan.pieces, order, slots, PIECE_ALIGN, homes)  # as made: passes
    back = next(p.node for p in res.plan.pieces if p.slot == "fc1.weight" and p.kind == "out")
    read = next(p.node for p in res.plan.pieces if p.slot == "fc1.weight" and p.kind == "in")
    order.remove(back)
    order.insert(order.index(read), back)  # the write-back now runs before a read of the old bytes
    with pytest.raises(PlanError, match="already written back"):
        verify_pieces(res.plan.pieces, order, slots, PIECE_ALIGN, homes)


def test_a_short_range_inside_a_slot_is_refused(tmp_path):
    res = _homed_plan()
    slots = slot_bytes(res.graph)
    pieces = list(res.plan.pieces)
    first = next(p for p in pieces if p.kind == "out" and p.offset == 0 and p.nbytes < slots[p.slot])
    short = dataclasses.replace(first, nbytes=first.nbytes - 4)
    with pytest.raises(PlanError, match="length not a multiple"):
        verify_pieces([short if p == first else p for p in pieces], res.plan.order, slots, PIECE_ALIGN,
                      homed_slots(res.graph))
    store = SwapStore({"a": 3 * PAGE + 8}, tmp_path)
    try:
        store.write("a", np.ones(3 * PAGE + 8 - 2 * PAGE, np.uint8), offset=2 * PAGE)  # ends the slot: fine
        with pytest.raises(ValueError, match="page-aligned"):
            store.write("a", np.ones(PAGE - 4, np.uint8), offset=0)  # would overwrite the next page's start
    finally:
        store.close()


def test_the_budget_search_keeps_its_best_plan_when_a_split_is_refused(monkeypatch):
    """A split the pass refuses (SplitRefused, exit 2) inside the budget search ends the rounds
    with the best plan so far: a budget request never exits 2 for a split it chose itself."""
    from onnxplan import api
    from onnxplan.budget import MemoryRequest, plan_for_budget
    from onnxplan.budget import split as split_mod
    from onnxplan.passes.split import SplitRefused

    calls = []

    def refuse(graph, opts):
        calls.append(opts.splits)
        raise SplitRefused("split: refused")

    monkeypatch.setattr(split_mod, "attempt", refuse)
    step = api.load("mlp", batch=64)
    res = plan_for_budget(step.graph, PlanOptions(), MemoryRequest(budget=2 << 20))
    assert calls and not res.plan.splits and res.plan.peak_bytes > 2 << 20


def test_no_node_is_split_in_more_than_max_k_chunks():
    from onnxplan.budget.split import MAX_K, _smallest_k

    b = GraphBuilder("rows")
    b.value("a", (1024, 1024), ValueClass.INPUT)
    b.node("Relu", ["a"], ["x"], name="r")
    b.g.outputs.append("x")
    node = b.g.nodes[0]
    assert _smallest_k(b.g, node, 8 << 20, 1, 1) == MAX_K  # nothing fits 1 B: the cap, not 1024 chunks
    assert _smallest_k(b.g, node, 8 << 20, 3 << 20, 1) == 4
