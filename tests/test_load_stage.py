"""The load stage (onnxplan.loading): one way in for inspect, plan, run, bench and the API, with
one batch rule: a folder our builder made supplies its batch when the request names none."""

from __future__ import annotations

import json
import shutil

import onnx
import pytest
from typer.testing import CliRunner

import onnxplan
from onnxplan.cli.app import app
from onnxplan.errors import DynamicDimError
from onnxplan.ir.load import read_step
from onnxplan.ir.metadata import read_metadata
from onnxplan.loading import LoadRequest, load_step, open_step
from onnxplan.loading.zoo import sources
from tests.zoo_small import small_artifacts


@pytest.fixture(scope="module")
def dynamic_batch(tmp_path_factory):
    """A folder our builder made (onnxplan.json batch 4) whose training model reads a dynamic
    batch axis "N", as a folder re-exported with dynamic axes would."""
    folder = tmp_path_factory.mktemp("dyn") / "mlp-dyn"
    shutil.copytree(small_artifacts("mlp", "sgd"), folder)
    path = folder / "training_model.onnx"
    model = onnx.load(str(path))
    params = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if vi.name not in params and vi.type.HasField("tensor_type") and len(dims) and dims[0].dim_value == 4:
            dims[0].ClearField("dim_value")
            dims[0].dim_param = "N"
    onnx.save(model, str(path))
    return folder


def test_the_fixture_really_has_a_dynamic_batch(dynamic_batch):
    assert read_metadata(dynamic_batch)["batch"] == 4
    with pytest.raises(DynamicDimError):
        read_step(dynamic_batch)  # the folder's reader alone does not know the batch


def test_every_caller_loads_a_folder_at_the_batch_it_was_built_for(dynamic_batch):
    """inspect, plan, bench and the API (run loads as plan does, api.load_step_of) read the same
    step: before one load stage, inspect and bench refused this folder (dynamic axis)."""
    want = read_step(dynamic_batch, batch=4)
    assert load_step(LoadRequest(str(dynamic_batch))).fingerprint() == want.fingerprint()
    folder, graph = open_step(str(dynamic_batch))
    assert folder == dynamic_batch and graph.fingerprint() == want.fingerprint()
    assert onnxplan.load(dynamic_batch).graph.fingerprint() == want.fingerprint()
    # an explicit batch wins over the recorded one
    assert load_step(LoadRequest(str(dynamic_batch), batch=2)).fingerprint() == \
        read_step(dynamic_batch, batch=2).fingerprint()

    runner = CliRunner()
    got = runner.invoke(app, ["inspect", str(dynamic_batch), "--json"])
    assert got.exit_code == 0, got.output
    assert json.loads(got.stdout)["persistent_bytes"] == want.persistent_bytes
    plan_file = dynamic_batch.parent / "plan.json"
    got = runner.invoke(app, ["plan", str(dynamic_batch), "--order", "given", "--planner", "naive", "--no-profile",
                              "-o", str(plan_file)])
    assert got.exit_code == 0, got.output
    plan = json.loads(plan_file.read_text())
    assert plan["graph_fingerprint"] == want.fingerprint()

    rows = onnxplan.bench([str(dynamic_batch)], strategies="given+naive")
    assert list(rows["planned_peak_bytes"]) == [plan["peak_bytes"]]


def test_the_zoo_is_found_through_its_registered_source():
    names = [n for s in sources() for n in s.names()]
    assert "mlp" in names and "transformer" in names


def test_the_library_finds_the_zoo_through_the_settings_without_importing_it():
    """A fresh `import onnxplan` (the API, no CLI) imports no zoo module, and finds the zoo's
    names through the source the settings name (ONNXPLAN_MODEL_SOURCES' default)."""
    import subprocess
    import sys

    code = ("import sys, onnxplan\n"
            "assert not [m for m in sys.modules if m.startswith(('onnxplan.models', 'onnxplan.cli'))]\n"
            "from onnxplan.loading.zoo import sources\n"
            "assert 'mlp' in [n for s in sources() for n in s.names()]\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_the_settings_choose_the_model_sources():
    """ONNXPLAN_MODEL_SOURCES empty: files and folders only; a bad entry is a usage error."""
    import os
    import subprocess
    import sys

    code = ("import onnxplan\nfrom onnxplan.errors import OnnxplanError\n"
            "try:\n    onnxplan.load('mlp')\nexcept OnnxplanError as e:\n    print(type(e).__name__, e.exit_code, e)\n")
    for value, want in (("", "ModelError 2 'mlp' is not a file or folder, and no model source is set"),
                        ("no_such_module:X", "UsageError 2 invalid ONNXPLAN_MODEL_SOURCES entry 'no_such_module:X'")):
        env = {**os.environ, "ONNXPLAN_MODEL_SOURCES": value}
        out = subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.stdout.startswith(want), (out.stdout, out.stderr[-2000:])
