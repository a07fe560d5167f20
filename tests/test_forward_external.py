"""A forward model with external data (one file per tensor) is loaded, prepared and shape-checked
without reading its weights; only onnxruntime-training's artifact build reads them, and a model
too large for that (over protobuf's 2 GiB) is built without them: by reference, with a nominal
checkpoint (issue 26)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

import onnxplan
from onnxplan.cli.app import app
from onnxplan.errors import ModelError
from onnxplan.forward import prepare_forward
from onnxplan.ir.checkpoint_file import CheckpointIndex, read_checkpoint
from onnxplan.ir.metadata import FORWARD_DATA, FORWARD_MODEL, read_metadata
from onnxplan.ir.onnx_files import SMALL_TENSOR, external_bytes, load_onnx, load_weights
from onnxplan.loading import artifacts
from onnxplan.loading.artifacts import generate_from_onnx
from onnxplan.ort import CHECKPOINT, EVAL_MODEL, OPTIMIZER_MODEL, TRAINING_MODEL
from tests.cli_asserts import assert_one_line_error

runner = CliRunner()
BIG = "w1"  # 256 x 512 = 131072 elements > SMALL_TENSOR: a weight, never read before ORT


def _model(seed: int) -> onnx.ModelProto:
    """x[4, 256] -> MatMul w1 -> Reshape [-1, 8, 64] -> Reshape [-1, 512] -> Relu -> MatMul w2 -> y[4, 10]."""
    rng = np.random.default_rng(seed)
    f32, i64 = np.float32, np.int64
    inits = [numpy_helper.from_array(rng.standard_normal((256, 512)).astype(f32), BIG),
             numpy_helper.from_array(rng.standard_normal((512, 10)).astype(f32), "w2"),
             numpy_helper.from_array(np.array([-1, 8, 64], i64), "split_shape"),
             numpy_helper.from_array(np.array([-1, 512], i64), "flat_shape")]
    nodes = [helper.make_node("MatMul", ["x", BIG], ["h"]),
             helper.make_node("Reshape", ["h", "split_shape"], ["h3"]),
             helper.make_node("Reshape", ["h3", "flat_shape"], ["h2"]),
             helper.make_node("Relu", ["h2"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "ext", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _save_external(model: onnx.ModelProto, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ext.onnx"
    model = onnx.ModelProto.FromString(model.SerializeToString())  # onnx.save moves the data out in place
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=0)
    return path


def _big_file(path: Path) -> Path:
    model = onnx.load(str(path), load_external_data=False)
    t = next(t for t in model.graph.initializer if t.name == BIG)
    assert t.data_location == TensorProto.EXTERNAL
    return path.parent / {e.key: e.value for e in t.external_data}["location"]


def _seed(request) -> int:
    return sum(request.node.nodeid.encode())


def test_every_tensor_is_external(tmp_path, request):
    path = _save_external(_model(_seed(request)), tmp_path)
    model = onnx.load(str(path), load_external_data=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)
    assert int(np.prod(next(t for t in model.graph.initializer if t.name == BIG).dims)) > SMALL_TENSOR


def test_prepared_without_reading_weights(tmp_path, request):
    """The weight's file truncated to nothing: a full load fails, the shapes-only load and the
    whole forward preparation succeed, with onnx's own inferred shapes of the intact model."""
    original = _model(_seed(request))
    path = _save_external(original, tmp_path)
    expected = onnx.shape_inference.infer_shapes(original, strict_mode=True)
    want = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
            for vi in (*expected.graph.value_info, *expected.graph.output)}
    _big_file(path).write_bytes(b"")
    with pytest.raises(ModelError, match="cannot read external data"):
        load_onnx(path)  # the check works: the weight's values are gone
    model = load_onnx(path, weights=False)
    assert external_bytes(model) == 256 * 512 * 4  # only the weight stays a reference
    kept = {t.name for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    assert kept == {BIG}
    fm = prepare_forward(model, "ext", "mse")
    assert [i.shape for i in fm.inputs] == [(4, 256)]
    assert BIG in fm.trainable and "w2" in fm.trainable
    got = onnx.shape_inference.infer_shapes(fm.model, strict_mode=True)
    have = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
            for vi in (*got.graph.value_info, *got.graph.output)}
    assert {k: have[k] for k in want} == want


def test_artifacts_read_the_weights_as_before(tmp_path, request):
    """The same model with external data and inline gives the same artifact cache entry (the
    content hash covers the weights' bytes): the build reads every value."""
    original = _model(_seed(request))
    inline = tmp_path / "inline" / "ext.onnx"
    inline.parent.mkdir()
    onnx.save(original, str(inline))
    external = _save_external(original, tmp_path / "external")
    a = generate_from_onnx(inline, "mse", optimizer="sgd")
    b = generate_from_onnx(external, "mse", optimizer="sgd")
    assert a == b
    other = _model(_seed(request) + 1)  # other weights, same shapes: another entry
    c = generate_from_onnx(_save_external(other, tmp_path / "other"), "mse", optimizer="sgd")
    assert c != a


def _serialized_hash(fm, optimizer: str) -> str:
    """The content hash as protobuf's own serialiser gives it: the whole model, weights inline."""
    h = hashlib.sha256(fm.model.SerializeToString())
    meta = artifacts._meta_without_hash(fm, optimizer)
    meta["onnxruntime"] = artifacts._ort_version()
    h.update(json.dumps(meta, sort_keys=True).encode())
    return h.hexdigest()


@pytest.mark.parametrize("weights", ["external", "inline"])
def test_hash_streams_the_serialisation(tmp_path, request, weights):
    """The content hash of a model whose weights are still on disk equals sha256 of protobuf's
    serialisation of the same model with them loaded; with a weight's file one byte short it
    fails with one line."""
    original = _model(_seed(request))
    original.graph.doc_string = "after the initializers"  # a graph field past field 5
    original.doc_string = "after the graph"  # a model field past field 7
    original.graph.initializer[0].doc_string = "after raw_data"  # a tensor field past field 9
    path = _save_external(original, tmp_path)
    model = load_onnx(path, weights=weights == "inline")
    fm = prepare_forward(model, "ext", "mse")
    fm.weights_dir = path.parent
    streamed = artifacts.content_hash(fm, "sgd")
    load_weights(fm.model, path.parent, path)
    assert not external_bytes(fm.model)
    assert streamed == _serialized_hash(fm, "sgd") == artifacts.content_hash(fm, "sgd")
    big = _big_file(path)
    big.write_bytes(big.read_bytes()[:-1])
    shapes_only = prepare_forward(load_onnx(path, weights=False), "ext", "mse")
    shapes_only.weights_dir = path.parent
    with pytest.raises(ModelError, match="cannot read external data"):
        artifacts.content_hash(shapes_only, "sgd")


def test_cache_hit_reads_no_weight(tmp_path, request, monkeypatch):
    """Built once; then the weight's bytes are only streamed through the hash, never loaded:
    the same entry comes back with load_weights failing if called."""
    path = _save_external(_model(_seed(request)), tmp_path)
    first = generate_from_onnx(path, "mse", optimizer="sgd")
    real = onnx.external_data_helper._read_external_data_bytes  # what load_weights reads with

    def guarded(tensor, base_dir):
        assert tensor.name != BIG, "weight loaded on a cache hit"
        return real(tensor, base_dir)

    monkeypatch.setattr(onnx.external_data_helper, "_read_external_data_bytes", guarded)
    assert generate_from_onnx(path, "mse", optimizer="sgd") == first
    (first / "checkpoint").unlink()  # a miss: now the build reads it, and the guard fires
    with pytest.raises(AssertionError, match="weight loaded on a cache hit"):
        generate_from_onnx(path, "mse", optimizer="sgd")


def _graphs(folder: Path) -> list[onnx.GraphProto]:
    return [onnx.load(str(folder / name)).graph for name in (TRAINING_MODEL, EVAL_MODEL, OPTIMIZER_MODEL)]


def test_over_the_limit_built_by_reference(tmp_path, request, monkeypatch):
    """One byte over MAX_FORWARD_BYTES: the artifacts are built with the parameters left on disk
    (the reader of external data refuses the weight), the training, eval and optimizer models
    the same graphs generate_artifacts makes from the values, the checkpoint a nominal one (names
    only), the same planned step; inspect and plan work, run refuses in one line (exit 2); the
    entry's forward.onnx holds the weight's values under forward.data/."""
    original = _model(_seed(request))
    path = _save_external(original, tmp_path / "model")
    by_value = generate_from_onnx(path, "mse", optimizer="adamw", cache_dir=tmp_path / "by-value")
    monkeypatch.setattr(artifacts, "MAX_FORWARD_BYTES", artifacts.forward_bytes(load_onnx(path, weights=False)) - 1)
    with monkeypatch.context() as guard:
        real = onnx.external_data_helper._read_external_data_bytes

        def guarded(tensor, base_dir):
            assert tensor.name != BIG, "a parameter's value was read"
            return real(tensor, base_dir)

        guard.setattr(onnx.external_data_helper, "_read_external_data_bytes", guarded)
        folder = generate_from_onnx(path, "mse", optimizer="adamw", cache_dir=tmp_path / "by-reference")
        assert folder.name != by_value.name  # another entry: the metadata says how it was built
        assert read_metadata(folder)["weights"] == "by reference" and "weights" not in read_metadata(by_value)
        assert read_checkpoint(folder / CHECKPOINT) == CheckpointIndex({BIG: None, "w2": None}, nominal=True)
        assert read_checkpoint(by_value / CHECKPOINT) == CheckpointIndex({BIG: (256, 512), "w2": (512, 10)}, False)
        assert _graphs(folder) == _graphs(by_value)
        assert onnxplan.plan(onnxplan.load(folder)).peak_bytes == onnxplan.plan(onnxplan.load(by_value)).peak_bytes
        command = [str(path), "--optimizer", "adamw", "--loss", "mse"]
        for name in ("inspect", "plan"):
            result = runner.invoke(app, [name, *command])
            assert result.exit_code == 0, result.stderr
        result = runner.invoke(app, ["run", *command, "--steps", "1"])
        assert_one_line_error(result, 2, "the checkpoint holds the parameters' names only")
    copied = generate_from_onnx(path, "mse", optimizer="adamw", cache_dir=tmp_path / "by-reference",
                                out_dir=tmp_path / "out")  # `models build --out`: the data goes along
    want = next(t for t in original.graph.initializer if t.name == BIG)
    for entry in (folder, copied):
        forward = load_onnx(entry / FORWARD_MODEL)
        weight = next(t for t in forward.graph.initializer if t.name == BIG)
        assert np.array_equal(numpy_helper.to_array(weight), numpy_helper.to_array(want))
        assert sorted(p.name for p in (entry / FORWARD_DATA).iterdir()) == [_big_file(path).name]


def test_a_linked_weight_file_is_one_line(tmp_path, request):
    """onnx refuses external data in a file with several hard links: a ModelError naming the file."""
    path = _save_external(_model(_seed(request)), tmp_path)
    os.link(_big_file(path), tmp_path / "second-link")
    with pytest.raises(ModelError, match="cannot read external data .*hard"):
        load_onnx(path)


def test_opset_conversion_keeps_the_reference(tmp_path, request):
    """A dynamo-style export (opset 18) is converted to 17 with its weight still on disk."""
    model = _model(_seed(request))
    model.opset_import[0].version = 18
    path = _save_external(model, tmp_path)
    _big_file(path).write_bytes(b"")
    fm = prepare_forward(load_onnx(path, weights=False), "ext", "mse")
    assert "converted ai.onnx opset 18 to 17" in fm.prep["rewrites"]
    w = next(t for t in fm.model.graph.initializer if t.name == BIG)
    assert w.data_location == TensorProto.EXTERNAL and list(w.dims) == [256, 512]
