"""`onnxplan check` with no RESULTS: the gate of [tool.onnxplan] (pyproject.toml or onnxplan.toml)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from onnxplan.cli.app import app
from onnxplan.errors import UsageError
from onnxplan.gate_config import find_gate_config, load_gate_config
from onnxplan.offsets import PLANNERS
from tests.planner_faults import padded_planner

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
GATE = '''
[project]
name = "someone-else"

[tool.onnxplan]
models = ["mlp"]
strategies = "given+best-fit,nntrainer+sort"
baseline = "reports/base.json"
'''


def _check(*args: str):
    return runner.invoke(app, ["check", *args])


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "reports").mkdir()
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")  # found from a subfolder, as pytest and ruff do
    return tmp_path


def test_gate_from_pyproject_passes_then_fails_on_a_planted_regression(project, monkeypatch):
    (project / "pyproject.toml").write_text(GATE)
    res = _check()
    assert res.exit_code == 2 and "check --update-baseline" in res.output, res.output
    res = _check("--update-baseline")
    assert res.exit_code == 0 and (project / "reports/base.json").exists(), res.output
    res = _check()
    assert res.exit_code == 0 and "2 rows compared" in res.output and "0 worse" in res.output, res.output

    monkeypatch.setitem(PLANNERS, "best-fit", padded_planner(PLANNERS["best-fit"]))  # a strategy made worse
    res = _check()
    assert res.exit_code == 1, res.output
    table = res.output.split("worse planned_peak")[1]
    assert "mlp" in table and "given+best-fit" in table and "nntrainer+sort" not in table


def test_budget_per_model_fails_with_exit_3_naming_the_model(project):
    (project / "onnxplan.toml").write_text(
        'models = ["mlp", {model = "mlp-frozen", batch = 16}]\nstrategies = "given+best-fit"\n'
        'baseline = "reports/base.json"\nbudgets = {mlp-frozen = "64KiB", mlp = "1GiB"}\n')
    assert _check("--update-baseline").exit_code == 0
    res = _check()
    assert res.exit_code == 3, res.output
    assert "budget not met: mlp-frozen: no plan fits 64.00 KiB" in res.output
    assert "budget not met: mlp:" not in res.output


@pytest.mark.parametrize("text, words", [
    ('[tool.onnxplan]\nmodels = ["mlp"]\n', "baseline: field required"),
    ('[tool.onnxplan]\nbaseline = "b.json"\nmodle = 1\n', "unknown key 'modle'"),
    ('[tool.onnxplan]\nbaseline = "b.json"\nbudgets = {mlp = "lots"}\n', "budgets.mlp"),
    ('[tool.onnxplan]\nbaseline = "b.json"\nmodels = [{model = "mlp", batch = 0}]\n', "models[0].batch"),
    ('[tool.onnxplan]\nbaseline = "b.json"\nmodels = ["no-such-model"]\n', "no-such-model"),
    ('[tool.onnxplan]\nbaseline = "b.json"\nmodels = ["mlp"]\nbudgets = {gpt = "1MiB"}\n', "budgets.gpt"),
    ('[tool.onnxplan]\nbaseline = "b.json"\nworkers = 0\n', "workers"),
    ('[tool.onnxplan\n', "not valid TOML"),
])
def test_config_errors_are_one_line_exit_2(project, text, words):
    (project / "pyproject.toml").write_text(text)
    res = _check()
    assert res.exit_code == 2, res.output
    assert words in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output


def test_no_config_and_results_without_baseline_exit_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if any((d / "pyproject.toml").exists() or (d / "onnxplan.toml").exists() for d in tmp_path.parents):
        pytest.skip("a config above the temp folder")
    res = _check()
    assert res.exit_code == 2 and "no gate configured" in res.output
    res = _check(str(tmp_path / "r.json"))
    assert res.exit_code == 2 and "--baseline" in res.output


def test_this_repos_gate_is_todays_gate(tmp_path):
    """.ci/run's gate was `bench --all --strategies ci --no-measure` against reports/baseline.json."""
    gate = load_gate_config(find_gate_config(REPO / "onnxplan"))
    assert gate.source == REPO / "pyproject.toml"
    assert gate.models is None and gate.strategies == "ci" and not gate.measure
    assert gate.baseline == REPO / "reports/baseline.json" and gate.tolerance is None
    assert gate.metric == "planned_peak" and not gate.budgets and not gate.model_options
    assert gate.workers is None and gate.scheduler is None
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    with pytest.raises(UsageError, match="no \\[tool.onnxplan\\]"):
        load_gate_config(tmp_path / "pyproject.toml")


def test_the_readme_example_is_a_valid_gate(tmp_path):
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Using onnxplan in CI")[1]
    toml = section.split("```toml\n")[1].split("```")[0]
    (tmp_path / "pyproject.toml").write_text(toml)
    gate = load_gate_config(find_gate_config(tmp_path))
    assert gate.models == [str(tmp_path / "path/to/model.onnx"), "gpt"]
    assert gate.model_options == {"gpt": {"batch": 8, "optimizer": "sgd", "loss": "ce"}}
    assert gate.budgets == {"gpt": 512 * 2**20} and gate.baseline == tmp_path / "memory-baseline.json"
    workflow = section.split("```yaml\n")[1].split("```")[0]
    assert [ln.split("#")[0].strip() for ln in workflow.splitlines() if "- run:" in ln] == \
        ["- run: pip install -e .", "- run: onnxplan check"]
