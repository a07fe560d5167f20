"""The Python API: the README's example runs as written (plans, runs and verifies a model under a
budget), and the API's results are the CLI's (same plan, the run JSON's keys)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import onnxplan
from onnxplan.cli.app import app
from onnxplan.errors import BudgetError

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_example() -> str:
    text = README.read_text()
    m = re.search(r"<!-- api-example:start -->\s*```python\n(.*?)```\s*<!-- api-example:end -->", text, re.DOTALL)
    assert m, "README.md has no api-example block"
    return m.group(1)


def test_the_readme_example_runs(capsys):
    scope: dict = {}
    exec(compile(readme_example(), "README.md:api-example", "exec"), scope)  # noqa: S102
    plan, report, df = scope["plan"], scope["report"], scope["df"]
    assert plan.peak_bytes <= 3.8 * 2**20 and (plan.swaps or plan.checkpoint is not None)  # the budget needed it
    assert report.verified and len(report.loss) == 2
    assert list(df["strategy"]) == ["auto", "given+naive"]


@pytest.fixture(scope="module")
def step():
    return onnxplan.load("mlp", batch=4)


def test_api_plan_is_the_cli_plan(step, tmp_path):
    plan = onnxplan.plan(step, order="nntrainer", planner="sort")
    path = tmp_path / "p.json"
    r = CliRunner().invoke(app, ["plan", "mlp", "--batch", "4", "--order", "nntrainer", "--planner", "sort",
                                 "-o", str(path)])
    assert r.exit_code == 0, r.stderr
    cli = onnxplan.Plan.load(path)
    assert (cli.order, cli.buffers, cli.graph_fingerprint, cli.source) == \
        (plan.order, plan.buffers, plan.graph_fingerprint, plan.source)


def test_api_run_report_has_the_cli_run_keys(step):
    report = onnxplan.run(step, steps=1, warmup=0)
    r = CliRunner().invoke(app, ["run", "mlp", "--batch", "4", "--steps", "1", "--warmup", "0", "--no-measure",
                                 "--json"])
    assert r.exit_code == 0, r.stderr
    assert list(report.to_json()) == list(json.loads(r.stdout))
    assert report.verified is None and report.loss == json.loads(r.stdout)["loss"]


def test_api_plan_raises_on_a_budget_no_plan_reaches(step):
    with pytest.raises(BudgetError, match="no plan reaches the budget 1.00 KiB") as err:
        onnxplan.plan(step, budget="1KiB")
    assert err.value.exit_code == 3


def test_registries_list_every_entry():
    from onnxplan.offsets import PLANNERS
    from onnxplan.orders import ORDERS
    from onnxplan.pipeline import PASSES

    assert {"realize", "interleave", "inplace", "inplace-state"} <= set(PASSES.passes)
    assert {"given", "nntrainer", "greedy", "ilp"} <= set(ORDERS)
    assert {"naive", "sort", "greedy-size", "best-fit", "ilp"} <= set(PLANNERS)
