"""The CI gate catches a planted regression: a planner degraded on purpose makes `check` fail."""

from __future__ import annotations

from typer.testing import CliRunner

from onnxplan.cli.app import app
from onnxplan.offsets import PLANNERS
from tests.planner_faults import padded_planner

runner = CliRunner()


def test_gate_fails_on_a_degraded_planner(tmp_path, monkeypatch):
    base, new = tmp_path / "baseline.json", tmp_path / "new.json"
    args = ["mlp", "transformer", "--no-measure", "--strategies", "given+best-fit,nntrainer+sort"]
    assert runner.invoke(app, ["bench", *args, "-o", str(base)]).exit_code == 0
    assert runner.invoke(app, ["bench", *args, "-o", str(new)]).exit_code == 0
    ok = runner.invoke(app, ["check", str(new), "--baseline", str(base)])
    assert ok.exit_code == 0, ok.output

    monkeypatch.setitem(PLANNERS, "best-fit", padded_planner(PLANNERS["best-fit"]))
    res = runner.invoke(app, ["bench", *args, "-o", str(new), "--fresh"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["check", str(new), "--baseline", str(base)])
    assert res.exit_code == 1, res.output
    assert "given+best-fit" in res.output and "nntrainer+sort" not in res.output.split("worse planned_peak")[1]
    assert "mlp" in res.output and "transformer" in res.output
