"""passes/split_ops.py's table split (KIND_TABLE): Gather and GatherGrad over the table's rows in
2, 4 and 8 chunks (onnxplan.GatherRows / GatherGradRows), whole and split on seeded indices with
repeated and negative entries: the same bits (a copy; each dW row's additions in the same order);
an index out of range raises as the whole kernel's; the refusals in one line; the chunks' row
ranges checked by verify_plan (a mutated range or a dropped chunk refused, a plan file of the
split adopted and an edited one refused); the zoo transformer's embedding split with its update,
two steps the same bits as unsplit."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from onnxplan.errors import ModelError
from onnxplan.executor.prepare import adopt_plan
from onnxplan.executor.runner import Executor, KernelError
from onnxplan.ir import ValueClass
from onnxplan.passes.split import SplitRefused, SplitSpec, split_pass, split_pass_name, why_not
from onnxplan.passes.split_ops import table_rows
from onnxplan.plan import Plan
from onnxplan.planning import PlanOptions, plan_step, verify_plan
from onnxplan.verify import PlanError
from tests.graphs import GraphBuilder

MS = "com.microsoft"
KS = (2, 4, 8)


def _gather_graph(rows: int = 1000, width: int = 48, batch: tuple[int, int] = (4, 64)):
    """W [rows, width] -> Gather by idx -> Neg -> out; GatherGrad(shape, idx, dy) -> dW -> Neg."""
    b = GraphBuilder(f"gather-{rows}")
    b.value("W", (rows, width), ValueClass.INPUT)
    b.value("idx", batch, ValueClass.INPUT, dtype="int64")
    b.value("dy", (*batch, width), ValueClass.INPUT)
    b.const("shape", np.array([rows, width], np.int64))
    b.node("Gather", ["W", "idx"], ["emb"], [(*batch, width)], name="gather", axis=0)
    b.node("GatherGrad", ["shape", "idx", "dy"], ["dW"], [(rows, width)], domain=MS, phase="backward",
           name="grad", axis=0)
    for o in ("emb", "dW"):
        b.node("Neg", [o], [f"{o}.out"], name=f"after.{o}", phase="backward")
        b.g.outputs.append(f"{o}.out")
    b.g.loss = "emb.out"
    return b.g


def _feed(g, seed: int, bad: int | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows, width = g.values["W"].spec.shape
    shape = g.values["idx"].spec.shape
    idx = rng.integers(-rows, rows, shape)  # negative entries: i + rows
    idx.reshape(-1)[: idx.size // 4] = rng.integers(0, 3, idx.size // 4)  # many repeats of a few rows
    if bad is not None:
        idx.reshape(-1)[-1] = bad
    return {"W": rng.standard_normal((rows, width)).astype(np.float32), "idx": idx.astype(np.int64),
            "dy": rng.standard_normal((*shape, width)).astype(np.float32)}


def _run(g, specs: tuple[SplitSpec, ...], feed: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    res = plan_step(g, PlanOptions(interleave=False, splits=specs))
    ex = Executor(res.graph, res.plan)
    try:
        ex.load_state({})
        ex.step(feed)
        return -ex.binding.arrays["emb.out"], -ex.binding.arrays["dW.out"]  # through a Neg: exact
    finally:
        if ex.pieces is not None:
            ex.pieces.close()


@pytest.mark.parametrize("rows, width", [(1000, 48), (1001, 64)])
def test_gather_and_its_gradient_split_over_the_table_rows_give_the_same_bits(rows, width):
    g = _gather_graph(rows, width)
    feed = _feed(g, 31)
    emb, dw = _run(g, (), feed)
    assert np.array_equal(emb, feed["W"][feed["idx"]])
    for k in KS:
        split_emb, split_dw = _run(g, (SplitSpec("gather", k), SplitSpec("grad", k)), feed)
        assert np.array_equal(emb, split_emb), k
        assert np.array_equal(dw, split_dw), k  # each row's additions in the order of the indices
        out = split_pass(split_pass_name([SplitSpec("gather", k), SplitSpec("grad", k)])[6:])(g).graph
        per = table_rows(g, g.node("gather"), k)
        ranges = [(out.node(f"gather#{j}").attrs["start"], out.node(f"gather#{j}").attrs["stop"]) for j in range(k)]
        assert ranges == [(j * per, min((j + 1) * per, rows)) for j in range(k)] and ranges[-1][1] == rows
        assert (per * width * 4) % 4096 == 0  # every piece but the last a whole number of pages
        assert out.node("gather#1").inputs[2] == "emb#acc0"  # the output so far, written in place
        assert [out.node(f"grad#{j}").op_type for j in range(k)] == ["GatherGradRows"] * k


def test_an_index_out_of_range_raises_in_a_chunk_as_in_the_whole_kernel():
    g = _gather_graph()
    for bad in (1000, -1001):
        feed = _feed(g, 5, bad)
        for specs in ((), (SplitSpec("gather", 4),), (SplitSpec("grad", 4),)):
            with pytest.raises(KernelError, match=r"IndexError: \S+ index -?\d+ out of range \[-1000, 999\]"):
                _run(g, specs, feed)


def test_the_chunk_kernels_on_no_indices_and_on_an_output_not_in_place():
    """No indices: GatherRows writes nothing, GatherGradRows zeros; an output so far that is not
    the output's memory is copied first, the chunk's positions then written."""
    from types import SimpleNamespace

    from onnxplan.kernels.split_chunks import gather_grad_rows, gather_rows

    attrs = {"start": 4, "stop": 8, "rows": 10}
    ctx = SimpleNamespace(xp=np, attrs=attrs, node=SimpleNamespace(name="g#1"))
    piece = np.arange(4 * 3, dtype=np.float32).reshape(4, 3)
    out = np.full((0, 3), 7, np.float32)
    gather_rows(ctx, [piece, np.zeros(0, np.int64)], [out])
    dw = np.ones((4, 3), np.float32)
    gather_grad_rows(ctx, [None, np.zeros(0, np.int64), np.zeros((0, 3), np.float32)], [dw])
    assert not dw.any()
    idx = np.array([5, -3, 0, 9], np.int64)  # rows 5 and 7 are chunk 1's (-3 is row 7)
    so_far = np.full((4, 3), -1, np.float32)
    out = np.zeros((4, 3), np.float32)
    gather_rows(ctx, [piece, idx, so_far], [out])
    assert np.array_equal(out, np.stack([piece[1], piece[3], so_far[2], so_far[3]]))


@pytest.mark.parametrize("node, change, k, why", [
    ("gather", {"axis": 1}, 2, "over axis 1"),
    ("grad", {"axis": 1}, 2, "over axis 1"),
    ("gather", {}, 16, "leaves a chunk no rows"),  # 500 rows of 48 floats: pages of 64 rows, 15 x 64 >= 500
])
def test_refused_table_splits_say_why(node, change, k, why):
    g = _gather_graph(500)
    g.node(node).attrs.update(change)
    assert why in why_not(g, g.node(node), k)
    with pytest.raises(SplitRefused, match=why):
        split_pass(split_pass_name([SplitSpec(node, k)])[6:])(g)


def test_a_persistent_table_splits_only_with_an_update_that_homes_it():
    g = _gather_graph()
    g.values["W"] = dataclasses.replace(g.values["W"], vclass=ValueClass.PARAMETER)
    g.inputs.remove("W")
    assert "persistent and no optimizer update" in why_not(g, g.node("gather"), 2)


def test_the_checker_refuses_a_bad_row_range_or_a_dropped_chunk_and_a_plan_file_survives():
    g = _gather_graph()
    specs = (SplitSpec("gather", 4), SplitSpec("grad", 4))
    res = plan_step(g, PlanOptions(interleave=False, splits=specs))
    verify_plan(res.graph, res.plan)
    text = json.loads(res.plan.dumps())
    assert {s["node"]: s["op"] for s in text["splits"]} == {"gather": "onnxplan.GatherRows",
                                                           "grad": "onnxplan.GatherGradRows"}
    assert adopt_plan(g, Plan.from_json(text)) is not None
    for node, attr, delta in (("gather#2", "start", 8), ("grad#1", "stop", -64), ("gather#3", "stop", -1)):
        bad = res.graph.copy()
        chunk = bad.node(node)
        bad.nodes[bad.nodes.index(chunk)] = dataclasses.replace(chunk, attrs={**chunk.attrs,
                                                                              attr: chunk.attrs[attr] + delta})
        with pytest.raises(PlanError, match="rows"):
            verify_plan(bad, res.plan)
    dropped = json.loads(res.plan.dumps())
    dropped["order"] = [n for n in dropped["order"] if n != "gather#1"]  # a chunk's rows never written
    with pytest.raises(ModelError):
        adopt_plan(g, Plan.from_json(dropped))
    moved = json.loads(res.plan.dumps())
    piece = next(p for p in moved["pieces"] if p["node"] == "piece-in:W:1")
    piece["offset"] += 4096  # a chunk reading the wrong rows of the table
    with pytest.raises(ModelError, match="piece"):
        adopt_plan(g, Plan.from_json(moved))


def test_a_parameter_table_splits_with_its_update_which_the_budget_layer_adds():
    """tok_emb.weight is a parameter: its Gather splits (why_not) because its AdamW update does;
    the pass refuses the Gather alone, and the budget layer adds the update to a chosen Gather."""
    from onnxplan.budget.attempt import step_before_inplace
    from onnxplan.budget.split import _with_table_updates
    from onnxplan.ir.load import read_step
    from tests.zoo_small import small_artifacts

    g = step_before_inplace(read_step(small_artifacts("transformer")), PlanOptions())
    assert g.values["tok_emb.weight"].persistent and why_not(g, g.node("tok_emb"), 2) == ""
    with pytest.raises(SplitRefused, match="must split in the same pass"):
        split_pass(split_pass_name([SplitSpec("tok_emb", 2)])[6:])(g)
    chosen = {"tok_emb": SplitSpec("tok_emb", 4)}
    _with_table_updates(g, chosen)
    update = next(n for n in g.nodes if n.op_type == "AdamWUpdate" and "tok_emb.weight" in n.inputs)
    assert chosen == {"tok_emb": SplitSpec("tok_emb", 4), update.name: SplitSpec(update.name, 2)}
    split_pass(split_pass_name(list(chosen.values()))[6:])(g)  # the pair splits


@pytest.mark.slow
def test_the_transformers_embedding_split_with_its_update_trains_the_same_bits():
    """The zoo transformer's tok_emb (1000 x 128, a parameter): its Gather, GatherGrad and AdamW
    update in 2 and 4 chunks (the table read by range from its home, written back after the
    Gather's reads): two steps' losses and parameters bit for bit those of the unsplit plan."""
    from onnxplan.executor.runner import run_plan
    from tests.zoo_small import small_artifacts

    folder = small_artifacts("transformer")
    base = run_plan(folder, PlanOptions(), steps=2, warmup=0)
    update = next(n for n in base.plan.order if n.endswith("/tok_emb.weight") and "Optimizer" in n)
    for k in (2, 4):
        specs = (SplitSpec("tok_emb", k), SplitSpec("tok_emb_Grad/GatherGrad_1", k), SplitSpec(update, k))
        res = run_plan(folder, PlanOptions(splits=specs), steps=2, warmup=0)
        assert {s.op for s in res.plan.splits} >= {"onnxplan.GatherRows", "onnxplan.GatherGradRows"}
        assert res.losses == base.losses
        assert all(np.array_equal(base.params[p], res.params[p]) for p in base.params)
