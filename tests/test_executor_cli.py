"""`onnxplan run`: JSON fields, --verify against ONNX Runtime, the probe, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onnxplan.cli.app import app
from tests.zoo_small import small_artifacts

runner = CliRunner()
FIELDS = {"model", "steps", "loss", "median_step_seconds", "arena_bytes", "peak_bytes", "measured_peak_bytes",
          "verified", "max_rel_diff"}


def _run(*args: str):
    return runner.invoke(app, ["run", *args])


def _one_line_error(result, code: int, needle: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("onnxplan: error: "), err
    assert needle in err, err
    assert "Traceback" not in result.stdout + result.stderr


@pytest.fixture(scope="module")
def mlp() -> str:
    return str(small_artifacts("mlp", "sgd"))


@pytest.fixture(scope="module")
def mlp_plan(mlp, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("plans") / "mlp.json"
    result = runner.invoke(app, ["plan", mlp, "--order", "given", "--planner", "best-fit", "-o", str(path)])
    assert result.exit_code == 0, result.stderr
    return str(path)


def test_run_verify_json(mlp):
    result = _run(mlp, "--order", "nntrainer", "--planner", "sort", "--verify", "--no-measure", "--json",
                  "--steps", "2")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert FIELDS <= set(out)
    assert out["model"] == "mlp" and out["steps"] == 2 and len(out["loss"]) == 2
    assert out["verified"] is True and out["max_rel_diff"] < 1e-4
    assert out["peak_bytes"] == out["arena_bytes"] + out["persistent_bytes"]
    assert out["measured_peak_bytes"] is None


def test_run_measures_the_peak_in_a_subprocess(mlp_plan, mlp):
    result = _run(mlp, "--plan", mlp_plan, "--json", "--steps", "2")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["verified"] is None and out["max_rel_diff"] is None
    # the arena and state are written in full each step: their pages are resident
    assert out["measured_peak_bytes"] >= 0.9 * out["peak_bytes"]
    assert out["measured_minus_planned_bytes"] == out["measured_peak_bytes"] - out["peak_bytes"]


def test_mismatch_with_ort_is_exit_1_with_offenders(mlp, monkeypatch):
    import onnxplan.executor.runner as runner_module

    monkeypatch.setattr(runner_module, "DEFAULT_LEARNING_RATE", 2e-3)  # ORT keeps 1e-3
    result = _run(mlp, "--verify", "--no-measure", "--planner", "best-fit")
    _one_line_error(result, 1, "differs from ONNX Runtime")
    assert "MISMATCH" in result.stdout and "tolerance" in result.stdout


def test_check_arena_catches_a_plan_freeing_a_buffer_early(mlp, mlp_plan, tmp_path):
    """A plan file that lies about a life is refused when loaded; the same plan handed to the
    executor directly (as a planner bug would) runs, unless the arena is checked."""
    from onnxplan.executor import ArenaCheckError, adopt_plan, run_plan
    from onnxplan.executor.prepare import Prepared
    from onnxplan.loading import open_step
    from onnxplan.plan import Plan

    plan = json.loads(Path(mlp_plan).read_text())
    victim = max((b for b in plan["buffers"] if b["last_eo"] > b["first_eo"] + 1), key=lambda b: b["bytes"])
    victim["last_eo"] -= 1  # offsets still sound: only the stated life is a lie
    path = tmp_path / "early.json"
    path.write_text(json.dumps(plan))
    _one_line_error(_run(mlp, "--plan", str(path), "--no-measure"), 2, "derived from the order")
    folder, graph = open_step(mlp)
    prepared = Prepared(folder, adopt_plan(graph, Plan.load(mlp_plan)), Plan.from_json(plan))
    run_plan(None, prepared=prepared, steps=1)
    with pytest.raises(ArenaCheckError, match=f"outside the planned life EO {victim['first_eo']}..{victim['last_eo']} "
                                              f"of its buffer {victim['name']!r}"):
        run_plan(None, prepared=prepared, steps=1, check_arena=True)


def test_plan_for_another_model_is_exit_2(mlp_plan):
    other = str(small_artifacts("nnt-fc3", "sgd"))
    _one_line_error(_run(other, "--plan", mlp_plan, "--no-measure"), 2, "the plan is for model 'mlp'")


@pytest.mark.parametrize("text,needle", [("{not json", "not a plan JSON file"),
                                         ('{"schema_version": 1, "model": "mlp"}', "malformed plan"),
                                         ('{"schema_version": 7}', "schema_version")])
def test_malformed_plan_is_exit_2(mlp, tmp_path, text, needle):
    path = tmp_path / "bad.json"
    path.write_text(text)
    _one_line_error(_run(mlp, "--plan", str(path), "--no-measure"), 2, needle)


def test_bad_options_are_exit_2(mlp, mlp_plan, tmp_path):
    _one_line_error(_run(mlp, "--plan", mlp_plan, "--order", "greedy"), 2, "--plan fixes the plan")
    _one_line_error(_run(mlp, "--steps", "0"), 2, "--steps")
    _one_line_error(_run(mlp, "--plan", str(tmp_path / "missing.json")), 2, "no such plan file")
    _one_line_error(_run(str(tmp_path / "nope"), "--no-measure"), 2, "no such file or folder")
