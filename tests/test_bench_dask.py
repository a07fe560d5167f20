"""bench on Dask: a LocalCluster sweep equals the in-process one; a dying worker loses only its row."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from onnxplan.bench import BenchConfig, load_results, new_results, parse_strategies
from onnxplan.bench.results import dumps_results
from onnxplan.cli.app import app

distributed = pytest.importorskip("distributed")
from onnxplan.bench.dask_sweep import row_task, run_bench_dask

runner = CliRunner()
# no ILP in these strategies: a time-limited solve could differ between two loaded runs
STRATEGIES = "given+best-fit,nntrainer+sort,greedy+greedy-size"
VARYING = {"solve_seconds", "host"}


@pytest.mark.slow
def test_local_cluster_sweep_equals_the_in_process_sweep(tmp_path):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    args = ["mlp", "mlp-frozen", "--no-measure", "--strategies", STRATEGIES, "--json"]
    res = runner.invoke(app, ["bench", *args, "-o", str(one)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["bench", *args, "-o", str(two), "--workers", "2"])
    assert res.exit_code == 0, res.output
    a, b = load_results(one), load_results(two)
    assert len(a["rows"]) == len(b["rows"]) == 6
    strip = lambda rows: [{k: v for k, v in r.items() if k not in VARYING} for r in rows]
    assert strip(a["rows"]) == strip(b["rows"])  # same rows, same order, same planned peaks
    assert a["plans"] == b["plans"]  # the very same plans (order, offsets)
    assert all(r["host"] for r in b["rows"]) and "failed" not in b
    # resume: a second run keeps every row and runs nothing
    res = runner.invoke(app, ["bench", *args, "-o", str(two), "--workers", "2"])
    assert res.exit_code == 0 and json.loads(two.read_text())["runs"][-1]["rows_after"] == 6


@pytest.fixture(scope="module")
def client():
    import dask

    # worker-saturation 1.0 as open_client: a dying worker holds no queued row of another test
    with dask.config.set({"distributed.scheduler.allowed-failures": 1,
                          "distributed.scheduler.worker-saturation": 1.0}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                     dashboard_address=None, silence_logs=50) as cluster, \
            distributed.Client(cluster) as c:
        yield c


def _sweep(tmp_path, client, row_fn):
    config = BenchConfig(["mlp"], parse_strategies("given+best-fit,nntrainer+sort"), peers=[], measure=False)
    out = tmp_path / "r.json"
    doc = run_bench_dask(config, new_results(config.to_json()), lambda d: out.write_text(dumps_results(d)),
                         client, row_fn=row_fn)
    return doc, load_results(out)  # the file on disk stays valid


def test_a_worker_dying_once_mid_row_is_retried(tmp_path, client):
    marker = str(tmp_path / "died")

    def dies_once(config, model, strategy, folder):
        if strategy.name == "nntrainer+sort" and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(17)  # the worker process dies in the middle of the row
        return row_task(config, model, strategy, folder)

    doc, saved = _sweep(tmp_path, client, dies_once)
    assert os.path.exists(marker)
    assert sorted(r["strategy"] for r in saved["rows"]) == ["given+best-fit", "nntrainer+sort"]
    assert "failed" not in doc


def test_a_row_whose_worker_always_dies_is_recorded_with_its_cause(tmp_path, client):
    def always_dies(config, model, strategy, folder):
        if strategy.name == "nntrainer+sort":
            os._exit(17)
        return row_task(config, model, strategy, folder)

    _, saved = _sweep(tmp_path, client, always_dies)
    assert [r["strategy"] for r in saved["rows"]] == ["given+best-fit"]  # the other row is kept
    [failure] = saved["failed"]
    assert failure["model"] == "mlp" and failure["strategy"] == "nntrainer+sort"
    assert "worker running it died" in failure["error"]


def test_a_row_that_raises_is_recorded_and_bench_exits_1(tmp_path, client):
    def raises(config, model, strategy, folder):
        if strategy.name == "nntrainer+sort":
            raise MemoryError("no room")
        return row_task(config, model, strategy, folder)

    _, saved = _sweep(tmp_path, client, raises)
    assert saved["failed"][0]["error"] == "MemoryError: no room"


@pytest.mark.slow
def test_workers_and_scheduler_usage_errors(tmp_path, monkeypatch):
    from onnxplan.bench import dask_sweep

    monkeypatch.setattr(dask_sweep, "CONNECT_TIMEOUT", "1s")  # nothing listens on port 9: no need to wait 10 s
    for args in (["--workers", "0"], ["--workers", "2", "--scheduler", "tcp://x:1"]):
        res = runner.invoke(app, ["bench", "mlp", "--no-measure", *args])
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    res = runner.invoke(app, ["bench", "mlp", "--no-measure", "--scheduler", "tcp://127.0.0.1:9"])
    assert res.exit_code == 2 and "cannot connect" in res.output, res.output


def test_timed_runs_take_turns_on_one_host(client):
    from onnxplan.bench.dask_sweep import _timed_run_lock

    def timed(i):
        import time

        with _timed_run_lock():
            start = time.time()
            time.sleep(0.5)
            return start, time.time()

    spans = sorted(client.gather([client.submit(timed, i, pure=False) for i in range(2)]))
    assert spans[0][1] <= spans[1][0]  # the second began after the first ended
