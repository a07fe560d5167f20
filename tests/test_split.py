"""passes/split.py: a node split in chunks over pieces computes the same bits; the pieces are
buffers of their own, moved by byte range through the host store; the checker refuses piece
ranges that overlap or are missing; the plan file records the splits and adopt_plan holds them."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from onnxplan.errors import ModelError
from onnxplan.executor.prepare import adopt_plan
from onnxplan.executor.runner import Executor
from onnxplan.ir import ValueClass
from onnxplan.passes.split import (
    PIECE_ALIGN,
    SPLITTABLE_OPS,
    UPDATE_OPS,
    SplitRefused,
    SplitSpec,
    piece_ranges,
    slot_bytes,
    split_pass,
    split_pass_name,
    why_not,
)
from onnxplan.plan import Plan, PlannedPiece
from onnxplan.planning import PlanOptions, plan_step
from onnxplan.verify import PlanError, verify_pieces
from tests.graphs import GraphBuilder

MS = "com.microsoft"
ROWS, COLS = 8, 4096  # a piece of 8 / K rows of 4096 values (float32 or bool) is a whole number of store pages
# inputs per op: "x" sliced, "y" sliced, "b" a broadcast row, "c" a bool condition
ARGS = {"Where": ["c", "x", "y"], "BiasGelu": ["x", "b"], "BiasGeluGrad_dX": ["x", "y", "b"],
        "BiasFastGeluGrad_dX": ["x", "y", "b"]}
UNARY_MS = {"Gelu", "FastGelu", "QuickGelu"}
ATTRS = {"LeakyRelu": {"alpha": 0.1}, "Elu": {"alpha": 0.7}, "LeakyReluGrad": {"alpha": 0.1},
         "Softmax": {"axis": -1}, "LogSoftmax": {"axis": 1}, "SoftmaxGrad_13": {"axis": -1},
         "LogSoftmaxGrad_13": {"axis": -1}, "SoftmaxGrad": {"axis": 1}, "LogSoftmaxGrad": {"axis": 1}}


def _args(domain: str, op: str) -> list[str]:
    if op in ARGS:
        return ARGS[op]
    from onnxplan.passes.split_ops import _BINARY, _UNARY

    if (domain == "" and op in _UNARY) or op in UNARY_MS:
        return ["x"]
    return ["x", "y"] if domain == MS or op in _BINARY else ["x"]


def _op_graph(domain: str, op: str, args: list[str]):
    """x (, y, c: [ROWS, COLS], b: [COLS]) -> op -> z -> Scale -> loss-free step output."""
    b = GraphBuilder(f"split-{op}")
    shapes = {"x": (ROWS, COLS), "y": (ROWS, COLS), "b": (COLS,), "c": (ROWS, COLS)}
    for a in args:
        b.value(a, shapes[a], ValueClass.INPUT, "bool" if a == "c" else "float32")
    b.node(op, args, ["z"], [(ROWS, COLS)], domain=domain, name="target", **ATTRS.get(op, {}))
    b.node("Relu", ["z"], ["out"], [(ROWS, COLS)], name="after")
    b.g.outputs.append("out")
    b.g.loss = "out"
    return b.g


def _feed(args: list[str], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for a in args:
        if a == "c":
            out[a] = rng.random((ROWS, COLS)) < 0.5
        elif a == "b":
            out[a] = rng.standard_normal(COLS).astype(np.float32)
        else:
            x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
            out[a] = np.abs(x) + 0.5 if a == "y" else x  # Div, Pow, Log, Sqrt: a positive y / x is fine
    return out


def _run(graph, opts: PlanOptions, feed: dict[str, np.ndarray]) -> np.ndarray:
    res = plan_step(graph, dataclasses.replace(opts, interleave=False))
    ex = Executor(res.graph, res.plan)
    ex.load_state({})
    ex.step(feed)
    z = ex.binding.arrays["out"].copy()
    if ex.pieces is not None:
        ex.pieces.close()
    return z


def _ops_with_kernels() -> list[tuple[str, str]]:
    from onnxplan.kernels.registry import find_decl

    return sorted(k for k in SPLITTABLE_OPS - UPDATE_OPS if find_decl(k[0], k[1]) is not None)


@pytest.mark.parametrize("key", _ops_with_kernels(), ids=lambda k: k[1])
def test_a_split_op_computes_the_same_bits(key):
    """Every splittable op, whole and in 2, 4 and 8 chunks on seeded random inputs: the same bits."""
    domain, op = key
    args = _args(domain, op)
    graph = _op_graph(domain, op, args)
    feed = _feed(args, seed=hash(op) % 1000)
    whole = _run(graph, PlanOptions(), feed)
    for k in (2, 4, 8):
        assert why_not(graph, graph.nodes[0], k) == ""
        split = _run(graph, PlanOptions(splits=(SplitSpec("target", k),)), feed)
        assert np.array_equal(whole, split, equal_nan=True), (op, k)


def _gelu_chain():
    """x -> Add(bias) -> Gelu -> Mul(x) -> out: a split producer feeding a split consumer."""
    b = GraphBuilder("chain")
    b.value("x", (ROWS, COLS), ValueClass.INPUT)
    b.value("b", (COLS,), ValueClass.INPUT)
    b.node("Add", ["x", "b"], ["h"], name="add")
    b.node("Gelu", ["h"], ["g"], domain=MS, name="gelu")
    b.node("Mul", ["g", "x"], ["m"], name="mul")
    b.node("Relu", ["m"], ["out"], name="after")
    b.g.outputs.append("out")
    b.g.loss = "out"
    return b.g


def test_a_split_producer_hands_its_pieces_to_a_split_consumer():
    g = _gelu_chain()
    specs = (SplitSpec("add", 4), SplitSpec("gelu", 4), SplitSpec("mul", 2))
    out = split_pass(split_pass_name(specs)[len("split:"):])(g).graph
    names = {n.name: n for n in out.nodes}
    assert names["gelu#1"].inputs == ["h#1"]  # the producer's piece, no transfer
    assert "h" not in out.producers()  # h never exists whole
    # mul in 2 chunks reads g in halves: g's four pieces go to its slot, two ranges come back
    assert [n for n in names if n.startswith("piece-out:g:")] == [f"piece-out:g:{j}" for j in range(4)]
    assert names["piece-in:g:2.1"].attrs["offset"] == ROWS // 2 * COLS * 4
    assert "out" not in {p.slot for p in piece_ranges(out)}  # made whole by an unsplit node
    feed = _feed(["x", "b"], 3)
    assert np.array_equal(_run(g, PlanOptions(), feed), _run(g, PlanOptions(splits=specs), feed))


def test_split_lowers_the_largest_working_set():
    g = _gelu_chain()
    plain = plan_step(g, PlanOptions(interleave=False))
    split = plan_step(g, PlanOptions(interleave=False, splits=(SplitSpec("add", 4), SplitSpec("gelu", 4))))
    widest = max(n.nbytes for n in plain.graph.values.values())
    chunk = max(b.bytes for b in split.plan.buffers if "#" in b.name)
    assert chunk * 4 == widest
    assert split.plan.splits[0].k == 4 and {s.node for s in split.plan.splits} == {"add", "gelu"}


@pytest.mark.parametrize("why, spec", [
    ("is not split", SplitSpec("after2", 2)),
    ("does not divide", SplitSpec("gelu", 3)),
    ("not a multiple", SplitSpec("gelu", 8)),
    ("no such node", SplitSpec("nothing", 2)),
    ("across axis 0", SplitSpec("softmax0", 2)),
])
def test_refused_splits_say_why(why, spec):
    g = _gelu_chain()
    g.nodes.append(dataclasses.replace(g.nodes[-1], name="after2", op_type="ReduceMax", outputs=["sm"]))
    g.values["sm"] = dataclasses.replace(g.values["out"], name="sm")
    g.nodes.append(dataclasses.replace(g.nodes[-1], name="softmax0", op_type="Softmax", outputs=["sm0"],
                                       attrs={"axis": 0}))
    g.values["sm0"] = dataclasses.replace(g.values["out"], name="sm0")
    if spec.node == "gelu" and spec.k == 8:  # 1 row of 256 float32: under a page
        g = _narrow(g)
    with pytest.raises(SplitRefused, match=why):
        split_pass(split_pass_name([spec])[len("split:"):])(g)


def _narrow(g):
    for v in g.values.values():
        if v.spec is not None and v.spec.shape[-1:] == (COLS,):
            v.spec = dataclasses.replace(v.spec, shape=(*v.spec.shape[:-1], 256))
    return g


def test_why_not_names_persistent_inputs():
    b = GraphBuilder("p")
    b.value("w", (ROWS, COLS), ValueClass.PARAMETER, trainable=True)
    b.value("x", (ROWS, COLS), ValueClass.INPUT)
    n = b.node("Mul", ["x", "w"], ["z"], name="mul")
    assert "persistent" in why_not(b.g, n, 2)


def _split_plan():
    g = _gelu_chain()
    res = plan_step(g, PlanOptions(interleave=False, splits=(SplitSpec("add", 4), SplitSpec("gelu", 2))))
    return g, res


def test_the_piece_checker_passes_a_sound_plan_and_refuses_overlap_and_gaps():
    g, res = _split_plan()
    slots = slot_bytes(res.graph)
    pieces = list(res.plan.pieces)
    verify_pieces(pieces, res.plan.order, slots, PIECE_ALIGN)  # sound: passes
    outs = [p for p in pieces if p.kind == "out" and p.nbytes < slots[p.slot]]
    assert outs
    moved = dataclasses.replace(outs[1], offset=outs[0].offset)  # two writes of one range
    with pytest.raises(PlanError, match="overlaps"):
        verify_pieces([moved if p == outs[1] else p for p in pieces], res.plan.order, slots, PIECE_ALIGN)
    with pytest.raises(PlanError, match="missing"):
        verify_pieces([p for p in pieces if p != outs[1]], res.plan.order, slots, PIECE_ALIGN)
    with pytest.raises(PlanError, match="multiple"):
        verify_pieces([dataclasses.replace(outs[0], offset=outs[0].offset + 4) if p == outs[0] else p
                       for p in pieces], res.plan.order, slots, PIECE_ALIGN)


def test_the_plan_file_records_splits_and_adopt_refuses_edited_ones():
    g, res = _split_plan()
    text = json.loads(res.plan.dumps())
    assert [s["node"] for s in text["splits"]] == ["add", "gelu"] and text["pieces"]
    adopted = Plan.from_json(text)
    assert adopt_plan(g, adopted) is not None  # as written: adopted
    for edit in ("overlap", "missing", "splits"):
        bad = json.loads(res.plan.dumps())
        if edit == "splits":
            bad["splits"][0]["k"] = 2
        else:
            outs = [k for k, p in enumerate(bad["pieces"]) if p["kind"] == "out"]
            if edit == "overlap":
                bad["pieces"][outs[1]]["offset"] = bad["pieces"][outs[0]]["offset"]
            else:
                del bad["pieces"][outs[1]]
        with pytest.raises(ModelError, match="split|piece"):
            adopt_plan(g, Plan.from_json(bad))


def test_a_planned_piece_is_a_plan_record():
    p = PlannedPiece("piece-in:x:0", "in", "x", 0, 4096)
    assert Plan.from_json({**json.loads(_split_plan()[1].plan.dumps()), "pieces": [dataclasses.asdict(p)]}).pieces == (p,)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_a_split_optimizer_update_changes_no_bit(optimizer):
    """The small mlp's first-layer update (256 x 784) in 4 chunks, its parameter and moments homed
    in the host store: two steps give the same losses and parameters, bit for bit."""
    from onnxplan.executor.runner import run_plan
    from tests.zoo_small import small_artifacts

    folder = small_artifacts("mlp", optimizer)
    base = run_plan(folder, PlanOptions(), steps=2, warmup=0)
    node = next(n for n in base.plan.order if n.endswith("/fc1.weight") and "Optimizer" in n)
    res = run_plan(folder, PlanOptions(splits=(SplitSpec(node, 4),)), steps=2, warmup=0)
    assert res.plan.splits[0].op in ("onnxplan.AdamWUpdate", "onnxplan.SGDUpdate")
    assert any(p.slot == "fc1.weight" and p.kind == "out" for p in res.plan.pieces)
    assert res.losses == base.losses
    assert all(np.array_equal(base.params[p], res.params[p]) for p in base.params)


def test_the_piece_checker_holds_homed_state_to_a_whole_write_back():
    """A split update's state slot is full at the step's start (its reads need no write before
    them) and must be written back whole: a missing write-back is refused, the plan as made passes."""
    from onnxplan.ir.load import read_step
    from onnxplan.passes.split import homed_slots
    from tests.zoo_small import small_artifacts

    g = read_step(small_artifacts("mlp"))
    base = plan_step(g, PlanOptions())
    node = next(n for n in base.plan.order if n.endswith("/fc1.weight") and "Optimizer" in n)
    res = plan_step(g, PlanOptions(splits=(SplitSpec(node, 2),)))
    homes, slots = homed_slots(res.graph), slot_bytes(res.graph)
    assert {"fc1.weight", "fc1.weight.exp_avg", "fc1.weight.exp_avg_sq"} <= homes
    verify_pieces(res.plan.pieces, res.plan.order, slots, PIECE_ALIGN, homes)
    back = next(p for p in res.plan.pieces if p.slot == "fc1.weight" and p.kind == "out")
    with pytest.raises(PlanError, match="not written back"):
        verify_pieces([p for p in res.plan.pieces if p != back], res.plan.order, slots, PIECE_ALIGN, homes)
    with pytest.raises(PlanError, match="missing"):  # without its home, a read of the slot has nothing to read
        verify_pieces(res.plan.pieces, res.plan.order, slots, PIECE_ALIGN, homes - {"fc1.weight"})


def test_a_split_plan_on_another_array_module_is_refused_in_one_line():
    from onnxplan.errors import UsageError

    g, res = _split_plan()
    with pytest.raises(UsageError, match="runs on the CPU only"):
        Executor(res.graph, res.plan, xp=object())


def test_an_update_whose_rows_do_not_split_splits_over_its_flattened_state():
    """mlp's fc1 update (784 x 256) in 3 chunks: 784 rows do not divide by 3, so its state is cut
    flat in pieces of whole pages, the last the rest (ending the slot): the same bits."""
    from onnxplan.executor.runner import run_plan
    from tests.zoo_small import small_artifacts

    folder = small_artifacts("mlp")
    base = run_plan(folder, PlanOptions(), steps=2, warmup=0)
    node = next(n for n in base.plan.order if n.endswith("/fc1.weight") and "Optimizer" in n)
    res = run_plan(folder, PlanOptions(splits=(SplitSpec(node, 3),)), steps=2, warmup=0)
    backs = sorted((p.offset, p.nbytes) for p in res.plan.pieces if p.slot == "fc1.weight" and p.kind == "out")
    per = 66 * 1024  # ceil(784 * 256 / 3) = 66902 elements, up to whole pages of 1024 float32
    assert backs == [(0, per * 4), (per * 4, per * 4), (2 * per * 4, 784 * 256 * 4 - 2 * per * 4)]
    assert res.losses == base.losses
    assert all(np.array_equal(base.params[p], res.params[p]) for p in base.params)


def test_a_flat_cut_rescues_only_a_cut_not_a_refused_node():
    """An update with control dependencies stays refused in any K, flat or not."""
    from onnxplan.budget.attempt import step_before_inplace
    from onnxplan.ir.load import read_step
    from onnxplan.passes.split_ops import flat_elems
    from tests.zoo_small import small_artifacts

    g = step_before_inplace(read_step(small_artifacts("mlp")), PlanOptions())  # the step the split pass sees
    n = next(n for n in g.nodes if n.op_type == "AdamWUpdate" and n.name.endswith("/fc1.weight"))
    n.after = []
    assert flat_elems(g, n, 3) and why_not(g, n, 3) == ""
    n.after = ["x"]
    assert flat_elems(g, n, 3) == 0 and "control dependencies" in why_not(g, n, 3)
