"""SplitToSequence read by SequenceAt is rewritten to Split (forward/sequences.py, issue 26): ONNX's
own SplitToSequence conformance cases, each sequence element read by a SequenceAt, give the case's
expected elements through the rewritten model; sequences read otherwise stay; GPT-2 exported by
the dynamo exporter with optimize=False plans and verifies."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from typer.testing import CliRunner

from onnxplan.cli.app import app
from onnxplan.forward.sequences import split_sequences

runner = CliRunner()


def _cases() -> list:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [c for c in load_model_tests(kind="node") if c.name.startswith("test_split_to_sequence")]


CASES = _cases()


def test_the_conformance_cases_are_there():
    assert {c.name for c in CASES} == {"test_split_to_sequence_1", "test_split_to_sequence_2",
                                       "test_split_to_sequence_nokeepdims"}


def _read_by_sequence_at(case, feeds: dict, count: int, negative: bool) -> onnx.ModelProto:
    """The case's model with its split sizes a constant (as an export has them) and its sequence
    read element by element (positions k, or k - count)."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    graph = model.graph
    sizes = [vi for vi in graph.input if vi.name != graph.node[0].input[0]]
    for vi in sizes:
        graph.input.remove(vi)
        graph.initializer.append(numpy_helper.from_array(feeds.pop(vi.name), vi.name))
    seq = graph.node[0].output[0]
    del graph.output[:]
    for k in range(count):
        position = k - count if negative else k
        graph.node.append(helper.make_node("Constant", [], [f"at{k}"], value=numpy_helper.from_array(
            np.asarray(position, np.int64))))
        graph.node.append(helper.make_node("SequenceAt", [seq, f"at{k}"], [f"y{k}"]))
        graph.output.append(helper.make_value_info(f"y{k}", onnx.TypeProto()))
    return model


@pytest.mark.parametrize("negative", [False, True], ids=["positions", "negative-positions"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_conformance(case, negative):
    for inputs, expected in case.data_sets:
        feeds = {vi.name: np.asarray(numpy_helper.to_array(a) if isinstance(a, TensorProto) else a)
                 for vi, a in zip(case.model.graph.input, inputs)}
        want = [numpy_helper.to_array(t) if isinstance(t, TensorProto) else np.asarray(t) for t in expected[0]]
        model = _read_by_sequence_at(case, feeds, len(want), negative)
        shapes = {name: tuple(v.shape) for name, v in feeds.items()}
        notes: list[str] = []
        split_sequences(model, shapes, notes)
        assert notes == ["rewrote 1 SplitToSequence node(s) read by SequenceAt to Split"]
        assert {n.op_type for n in model.graph.node} & {"SplitToSequence", "SequenceAt"} == set()
        got = ReferenceEvaluator(model).run(None, feeds)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)


def _split_model(read_by: str) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])
    nodes = [helper.make_node("SplitToSequence", ["x", "s"], ["seq"], axis=1)]
    if read_by == "output":
        out = helper.make_value_info("seq", onnx.TypeProto())
    else:
        nodes.append(helper.make_node("SequenceAt", ["seq", "i"], ["y"]))
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inputs = [x] + ([helper.make_tensor_value_info("i", TensorProto.INT64, [])] if read_by == "input" else [])
    inits = [numpy_helper.from_array(np.asarray(4, np.int64), "s")]
    if read_by == "constant":
        inits.append(numpy_helper.from_array(np.asarray(-1, np.int64), "i"))
    return helper.make_model(helper.make_graph(nodes, "g", inputs, [out], inits))


@pytest.mark.parametrize("read_by", ["output", "input"])
def test_other_sequences_stay(read_by):
    """A sequence that is a graph output, or read at a position only known at run time: untouched."""
    model = _split_model(read_by)
    before = model.SerializeToString()
    notes: list[str] = []
    split_sequences(model, {"x": (2, 6)}, notes)
    assert model.SerializeToString() == before and notes == []


def test_a_scalar_split_cuts_the_last_piece_shorter():
    """split 4 over an axis of 6: pieces of 4 and 2; position -1 reads the 2."""
    model = _split_model("constant")
    split_sequences(model, {"x": (2, 6)}, [])
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(ReferenceEvaluator(model).run(None, {"x": x})[0], x[:, 4:])


@pytest.mark.slow
def test_gpt2_dynamo_unoptimized_plans_and_verifies(tmp_path):
    """hf-gpt2 (tiny) exported as the dynamo exporter's warning advises (optimize=False): its
    q, k, v split is a SplitToSequence read by SequenceAt; inspect, plan and a verified step."""
    import torch

    from onnxplan.models import hf

    spec, _ = hf.require_spec("hf-gpt2")
    path = tmp_path / "gpt2-dynamo.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(hf.build_torch_model(spec), (hf.example_inputs(spec, 2),), dynamo=True,
                                    optimize=False, input_names=["input_ids"], output_names=["logits"])
    program.save(str(path), external_data=False)
    assert {"SplitToSequence", "SequenceAt"} <= {n.op_type for n in onnx.load(str(path)).graph.node}
    shown = runner.invoke(app, ["inspect", str(path), "--loss", "ce"])
    assert shown.exit_code == 0, shown.stderr
    assert "rewrote 2 SplitToSequence node(s) read by SequenceAt to Split" in shown.stdout + shown.stderr
    ran = runner.invoke(app, ["run", str(path), "--loss", "ce", "--steps", "1", "--verify"])
    assert ran.exit_code == 0, ran.stderr
    assert "matches ONNX Runtime" in ran.stdout
