"""The regression gate: unchanged results pass, a 2% bigger plan fails naming the row, bad files exit 2."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from onnxplan.bench.results import dumps_results, new_results
from onnxplan.check import compare, parse_tolerance
from onnxplan.cli.app import app
from onnxplan.errors import ModelError, UsageError

runner = CliRunner()


def _row(model: str, strategy: str, peak: int, measured: int | None = None, step: float | None = None) -> dict:
    return {"model": model, "batch": 4, "strategy": strategy, "planned_peak_bytes": peak,
            "lower_bound_bytes": peak - 100, "measured_peak_bytes": measured, "median_step_seconds": step}


def _doc(rows: list[dict]) -> dict:
    doc = new_results({"strategies": sorted({r["strategy"] for r in rows})})
    doc["rows"] = rows
    return doc


BASE = [_row("mlp", "auto", 1_000_000, 3_000_000, 0.010), _row("mlp", "nntrainer+sort", 1_200_000),
        _row("vgg16", "auto", 50_000_000, 90_000_000, 1.0)]


@pytest.fixture
def files(tmp_path):
    def write(name: str, rows: list[dict]) -> str:
        path = tmp_path / name
        path.write_text(dumps_results(_doc(rows)))
        return str(path)
    return write


def _check(*args: str):
    return runner.invoke(app, ["check", *args])


def test_unchanged_results_pass(files):
    base = files("base.json", BASE)
    res = _check(files("new.json", copy.deepcopy(BASE)), "--baseline", base)
    assert res.exit_code == 0, res.output
    assert "3 rows compared" in res.output and "0 worse" in res.output


def test_plan_two_percent_bigger_fails_naming_the_row(files):
    rows = copy.deepcopy(BASE)
    rows[2]["planned_peak_bytes"] = int(rows[2]["planned_peak_bytes"] * 1.02)
    res = _check(files("new.json", rows), "--baseline", files("base.json", BASE), "--tolerance", "1%")
    assert res.exit_code == 1, res.output
    assert "vgg16" in res.output and "auto" in res.output and "+2.00%" in res.output
    assert "1 worse" in res.output


def test_growth_within_tolerance_passes_and_improvement_is_reported(files):
    rows = copy.deepcopy(BASE)
    rows[0]["planned_peak_bytes"] = 1_005_000  # +0.5%
    rows[1]["planned_peak_bytes"] = 1_100_000  # better
    res = _check(files("new.json", rows), "--baseline", files("base.json", BASE))
    assert res.exit_code == 0, res.output
    assert "1 better" in res.output


def test_measured_metrics_and_latency(files):
    rows = copy.deepcopy(BASE)
    rows[0]["median_step_seconds"] = 0.020
    base = files("base.json", BASE)
    new = files("new.json", rows)
    assert _check(new, "--baseline", base, "--metric", "measured_peak").exit_code == 0
    res = _check(new, "--baseline", base, "--metric", "latency")
    assert res.exit_code == 1 and "+100.00%" in res.output
    assert _check(new, "--baseline", base, "--metric", "latency", "--tolerance", "150%").exit_code == 0


def test_missing_rows_fail_unless_allowed(files):
    base = files("base.json", BASE)
    new = files("new.json", copy.deepcopy(BASE[:2]))
    res = _check(new, "--baseline", base)
    assert res.exit_code == 1 and "missing" in res.output and "vgg16" in res.output
    assert _check(new, "--baseline", base, "--allow-missing").exit_code == 0


@pytest.mark.parametrize("content", ["", "{not json", "[]", '{"schema_version": 1}',
                                     '{"schema_version": 99, "rows": []}',
                                     '{"schema_version": 1, "rows": [{"model": "mlp"}]}',
                                     ('{"schema_version": 1, "rows": [{"model": "mlp", "strategy": "auto", '
                                     '"planned_peak_bytes": "big", "lower_bound_bytes": 1}]}')])
def test_malformed_files_exit_2(files, tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    good = files("good.json", BASE)
    for args in ([str(bad), "--baseline", good], [good, "--baseline", str(bad)]):
        res = _check(*args)
        assert res.exit_code == 2, (content, res.output)
        assert "onnxplan: error:" in res.output and "Traceback" not in res.output


def test_unusable_inputs_exit_2(files, tmp_path):
    good = files("good.json", BASE)
    assert _check(str(tmp_path / "nope.json"), "--baseline", good).exit_code == 2
    assert _check(good, "--baseline", good, "--tolerance", "lots").exit_code == 2
    assert _check(good, "--baseline", good, "--metric", "speed").exit_code == 2
    other = files("other.json", [_row("gpt", "auto", 5_000)])  # a possible row (lower bound = peak - 100)
    res = _check(other, "--baseline", good)
    assert res.exit_code == 2 and "share no row" in res.output
    planned_only = files("planned.json", [_row("mlp", "auto", 1_000_000)])
    res = _check(planned_only, "--baseline", good, "--metric", "measured_peak")
    assert res.exit_code == 2 and "measured_peak_bytes" in res.output


def test_update_baseline_writes_and_exits_0(files, tmp_path):
    rows = copy.deepcopy(BASE)
    rows[0]["planned_peak_bytes"] *= 2
    new = files("new.json", rows)
    base = files("base.json", BASE)
    res = _check(new, "--baseline", base, "--update-baseline")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "base.json").read_text())["rows"][0]["planned_peak_bytes"] == 2_000_000
    assert _check(new, "--baseline", base).exit_code == 0
    fresh = tmp_path / "fresh.json"
    assert _check(new, "--baseline", str(fresh), "--update-baseline").exit_code == 0
    assert fresh.exists()


def test_parse_tolerance_and_compare():
    assert parse_tolerance("1%", "planned_peak") == pytest.approx(0.01)
    assert parse_tolerance("0.05", "latency") == pytest.approx(0.05)
    assert parse_tolerance(None, "measured_peak") == pytest.approx(0.10)
    with pytest.raises(UsageError):
        parse_tolerance("-1%", "planned_peak")
    res = compare(_doc(BASE), _doc(BASE), "planned_peak", 0.0)
    assert res.compared == 3 and not res.regressions
    with pytest.raises(ModelError):
        compare(_doc([_row("x", "y", 1)]), _doc(BASE))
