"""Artifact building: every zoo model yields ORT artifacts that train, cached by content hash."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest

import onnxplan.loading.artifacts as art
from onnxplan import settings
from onnxplan.errors import DynamicDimError, ModelError, UsageError
from onnxplan.forward.spec import ForwardModel, InputSpec
from onnxplan.models import get_model, list_models
from tests.zoo_small import SMALL, small


def train_two_steps(art_dir: Path, fm: ForwardModel) -> list[float]:
    """Two ORT training steps on seeded data; the eval model must load and run too."""
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    state = CheckpointState.load_checkpoint(str(art_dir / "checkpoint"))
    module = Module(str(art_dir / "training_model.onnx"), state, str(art_dir / "eval_model.onnx"))
    optimizer = Optimizer(str(art_dir / "optimizer_model.onnx"), module)
    rng = np.random.default_rng(0)
    inputs = [spec.sample(rng) for spec in fm.inputs]
    labels = fm.labels.sample(rng)
    module.train()
    losses = []
    for _ in range(2):
        losses.append(float(module(*inputs, labels)))
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    losses.append(float(module(*inputs, labels)))
    return losses


def test_small_configs_cover_the_zoo():
    assert set(SMALL) == {spec.name for spec in list_models()}


@pytest.mark.parametrize("name", list(SMALL))
def test_zoo_model_artifacts_train(name, tmp_path, capfd):
    fm = small(name)
    optimizer = get_model(name).default_optimizer
    capfd.readouterr()
    d = art.build_artifacts(fm, None, optimizer=optimizer, cache_dir=tmp_path)
    out, err = capfd.readouterr()
    assert out == "" and err == "", "generate_artifacts logging leaked"
    for name_ in art.ARTIFACT_FILES:
        assert (d / name_).exists(), name_
    for model_file in ("training_model.onnx", "optimizer_model.onnx", "eval_model.onnx"):
        assert onnx.load(str(d / model_file)).ir_version == 9
    losses = train_two_steps(d, fm)
    assert all(math.isfinite(v) for v in losses), losses


def test_metadata_fields(tmp_path):
    fm = small("transformer")
    d = art.build_artifacts(fm, None, optimizer="sgd", cache_dir=tmp_path)
    meta = art.read_metadata(d)
    assert meta["schema_version"] == 1
    assert meta["model"] == "transformer" and meta["batch"] == 2
    assert meta["loss"] == "ce" and meta["optimizer"] == "sgd"
    assert meta["inputs"] == [{"name": "input_ids", "dtype": "int64", "shape": [2, 16], "low": 0, "high": 1000}]
    assert meta["labels"] == {"name": "labels", "dtype": "int64", "shape": [2], "low": 0, "high": 10}
    assert meta["trainable"] == fm.trainable and meta["frozen"] == []
    assert meta["content_hash"] == d.name == art.content_hash(fm, "sgd")
    forward = onnx.load(str(d / "forward.onnx"))
    assert forward.SerializeToString() == fm.model.SerializeToString()
    assert json.loads((d / "onnxplan.json").read_text()) == meta


def test_second_call_is_a_cache_hit(tmp_path, monkeypatch):
    fm = small("mlp-frozen")
    first = art.build_artifacts(fm, None, cache_dir=tmp_path)
    stamp = (first / "training_model.onnx").stat().st_mtime_ns

    def no_rebuild(*args, **kwargs):
        raise AssertionError("rebuilt a cached entry")

    monkeypatch.setattr(art, "_run_generate_artifacts", no_rebuild)
    again = art.build_artifacts(small("mlp-frozen"), None, cache_dir=tmp_path)
    assert again == first and (again / "training_model.onnx").stat().st_mtime_ns == stamp
    out = art.build_artifacts(fm, tmp_path / "out", cache_dir=tmp_path)
    assert out == tmp_path / "out"
    for name in art.ARTIFACT_FILES:
        assert (out / name).read_bytes() == (first / name).read_bytes()
    assert art.read_metadata(out)["frozen"] == ["fc2.weight", "fc2.bias"]
    assert sorted(p.name for p in out.iterdir()) == sorted(art.ARTIFACT_FILES)


def test_hash_depends_on_optimizer_loss_and_model():
    fm = small("mlp")
    h = art.content_hash(fm, "adamw")
    assert h == art.content_hash(small("mlp"), "adamw")
    assert h != art.content_hash(fm, "sgd")
    assert h != art.content_hash(get_model("mlp").builder(batch=4, loss="mse"), "adamw")
    assert h != art.content_hash(get_model("mlp").builder(batch=5), "adamw")
    assert h != art.content_hash(small("mlp-frozen"), "adamw")


def test_failed_build_leaves_no_cache_entry(tmp_path, monkeypatch):
    def boom(fm, optimizer, out):
        (out / "training_model.onnx").write_bytes(b"half")
        raise ModelError("boom")

    monkeypatch.setattr(art, "_run_generate_artifacts", boom)
    with pytest.raises(ModelError, match="boom"):
        art.build_artifacts(small("mlp"), tmp_path / "out", cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []
    assert not (tmp_path / "out").exists()


def test_incomplete_cache_entry_is_rebuilt(tmp_path):
    fm = small("mlp")
    d = art.build_artifacts(fm, None, cache_dir=tmp_path)
    (d / "checkpoint").unlink()
    again = art.build_artifacts(fm, None, cache_dir=tmp_path)
    assert again == d and (d / "checkpoint").exists()
    assert [p.name for p in tmp_path.iterdir()] == [d.name]


def test_default_cache_dir_honours_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXPLAN_CACHE", str(tmp_path / "c"))
    settings.reload()  # the environment changed: read it again
    assert art.default_cache_dir() == tmp_path / "c"
    d = art.build_artifacts(small("mlp"), None)
    assert d.parent == tmp_path / "c"
    monkeypatch.delenv("ONNXPLAN_CACHE")
    settings.reload()  # the environment changed: read it again
    assert art.default_cache_dir() == Path.home() / ".cache" / "onnxplan" / "artifacts"


def test_bad_options_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="optimizer"):
        art.build_artifacts(small("mlp"), None, optimizer="lion", cache_dir=tmp_path)


def test_ort_failure_is_one_line_model_error(tmp_path):
    fm = small("mlp")
    fm.trainable = ["fc1.weight", "no_such_param"]
    with pytest.raises(ModelError, match="could not build the training graph") as first:
        art.build_artifacts(fm, None, cache_dir=tmp_path)
    assert "\n" not in str(first.value) and "onnxruntime::" not in str(first.value)
    # only the failure record is left: no half-built entry; the next call fails fast, same line
    [failed] = tmp_path.iterdir()
    assert failed.name == art.content_hash(fm, "adamw") + art.FAILED_SUFFIX
    with pytest.raises(ModelError) as second:
        art.build_artifacts(fm, None, cache_dir=tmp_path)
    assert str(second.value) == str(first.value)


def _dynamic_forward(path: Path) -> Path:
    """The small mlp saved with a symbolic batch dim, like a typical exported model."""
    model = small("mlp").model
    for vi in (model.graph.input[0], model.graph.output[0]):
        vi.type.tensor_type.shape.dim[0].dim_param = "batch"
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def test_generate_from_onnx_user_model(tmp_path):
    path = _dynamic_forward(tmp_path / "my_net.onnx")
    d = art.generate_from_onnx(path, loss="ce", batch=3, cache_dir=tmp_path / "cache")
    meta = art.read_metadata(d)
    assert meta["model"] == "my_net" and meta["batch"] == 3
    assert meta["inputs"][0]["shape"] == [3, 784]
    assert meta["labels"] == {"name": "labels", "dtype": "int64", "shape": [3], "low": 0, "high": 10}
    assert meta["trainable"] == [t.name for t in small("mlp").model.graph.initializer]
    fm = ForwardModel("my_net", onnx.load(str(d / "forward.onnx")), meta["trainable"], [],
                      [InputSpec.from_dict(s) for s in meta["inputs"]],
                      InputSpec.from_dict(meta["labels"]), "ce")
    assert fm.model.ir_version == 9
    assert all(math.isfinite(v) for v in train_two_steps(d, fm))
    by_dim = art.generate_from_onnx(path, loss="ce", dims={"batch": 3}, cache_dir=tmp_path / "cache")
    assert by_dim == d
    loaded = onnx.load(str(path))
    before = loaded.SerializeToString()
    assert art.generate_from_onnx(path, loss="ce", batch=3, model=loaded, cache_dir=tmp_path / "cache") == d
    assert loaded.SerializeToString() == before
    frozen = art.generate_from_onnx(path, loss="mse", batch=3, freeze=["fc2.*"],
                                    optimizer="sgd", cache_dir=tmp_path / "cache")
    meta = art.read_metadata(frozen)
    assert meta["frozen"] == ["fc2.weight", "fc2.bias"] and "fc2.weight" not in meta["trainable"]
    assert meta["labels"]["dtype"] == "float32" and meta["labels"]["shape"] == [3, 10]


def test_a_forward_file_built_before_is_not_prepared_again(tmp_path, monkeypatch):
    """The second command on the same file and options finds its artifacts by the file's recipe
    without preparing the model (shape inference over a real-size model costs more than planning
    it); another option or another content of the file prepares and builds anew."""
    import onnxplan.forward as forward

    path = _dynamic_forward(tmp_path / "my_net.onnx")
    first = art.generate_from_onnx(path, loss="ce", batch=3, cache_dir=tmp_path / "cache")
    real = forward.prepare_forward
    calls = []
    monkeypatch.setattr(forward, "prepare_forward", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert art.generate_from_onnx(path, loss="ce", batch=3, cache_dir=tmp_path / "cache") == first
    assert calls == []
    copied = art.generate_from_onnx(path, loss="ce", batch=3, out_dir=tmp_path / "out", cache_dir=tmp_path / "cache")
    assert calls == [] and copied == tmp_path / "out" and (copied / "training_model.onnx").is_file()
    assert art.generate_from_onnx(path, loss="ce", batch=4, cache_dir=tmp_path / "cache") != first
    assert len(calls) == 1
    model = onnx.load(str(path))
    model.graph.initializer[0].raw_data = bytes(len(model.graph.initializer[0].raw_data))  # other weights
    onnx.save(model, str(path))
    assert art.generate_from_onnx(path, loss="ce", batch=3, cache_dir=tmp_path / "cache") != first
    assert len(calls) == 2


def test_generate_from_onnx_errors(tmp_path):
    path = _dynamic_forward(tmp_path / "net.onnx")
    with pytest.raises(DynamicDimError, match="batch"):
        art.generate_from_onnx(path, loss="ce", cache_dir=tmp_path)
    with pytest.raises(ModelError, match="no such file"):
        art.generate_from_onnx(tmp_path / "missing.onnx", loss="ce", cache_dir=tmp_path)
    (tmp_path / "junk.onnx").write_bytes(b"\x00not an onnx model\xff" * 10)
    with pytest.raises(ModelError, match="not an ONNX model"):
        art.generate_from_onnx(tmp_path / "junk.onnx", loss="ce", cache_dir=tmp_path)
    with pytest.raises(UsageError, match="--train 'nope' matches no initializer"):
        art.generate_from_onnx(path, loss="ce", batch=2, train=["nope"], cache_dir=tmp_path)
    with pytest.raises(UsageError, match="unknown loss"):
        art.generate_from_onnx(path, loss="l7", batch=2, cache_dir=tmp_path)


def test_recipe_hit_skips_the_build_and_matches_a_fresh_build(tmp_path):
    from onnxplan.models import build_forward, build_recipe

    calls = []

    def make(batch=4):
        calls.append(batch)
        return build_forward("mlp", batch=batch)

    first = art.recipe_artifacts(build_recipe("mlp", batch=4), make, cache_dir=tmp_path)
    assert calls == [4]
    # the note names the entry a fresh build of the same model lands in (the ground truth)
    assert first == art.build_artifacts(build_forward("mlp", batch=4), None, cache_dir=tmp_path)
    assert art.recipe_artifacts(build_recipe("mlp", batch=4), make, cache_dir=tmp_path) == first
    assert calls == [4]  # a hit: no weights drawn, nothing hashed
    # anything the model depends on is part of the recipe: another batch, optimizer or builder
    other = art.recipe_artifacts(build_recipe("mlp", batch=5), lambda: make(5), cache_dir=tmp_path)
    assert other != first and calls == [4, 5]
    assert art.recipe_artifacts(build_recipe("mlp", batch=4), make, optimizer="sgd", cache_dir=tmp_path) != first
    changed = {**build_recipe("mlp", batch=4), "builders": "0" * 64}
    assert art.recipe_artifacts(changed, make, cache_dir=tmp_path) == first
    assert calls == [4, 5, 4, 4]
    # a note whose entry is gone or incomplete is rebuilt, not trusted
    (first / "checkpoint").unlink()
    assert art.recipe_artifacts(build_recipe("mlp", batch=4), make, cache_dir=tmp_path) == first
    assert (first / "checkpoint").exists() and calls == [4, 5, 4, 4, 4]
    with pytest.raises(UsageError, match="unknown optimizer"):
        art.recipe_artifacts(build_recipe("mlp"), make, optimizer="lion", cache_dir=tmp_path)


def test_a_build_names_its_graph_the_same_after_other_builds(tmp_path):
    """onnxblock's names come from a per-process counter: the same model built after another
    one must still get the same training graph (the fingerprint a plan and a stored profile
    are keyed by), as in a fresh process."""
    fm = small("mlp-frozen")
    first = art.build_artifacts(fm, None, cache_dir=tmp_path / "a")
    art.build_artifacts(small("mlp"), None, cache_dir=tmp_path / "b")  # moves the counter on
    again = art.build_artifacts(small("mlp-frozen"), None, cache_dir=tmp_path / "c")
    assert (again / "training_model.onnx").read_bytes() == (first / "training_model.onnx").read_bytes()
