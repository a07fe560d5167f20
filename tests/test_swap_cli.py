"""`onnxplan plan --swap ...`: options, what auto chose, the budget floor (exit 3), the plan JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onnxplan.cli.app import app
from onnxplan.plan import Plan

runner = CliRunner()


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mlp-swap")
    result = runner.invoke(app, ["models", "build", "mlp", "--batch", "4", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    return out


def _plan(*args: str):
    return runner.invoke(app, ["plan", *args, "--planner", "best-fit"])


def test_swap_policy_option_writes_swaps(mlp, tmp_path):
    out = tmp_path / "plan.json"
    r = _plan(str(mlp), "--swap", "proactive", "--lookahead", "2", "-o", str(out), "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["swaps"] and d["options"]["swap"]["lookahead"] == 2
    assert Plan.load(out).swaps == Plan.from_json(d).swaps
    r = _plan(str(mlp), "--swap", "window", "--window-bytes", "64KiB")
    assert r.exit_code == 0, r.stderr
    assert "swap window (64.00 KiB)" in r.stdout


def test_swap_auto_says_what_it_chose(mlp):
    """--swap auto (what a --budget alone falls back to): swap only when order and planner
    alone miss the budget, and say which policy it chose."""
    full = json.loads(_plan(str(mlp), "--json").stdout)["peak_bytes"]
    r = _plan(str(mlp), "--budget", f"{full - 100_000}B", "--swap", "auto")
    assert r.exit_code == 0, r.stderr
    assert "swap auto:" in r.stdout and "chose" in r.stdout
    r = _plan(str(mlp), "--budget", f"{full}B", "--swap", "auto", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["swaps"] == []  # fits without swap


def test_budget_floor_exits_3_with_the_floor(mlp, tmp_path):
    out = tmp_path / "plan.json"
    r = _plan(str(mlp), "--budget", "1KiB", "--swap", "on-demand", "-o", str(out))
    assert r.exit_code == 3
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in r.stdout + r.stderr
    assert "no plan reaches the budget 1.00 KiB: smallest peak" in err
    assert "even swapping everything (on-demand)" in err and "the largest single working set" in err
    r = _plan(str(mlp), "--budget", "1KiB", "--swap", "none")
    assert r.exit_code == 3 and "even swapping" not in r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--swap", "sometimes"], "invalid --swap"),
    (["--swap", "proactive", "--lookahead", "-1"], "invalid --lookahead"),
    (["--swap", "window", "--window-bytes", "lots"], "invalid size"),
])
def test_bad_swap_options_exit_2(mlp, args, needle):
    r = _plan(str(mlp), *args)
    assert r.exit_code == 2, r.stdout
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_plan_swap_dir_prices_for_that_folder_and_the_plan_file_says_so(mlp, tmp_path):
    """plan --swap-dir X records the store its transfers were priced for (folder, bandwidth,
    where the bandwidth came from: here $ONNXPLAN_SWAP_BANDWIDTH); the plan file loads and runs
    with it; a missing folder is one line, exit 2."""
    from tests.cli_asserts import assert_one_line_error

    folder = tmp_path / "swapdir"
    folder.mkdir()
    out = tmp_path / "plan.json"
    r = _plan(str(mlp), "--swap", "reduced", "--swap-dir", str(folder), "-o", str(out))
    assert r.exit_code == 0, r.stderr
    store = json.loads(out.read_text())["swap"]["store"]
    assert store["folder"] == str(folder) and store["source"] == "override" and store["bandwidth"] == 2.5e8
    assert Plan.load(out).swap.store == store
    r = runner.invoke(app, ["run", "--plan", str(out), "--steps", "1", "--warmup", "0", "--swap-dir", str(folder)])
    assert r.exit_code == 0, r.stderr
    assert_one_line_error(_plan(str(mlp), "--swap", "reduced", "--swap-dir", str(tmp_path / "missing")), 2,
                          "no such folder")
