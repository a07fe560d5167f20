"""Options and files that used to be accepted silently: one line, exit 2, nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from onnxplan.cli.app import app
from onnxplan.errors import ModelError
from onnxplan.ir.checkpoint_file import checkpoint_parameters
from tests.cli_asserts import assert_one_line_error

runner = CliRunner()


def _refused(result, needle: str, code: int = 2) -> None:
    assert_one_line_error(result, code, needle)


@pytest.mark.parametrize("command", [("plan", "mlp"), ("run", "mlp"), ("bench", "mlp", "--no-measure")])
@pytest.mark.parametrize("limit", ["-1", "nan", "inf", "0"])
def test_a_time_limit_must_be_positive_and_finite(tmp_path, command, limit):
    out = tmp_path / "out.json"
    _refused(runner.invoke(app, [*command, "--time-limit", limit, "-o" if command[0] != "run" else "--json",
                                 *([str(out)] if command[0] != "run" else [])]), "invalid --time-limit")
    assert not list(tmp_path.iterdir())


def test_a_per_model_budget_names_a_benched_model(tmp_path):
    out = tmp_path / "r.json"
    _refused(runner.invoke(app, ["bench", "mlp", "--no-measure", "--budget", "nosuch=1MiB", "-o", str(out)]),
             "'nosuch' is not a model of this bench (mlp)")
    assert not out.exists()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("art") / "mlp"
    r = runner.invoke(app, ["models", "build", "mlp", "--batch", "4", "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    return out


def _corrupt(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    data = (dst / "checkpoint").read_bytes()
    (dst / "checkpoint").write_bytes(edit(data))
    return dst


@pytest.mark.parametrize("how", ["truncated", "garbled", "empty", "other-identifier"])
def test_a_corrupt_checkpoint_is_refused_when_the_folder_is_loaded(artifacts, tmp_path, how):
    edits = {"truncated": lambda d: d[: len(d) // 2], "empty": lambda d: b"",
             "garbled": lambda d: d[:8] + bytes(255 - b for b in d[8:64]) + d[64:],
             "other-identifier": lambda d: d[:4] + b"XXXX" + d[8:]}
    folder = _corrupt(artifacts, tmp_path / "a", edits[how])
    for command in ("inspect", "plan"):
        _refused(runner.invoke(app, [command, str(folder)]), "corrupt checkpoint")


def test_the_checkpoint_reader_never_crashes_on_mutations(artifacts):
    """Random byte mutations of the checkpoint's first KiB: its tensors, or a ModelError."""
    data = (artifacts / "checkpoint").read_bytes()
    want = checkpoint_parameters(artifacts / "checkpoint")
    assert want and all(isinstance(d, tuple) for d in want.values())
    rng = np.random.default_rng(0)
    path = artifacts.parent / "mutated"
    for _ in range(200):
        d = bytearray(data)
        for k in rng.integers(0, 1024, size=int(rng.integers(1, 8))):
            d[k] = int(rng.integers(0, 256))
        path.write_bytes(bytes(d[: int(rng.integers(0, len(d) + 1))] if rng.random() < 0.2 else d))
        try:
            checkpoint_parameters(path)
        except ModelError as exc:
            assert "checkpoint" in str(exc)
