"""Planning with checkpoint policies: peaks drop, budgets are met, plan files replay, CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from onnxplan.budget import AUTO_STRATEGIES, fit_budget, plan_with_checkpoint
from onnxplan.cli.app import app
from onnxplan.errors import ModelError
from onnxplan.loading import load_step
from onnxplan.loading.request import LoadRequest
from onnxplan.plan import Plan
from onnxplan.planning import PlanOptions, plan_step

OPTS = PlanOptions(planner="best-fit")


@pytest.fixture(scope="module")
def transformer():
    return load_step(LoadRequest("transformer", batch=16))


@pytest.fixture(scope="module")
def least(transformer):
    plain = plan_step(transformer, OPTS).plan.peak_bytes
    return plain, {p: plan_with_checkpoint(transformer, OPTS, p) for p in ("sqrt", "chen", "rotor")}


def test_every_policy_lowers_the_peak(least):
    plain, outs = least
    for policy, out in outs.items():
        info = out.plan.checkpoint
        assert out.plan.peak_bytes < plain, policy
        assert any(p.startswith("recompute:") for p in out.plan.passes)
        assert info.policy == policy and info.schedule
        assert info.predicted_step_seconds > info.predicted_step_seconds_without
    assert outs["rotor"].plan.peak_bytes <= min(o.plan.peak_bytes for o in outs.values())


def test_budgets_between_least_and_plain_are_met(transformer, least):
    plain, outs = least
    bottom = min(o.plan.peak_bytes for o in outs.values())
    for frac in (0.1, 0.5, 0.9):
        budget = int(bottom + frac * (plain - bottom))
        fits = {}
        for policy in ("sqrt", "chen", "rotor"):
            out = plan_with_checkpoint(transformer, replace(OPTS, budget=budget), policy)
            fits[policy] = out.plan.peak_bytes <= budget
        assert fits["rotor"], budget  # rotor reaches every limit down to the least of all
        assert fits["rotor"] >= max(fits.values())
    # a budget the plain plan meets: no recomputation at all
    out = plan_with_checkpoint(transformer, replace(OPTS, budget=plain), "rotor")
    assert not any(p.startswith("recompute:") for p in out.plan.passes)


def test_plan_file_replays_the_rewrite(transformer, least, tmp_path):
    from onnxplan.executor.prepare import adopt_plan

    _, outs = least
    path = tmp_path / "plan.json"
    path.write_text(outs["rotor"].plan.dumps())
    plan = Plan.load(path)
    g = adopt_plan(transformer, plan)
    assert [n.name for n in g.nodes if "@rc" in n.name]
    bad = replace(plan, passes=tuple(p if not p.startswith("recompute:") else "recompute:L3.zz" for p in plan.passes))
    with pytest.raises(ModelError, match="malformed recompute schedule"):
        adopt_plan(transformer, bad)


def test_auto_strategy_under_a_budget(transformer, least):
    plain, outs = least
    budget = (plain + outs["rotor"].plan.peak_bytes) // 2
    out, why = fit_budget(transformer, replace(OPTS, budget=budget))
    info = out.plan.strategy
    assert info.chosen in AUTO_STRATEGIES and why == info.reason  # recompute, swap, joint-quick
    assert {c.strategy for c in info.candidates} >= {"none", "recompute"}
    assert out.plan.peak_bytes <= budget
    out, why = fit_budget(transformer, replace(OPTS, budget=plain))
    assert out.plan.strategy.chosen == "none"


def test_cli_plan_and_explain(tmp_path, monkeypatch):
    runner = CliRunner()
    path = tmp_path / "p.json"
    r = runner.invoke(app, ["plan", "mlp", "--batch", "4", "--checkpoint", "sqrt", "--no-profile", "--planner",
                            "best-fit", "-o", str(path)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["explain", str(path)])
    assert r.exit_code == 0 and "keep" in r.output and "stage" in r.output, r.output
    r = runner.invoke(app, ["explain", str(path), "--json"])
    assert json.loads(r.output)["checkpoint"]["policy"] == "sqrt"
    r = runner.invoke(app, ["plan", "mlp", "--batch", "4", "--checkpoint", "bogus"])
    assert r.exit_code == 2 and "invalid --checkpoint" in r.output
    r = runner.invoke(app, ["explain", str(tmp_path / "missing.json")])
    assert r.exit_code == 2
    plain = tmp_path / "plain.json"
    assert runner.invoke(app, ["plan", "mlp", "--batch", "4", "--planner", "best-fit", "-o", str(plain)]).exit_code == 0
    r = runner.invoke(app, ["explain", str(plain)])
    assert r.exit_code == 0 and "no recomputation" in r.output
    r = runner.invoke(app, ["plan", "mlp", "--batch", "4", "--checkpoint", "rotor", "--budget", "1KiB", "--no-profile"])
    assert r.exit_code == 3 and r.output.count("\n") >= 1


def test_cli_run_with_checkpoint(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["run", "mlp", "--batch", "4", "--checkpoint", "sqrt", "--no-profile", "--no-measure",
                            "--steps", "2", "--warmup", "0", "--planner", "best-fit", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert any(p.startswith("recompute:") for p in out["passes"]) and out["predicted_step_seconds"] > 0
    path = tmp_path / "p.json"
    assert runner.invoke(app, ["plan", "mlp", "--batch", "4", "--checkpoint", "sqrt", "--no-profile",
                               "--planner", "best-fit", "-o", str(path)]).exit_code == 0
    r = runner.invoke(app, ["run", "mlp", "--batch", "4", "--plan", str(path), "--no-measure", "--steps", "1",
                            "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["loss"] == out["loss"][:1], r.output
    r = runner.invoke(app, ["run", "mlp", "--batch", "4", "--plan", str(path), "--checkpoint", "rotor"])
    assert r.exit_code == 2 and "--plan fixes the plan" in r.output
