"""onnxplan bench: rows and plans in documented JSON, pandas in one call, CSV, resume, bad input."""

from __future__ import annotations

import dataclasses
import itertools
import json
import statistics

import pandas as pd
import pytest
from typer.testing import CliRunner

from onnxplan.bench import ROW_FIELDS, load_results
from onnxplan.bench.strategies import DEFAULT_STRATEGIES, Strategy, parse_strategies, parse_strategy
from onnxplan.bench.sweep import DEFAULT_WARMUP, DEFAULT_WARMUP_SECONDS
from onnxplan.cli.app import app
from onnxplan.errors import UsageError

runner = CliRunner()
PLANNED = ["--no-measure", "--strategies", "auto,nntrainer+sort,given+best-fit,no-interleave"]


def _bench(*args: str):
    return runner.invoke(app, ["bench", *args])


@pytest.fixture(scope="module")
def mlp_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "results.json"
    res = _bench("mlp", *PLANNED, "-o", str(out), "--csv", str(out.with_suffix(".csv")), "--budget", "5MiB")
    assert res.exit_code == 0, res.output
    return out


def test_results_rows_and_plans(mlp_results):
    doc = json.loads(mlp_results.read_text())
    assert doc["schema_version"] == 1 and doc["kind"] == "onnxplan-bench"
    assert doc["machine"]["cpus"] and doc["created"]
    rows = doc["rows"]
    assert [r["strategy"] for r in rows] == ["auto", "nntrainer+sort", "given+best-fit", "no-interleave"]
    for r in rows:
        assert set(ROW_FIELDS) <= set(r)
        assert r["model"] == "mlp" and r["batch"] == 64
        assert r["lower_bound_bytes"] <= r["planned_peak_bytes"] == r["persistent_bytes"] + r["arena_bytes"]
        assert r["measured_peak_bytes"] is None and r["ort_peak_bytes"] is None  # --no-measure: no runs
        assert r["budget_bytes"] == 5 * 2**20 and r["fits_budget"] is True
        plan = doc["plans"][f"mlp|64|{r['strategy']}"]
        assert plan["arena_bytes"] == r["arena_bytes"] and plan["buffers"]
        cols = doc["buffer_columns"]
        for b in plan["buffers"]:  # the layout the report draws: inside the arena
            b = dict(zip(cols, b))
            assert 0 <= b["offset"] and b["offset"] + b["bytes"] <= plan["arena_bytes"]
            assert b["first_eo"] <= b["last_eo"] < plan["eo_count"]
    by = {r["strategy"]: r for r in rows}
    assert by["auto"]["planned_peak_bytes"] <= by["nntrainer+sort"]["planned_peak_bytes"]
    assert by["no-interleave"]["interleave"] is False and by["auto"]["interleave"] is True


def test_pandas_in_one_call_and_csv(mlp_results):
    with open(mlp_results) as f:
        df = pd.DataFrame(json.load(f)["rows"])
    assert {"model", "strategy", "planned_peak_bytes", "lower_bound_bytes", "measured_peak_bytes",
            "median_step_seconds", "ort_peak_bytes", "torch_peak_bytes"} <= set(df.columns)
    csv = pd.read_csv(mlp_results.with_suffix(".csv"))
    assert list(csv["strategy"]) == list(df["strategy"])
    assert list(csv["planned_peak_bytes"]) == list(df["planned_peak_bytes"])


def test_resume_keeps_rows_and_adds_only_new_ones(mlp_results, tmp_path):
    out = tmp_path / "r.json"
    out.write_text(mlp_results.read_text())
    before = {r["strategy"]: r for r in json.loads(out.read_text())["rows"]}
    res = _bench("mlp", "--no-measure", "--strategies", "auto,greedy+greedy-size", "-o", str(out))
    assert res.exit_code == 0, res.output
    after = {r["strategy"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(after) == set(before) | {"greedy+greedy-size"}
    assert after["auto"] == before["auto"]  # kept as it was, not re-planned (solve time unchanged)
    res = _bench("mlp", "--no-measure", "--strategies", "auto", "-o", str(out), "--fresh")
    assert res.exit_code == 0 and [r["strategy"] for r in json.loads(out.read_text())["rows"]] == ["auto"]


def test_measured_columns_are_null_with_a_reason_without_an_executor(tmp_path, monkeypatch):
    from onnxplan.bench import measure

    monkeypatch.setattr(measure, "_executor", lambda: None)
    out = tmp_path / "r.json"
    res = _bench("mlp", "--strategies", "auto", "--peers", "none", "--repeat", "1", "-o", str(out))
    assert res.exit_code == 0, res.output
    row = load_results(out)["rows"][0]
    assert row["measured_peak_bytes"] is None and row["measured"] is False
    assert "not available" in row["measure_error"]


def test_measured_columns_come_from_measure_run(tmp_path, monkeypatch):
    from onnxplan.bench import measure

    class FakeExecutor:
        @staticmethod
        def measure_run(folder, plan, *, steps, warmup, seed, threads, warmup_seconds):
            assert steps == 3 and warmup == DEFAULT_WARMUP and threads == 1  # bench's --threads reaches the run
            assert warmup_seconds == DEFAULT_WARMUP_SECONDS
            return ({"losses": [2.5, 2.4, 2.3], "step_seconds": [0.3, 0.1, 0.2], "threads": {"blas": 1}},
                    plan.peak_bytes + 1000)

    monkeypatch.setattr(measure, "_executor", lambda: FakeExecutor)
    out = tmp_path / "r.json"
    res = _bench("mlp", "--strategies", "auto", "--peers", "none", "--repeat", "3", "--threads", "1", "-o", str(out))
    assert res.exit_code == 0, res.output
    row = load_results(out)["rows"][0]
    assert row["measured_peak_bytes"] == row["planned_peak_bytes"] + 1000 and row["measured"] is True
    assert row["threads"] == 1 and row["pool_threads"] == {"blas": 1}  # what each pool got, per row
    assert row["median_step_seconds"] == pytest.approx(0.2) and row["min_step_seconds"] == pytest.approx(0.1)
    assert row["max_step_seconds"] == pytest.approx(0.3) and row["first_loss"] == 2.5


@pytest.mark.slow
def test_peers_measured_in_the_same_run(tmp_path):
    out = tmp_path / "r.json"
    res = _bench("mlp", "--no-measure", "--strategies", "auto", "--peers", "ort,torch", "--repeat", "2",
                 "-o", str(out))
    assert res.exit_code == 0, res.output
    doc = load_results(out)
    row = doc["rows"][0]
    for peer in ("ort", "torch"):
        assert row[f"{peer}_error"] is None, row[f"{peer}_error"]
        assert row[f"{peer}_peak_bytes"] > 0 and row[f"{peer}_median_step_seconds"] > 0
        assert doc["peers"]["mlp|64"][peer]["steps_timed"] == 2
    assert row["torch_first_loss"] == pytest.approx(row["ort_first_loss"], rel=1e-4)


@pytest.mark.parametrize("args, message", [
    (["nosuchmodel", "--no-measure"], "nosuchmodel"),
    (["mlp", "--all", "--no-measure"], "not both"),
    (["--no-measure"], "no model"),
    (["mlp", "--strategies", "fastest", "--no-measure"], "unknown strategy"),
    (["mlp", "--peers", "tf", "--no-measure"], "unknown peer"),
    (["mlp", "--batch", "0", "--no-measure"], "--batch"),
    (["mlp", "--budget", "lots", "--no-measure"], "invalid size"),
    (["mlp", "--no-measure", "-o", "/nonexistent/dir/r.json"], "does not exist"),
])
def test_bad_input_exits_2(args, message):
    res = _bench(*args)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_malformed_existing_output_is_left_alone(tmp_path):
    out = tmp_path / "r.json"
    out.write_text('{"rows": 3}')
    res = _bench("mlp", "--no-measure", "--strategies", "auto", "-o", str(out))
    assert res.exit_code == 2 and out.read_text() == '{"rows": 3}'


def test_strategy_names():
    assert parse_strategy("auto") == Strategy("auto", "auto", "auto", True, True)
    assert parse_strategy(" auto ").name == "auto"
    s = parse_strategy("nntrainer+sort/no-interleave")
    assert (s.order, s.planner, s.interleave, s.inplace) == ("nntrainer", "sort", False, True)
    s = parse_strategy("no-inplace")
    assert (s.order, s.planner, s.inplace) == ("auto", "auto", False)
    assert [s.name for s in parse_strategies(None)] == list(DEFAULT_STRATEGIES)
    assert next(s.name for s in parse_strategies("auto,default")) == "auto"
    for bad in ("greedy", "given+magic", "auto/no-sleep", "ilp+"):
        with pytest.raises(UsageError):
            parse_strategy(bad)
    opts = parse_strategy("given+best-fit").options(3.0)
    assert dataclasses.astuple(opts)[:5] == ("given", "best-fit", True, True, 3.0)


def test_identical_plans_are_run_once(tmp_path, monkeypatch):
    from onnxplan.bench import measure

    calls = []

    class CountingExecutor:
        @staticmethod
        def measure_run(folder, plan, *, steps, warmup, seed, threads, warmup_seconds):
            calls.append(plan.planner)
            return {"losses": [1.0], "step_seconds": [0.1] * steps}, 1234

    monkeypatch.setattr(measure, "_executor", lambda: CountingExecutor)
    out = tmp_path / "r.json"
    res = _bench("mlp", "--strategies", "no-interleave,auto/no-interleave,nntrainer+sort", "--peers", "none",
                 "--repeat", "1", "-o", str(out))
    assert res.exit_code == 0, res.output
    rows = {r["strategy"]: r for r in load_results(out)["rows"]}
    assert len(calls) == 2
    assert rows["auto/no-interleave"]["measured_as"] == "no-interleave"
    assert rows["auto/no-interleave"]["measured_peak_bytes"] == 1234 and rows["nntrainer+sort"]["measured_as"] is None


def test_rounds_combine_as_the_median_of_each_rounds_median():
    from onnxplan.bench.peers import combine_rounds

    runs = [{"median_step_seconds": m, "min_step_seconds": m - 0.01, "max_step_seconds": m + 0.01,
             "steps_timed": 5, "peak_bytes": p, "first_loss": loss, "error": None}
            for m, p, loss in ((0.30, 100, 2.5), (0.10, 300, 2.6), (0.20, 200, 2.7))]
    out = combine_rounds(runs, "peak_bytes", "error")
    assert out["median_step_seconds"] == 0.20 and out["rounds"] == 3  # not the mean (0.2 too), not the first
    assert out["round_median_step_seconds"] == [0.30, 0.10, 0.20]
    assert out["min_step_seconds"] == pytest.approx(0.09) and out["max_step_seconds"] == pytest.approx(0.31)
    assert out["steps_timed"] == 15 and out["peak_bytes"] == 300 and out["first_loss"] == 2.5
    runs[0]["median_step_seconds"] = 0.05  # the median moves with the rounds, the mean would be 0.117
    assert combine_rounds(runs, "peak_bytes", "error")["median_step_seconds"] == 0.10
    failed = {**runs[1], "median_step_seconds": None, "peak_bytes": None, "error": "killed"}
    out = combine_rounds([runs[0], failed, runs[2]], "peak_bytes", "error")
    assert out["error"] == "killed" and out["median_step_seconds"] is None and out["rounds"] == 3
    untimed = {**runs[1], "median_step_seconds": None, "min_step_seconds": None, "max_step_seconds": None}
    out = combine_rounds([runs[0], untimed], "peak_bytes", "error")  # no error, but no step timed
    assert out["median_step_seconds"] is None and out["round_median_step_seconds"] is None
    one = combine_rounds(runs[:1], "peak_bytes", "error")
    assert one["median_step_seconds"] == 0.05 and one["rounds"] == 1 and one["steps_timed"] == 5


def test_rounds_alternate_ours_and_the_peers(tmp_path, monkeypatch):
    from onnxplan.bench import measure, sweep

    calls: list[str] = []
    level = itertools.cycle([0.3, 0.1, 0.2, 0.9, 0.7, 0.8, 0.4])

    class FakeExecutor:
        @staticmethod
        def measure_run(folder, plan, *, steps, warmup, seed, threads, warmup_seconds):
            calls.append("ours")
            return {"losses": [2.0], "step_seconds": [next(level)] * steps}, 4096

    def fake_peer(peer, folder, repeat, warmup, threads=None, warmup_seconds=0.0):
        calls.append(peer)
        s = next(level)
        return {"peak_bytes": 1 << 20, "median_step_seconds": s, "min_step_seconds": s, "max_step_seconds": s,
                "steps_timed": repeat, "first_loss": 2.0, "error": None, "threads": {"threads": threads}}

    monkeypatch.setattr(measure, "_executor", lambda: FakeExecutor)
    monkeypatch.setattr(sweep, "measure_peer", fake_peer)
    out = tmp_path / "r.json"
    args = ["mlp", "--strategies", "auto,no-interleave", "--peers", "ort", "--repeat", "2", "--rounds", "3",
            "--threads", "1", "-o", str(out)]
    res = _bench(*args)
    assert res.exit_code == 0, res.output
    distinct = calls.count("ours") // 3  # the two strategies run one program or two; each every round
    ours_first, peers_first = ["ours"] * distinct + ["ort"], ["ort"] + ["ours"] * distinct
    assert calls == ours_first + peers_first + ours_first  # the order turns round by round
    doc = load_results(out)
    assert doc["config"]["rounds"] == 3
    row = doc["rows"][0]
    assert row["rounds"] == 3 and len(row["round_median_step_seconds"]) == 3 and row["steps_timed"] == 6
    assert row["median_step_seconds"] == statistics.median(row["round_median_step_seconds"])
    ort = doc["peers"]["mlp|64"]["ort"]
    assert ort["rounds"] == 3 and row["ort_median_step_seconds"] == statistics.median(ort["round_median_step_seconds"])
    calls.clear()
    assert _bench(*args).exit_code == 0 and calls == []  # resumed: every row and peer kept
    assert _bench(*args[:-4], "--rounds", "2", "--threads", "1", "-o", str(out)).exit_code == 0
    assert calls.count("ort") == 2 and load_results(out)["rows"][0]["rounds"] == 2  # other rounds: measured again
    from onnxplan.report import markdown_summary

    assert "in 2 fresh processes each" in markdown_summary([load_results(out)])


def test_bad_rounds_exit_2():
    res = _bench("mlp", "--rounds", "0", "--no-measure")
    assert res.exit_code == 2 and "--rounds" in res.output
