"""The bench sweep on a Dask cluster (`bench --workers N` / `--scheduler ADDRESS`).

Every (model, strategy) row and every (model, peer) is one Dask task; the client keeps the
results document, saves it after every finished task (resume works as in-process) and drives
the progress display. Planning runs in parallel freely; a timed run (a measured row, a peer)
holds a per-host Dask lock, so no two timed runs share one machine's cores. A task whose
worker dies is retried by the scheduler (`distributed.scheduler.allowed-failures`); when it
keeps failing, or raises, it is recorded under `failed` with its cause and the sweep goes on.
"""

from __future__ import annotations

import contextlib
import logging
import platform
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from onnxplan.bench.measure import measure_rounds
from onnxplan.bench.peers import combine_rounds, measure_peer
from onnxplan.bench.results import peer_key, plan_key, row_key
from onnxplan.bench.strategies import Strategy
from onnxplan.bench.sweep import (
    BenchConfig,
    _fill_peers,
    _loadavg,
    _peers_todo,
    _row_done,
    _start_run,
    model_meta,
    plan_entry,
    plan_one,
)
from onnxplan.errors import UsageError
from onnxplan.ir.graph import StepGraph
from onnxplan.loading.artifacts import ARTIFACT_FILES
from onnxplan.loading.resolve import resolve_artifacts
from onnxplan.loading.step import step_at

__all__ = ["open_client", "peer_task", "row_task", "run_bench_dask"]

CONNECT_TIMEOUT = "10s"  # how long --scheduler keeps trying to reach the scheduler before a usage error

# per worker process: request -> (folder, meta, StepGraph), reused by its rows
_MODELS: dict[Any, tuple[Path, dict, StepGraph]] = {}


def open_client(scheduler: str | None = None, workers: int | None = None):
    """A dask.distributed Client: on the cluster at `scheduler`, or on a new LocalCluster of
    `workers` processes (one thread each). A context manager; closes what it started."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise UsageError("--workers/--scheduler need dask.distributed: pip install 'onnxplan[dask]'") from None
    return _client(Client, LocalCluster, scheduler, workers)


@contextlib.contextmanager
def _client(Client, LocalCluster, scheduler, workers) -> Iterator[Any]:
    if scheduler is not None:
        try:
            client = Client(scheduler, timeout=CONNECT_TIMEOUT)
        except (OSError, TimeoutError, ValueError) as e:
            raise UsageError(f"--scheduler {scheduler}: cannot connect ({str(e).splitlines()[0]})") from None
        with client:
            yield client
        return
    import dask

    # one row at a time per worker: a worker that dies takes no queued row down with it
    with dask.config.set({"distributed.scheduler.worker-saturation": 1.0}), \
            LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                         silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        yield client


@contextlib.contextmanager
def _timed_run_lock() -> Iterator[None]:
    """One timed run at a time on this host, across all the cluster's workers on it."""
    from distributed import Lock

    with Lock(f"onnxplan-timed-run-{platform.node()}"):
        yield


def _model(config: BenchConfig, model: str, folder: str | None) -> tuple[Path, dict, StepGraph]:
    """(artifact folder, metadata, step graph) of `model` on this worker, once per worker process.

    `folder` is where the client found the artifacts: on the same machine (a LocalCluster, a
    shared cache) they are used as they are; elsewhere the worker resolves them into its own
    cache (for a zoo model that builds its forward model to find the cache entry)."""
    key = config.request(model)
    if key not in _MODELS:
        here = folder is not None and all((Path(folder) / f).is_file() for f in ARTIFACT_FILES)
        where = Path(folder) if folder is not None and here else resolve_artifacts(key)
        _MODELS[key] = where, model_meta(where, config, model), step_at(where, key)
    return _MODELS[key]


def row_task(config: BenchConfig, model: str, strategy: Strategy, folder: str | None = None) -> tuple[dict, dict]:
    """On a worker: plan (and measure) one row; (row, plan entry). Its config.rounds runs go back
    to back (a task cannot alternate with the peers' tasks)."""
    where, meta, graph = _model(config, model, folder)
    row, plan = plan_one(graph, model, meta, strategy, config)
    if config.measure:
        with _timed_run_lock():
            row.update(measure_rounds(where, plan, config.repeat, config.warmup, config.rounds,
                                      threads=config.thread_count, warmup_seconds=config.warmup_seconds))
        row["measured"] = row["measured_peak_bytes"] is not None
    return row, plan_entry(plan, strategy.name, meta.get("batch"))


def peer_task(config: BenchConfig, model: str, peer: str, folder: str | None = None) -> dict:
    """On a worker: one peer's figures for one model, as measure_peer gives them."""
    where = _model(config, model, folder)[0]
    with _timed_run_lock():
        figures = combine_rounds([measure_peer(peer, where, config.repeat, config.warmup, threads=config.thread_count,
                                               warmup_seconds=config.warmup_seconds)
                                  for _ in range(config.rounds)], "peak_bytes", "error")
    return {**figures, "host": platform.node()}


def _cause(error: BaseException) -> str:
    from distributed import KilledWorker

    if isinstance(error, KilledWorker):
        return f"the worker running it died (every try; last worker {error.last_worker.address})"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def run_bench_dask(config: BenchConfig, doc: dict[str, Any], save: Callable[[dict], None], client,
                   advance: Callable[[str, int], None] = lambda text, n: None,
                   row_fn: Callable = row_task, peer_fn: Callable = peer_task) -> dict[str, Any]:
    """Fill `doc` like run_bench, with the rows computed on `client`'s cluster.

    Artifacts are resolved here first (a bad model fails before any task) and again on each
    worker (from that machine's cache). Rows come back in any order; `doc["rows"]` ends in the
    sweep's order. `row_fn`/`peer_fn` replace the tasks (tests).
    """
    from distributed import as_completed


    rows = {row_key(r): r for r in doc["rows"]}
    failed = doc.setdefault("failed", [])
    run, t0 = _start_run(doc), time.perf_counter()
    tasks: dict[Any, tuple] = {}
    for model in config.models:
        advance(f"{model}: artifacts", 0)
        folder = resolve_artifacts(config.request(model))
        batch = model_meta(folder, config, model).get("batch")
        for strategy in config.strategies:
            if _row_done(rows.get((model, batch, strategy.name)), config):
                advance(f"{model} {strategy.name}: kept", 1)
                continue
            tasks[client.submit(row_fn, config, model, strategy, str(folder), pure=False)] = ("row", model, batch, strategy.name)
        todo = _peers_todo(doc, peer_key(model, batch), config)
        advance(f"{model}: peers", len(config.peers) - len(todo))
        for peer in todo:
            tasks[client.submit(peer_fn, config, model, peer, str(folder), pure=False)] = ("peer", model, batch, peer)

    def finish(text: str) -> None:
        run.update(wall_seconds=round(time.perf_counter() - t0, 1), rows_after=len(rows), loadavg_end=_loadavg())
        save(doc)
        advance(text, 1)

    for future in as_completed(list(tasks)):
        kind, model, batch, name = tasks.pop(future)
        what = {"model": model, "batch": batch, ("strategy" if kind == "row" else "peer"): name}
        failed[:] = [f for f in failed if {k: f.get(k) for k in what} != what]
        try:
            result = future.result()
        except Exception as e:  # noqa: BLE001 (the task raised, or its worker died on every try)
            failed.append({**what, "host": None, "error": _cause(e)})
            finish(f"{model} {name}: failed")
            continue
        if kind == "row":
            row, entry = result
            rows[(model, batch, name)] = row
            doc["plans"][plan_key(model, batch, name)] = entry
            doc["rows"] = list(rows.values())
            _fill_peers(doc, model, batch)
            finish(f"{model} {name}: done on {row['host']}")
        else:
            doc["peers"].setdefault(peer_key(model, batch), {})[name] = result
            _fill_peers(doc, model, batch)
            finish(f"{model}: {name} done on {result['host']}")
    order = {(m, s.name): i for i, (m, s) in enumerate((m, s) for m in config.models for s in config.strategies)}
    doc["rows"] = sorted(rows.values(), key=lambda r: order.get((r["model"], r["strategy"]), len(order)))
    if not failed:
        doc.pop("failed")
    save(doc)
    return doc
