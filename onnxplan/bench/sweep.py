"""The bench sweep: model x strategy -> planned, measured and peer figures, resumable."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from onnxplan.bench.measure import MEASURED_FIELDS, measure_plan
from onnxplan.bench.peers import combine_rounds, measure_peer, peer_row_fields
from onnxplan.bench.result_models import BenchRow, PeerFigures
from onnxplan.bench.results import ROW_FIELDS, peer_key, plan_key, row_key
from onnxplan.bench.strategies import Strategy
from onnxplan.budget import DEFAULT_PROFILE, MemoryRequest, chosen_strategy, cost_model, plan_for_budget
from onnxplan.data import read_metadata
from onnxplan.errors import OnnxplanError, UsageError
from onnxplan.json_models import record_of
from onnxplan.loading.request import LoadRequest
from onnxplan.loading.resolve import resolve_artifacts
from onnxplan.loading.step import step_at
from onnxplan.planning import plan_step
from onnxplan.threads import resolve_threads

__all__ = ["BenchConfig", "check_timing", "count_tasks", "plan_entry", "plan_one", "run_bench"]


# Untimed steps before a measured run's timed ones (bench --warmup). A fresh process's first steps
# run slow on both sides: ours took 5.9, 2.2, 1.7, 1.65, then 1.5 ms on mlp b64 at 2 threads (its
# code paths' first runs, the thread pools' first jobs; a second executor in the same process ran
# at 1.5 ms from its second step), ONNX Runtime's 5.2, then 2.1-2.3 ms (reports/threads.md, session
# 22). After one warm-up step, the median of 5 timed steps still held ours' second to fourth.
DEFAULT_WARMUP = 3
# ... and on until the warm-up has lasted this long (bench --warmup-seconds), for ours and the
# peers alike. ONNX Runtime reaches its steady step only after tens of steps of a small model: on
# mlp b64 at 2 threads, three fresh processes took 1.10 / 0.96 / 1.00 ms a step over steps 3-10
# and 0.88 / 0.90 / 0.91 over steps 100-200 (ours 0.83 / 1.13 / 0.98 and 0.84 / 1.17 / 0.93: its
# level from step 3; reports/threads.md, session 27). Three steps of warm-up timed ORT ~10% slow
# on mlp; a quarter of a second is ~250 of its steps, and 1-3 of a larger model's.
DEFAULT_WARMUP_SECONDS = 0.25
MAX_WARMUP_SECONDS = 600.0


def check_timing(repeat: int, warmup: int, rounds: int, warmup_seconds: float) -> None:
    """A UsageError unless the measured runs' counts make sense (bench and onnxplan.bench)."""
    if repeat < 1 or warmup < 0 or rounds < 1 or not 0 <= warmup_seconds <= MAX_WARMUP_SECONDS:
        raise UsageError(f"--repeat and --rounds must be >= 1, --warmup >= 0 and --warmup-seconds "
                         f"0-{MAX_WARMUP_SECONDS:g} (got {repeat}, {rounds}, {warmup}, {warmup_seconds:g})")


@dataclass
class BenchConfig:
    """What one bench run does; `to_json` is stored in the results' `config`."""

    models: list[str]
    strategies: list[Strategy]
    batch: int | None = None
    peers: list[str] = field(default_factory=lambda: ["ort", "torch"])
    repeat: int = 5
    warmup: int = DEFAULT_WARMUP
    measure: bool = True
    time_limit: float | None = None  # None: the anytime default
    budgets: dict[str, int] = field(default_factory=dict)  # model (or "*") -> bytes
    train: tuple[str, ...] = ()  # --train GLOB for every forward .onnx model
    freeze: tuple[str, ...] = ()  # --freeze GLOB for every forward .onnx model
    # model -> its own batch / optimizer / loss / dims (the gate config, onnxplan/gate_config.py)
    model_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    threads: int | None = None  # ours and the peers' (onnxplan.threads); None: every available core
    rounds: int = 1  # fresh processes per measured figure, ours and the peers alternating
    warmup_seconds: float = DEFAULT_WARMUP_SECONDS  # the warm-up runs on until it has lasted this long

    def request(self, model: str):
        """The LoadRequest that resolves `model`'s artifacts."""
        opts = self.model_options.get(model, {})
        return LoadRequest(model, opts.get("batch", self.batch), opts.get("optimizer"), opts.get("loss"),
                            tuple(sorted(opts.get("dims", {}).items())), train=tuple(self.train),
                            freeze=tuple(self.freeze))

    def to_json(self) -> dict[str, Any]:
        return {"models": list(self.models), "strategies": [s.name for s in self.strategies],
                "batch": self.batch, "peers": list(self.peers), "repeat": self.repeat,
                "warmup": self.warmup, "warmup_seconds": self.warmup_seconds, "rounds": self.rounds, "measure": self.measure, "time_limit": self.time_limit,
                "budgets": dict(self.budgets), "threads": self.thread_count,
                **({"train": list(self.train)} if self.train else {}),
                **({"freeze": list(self.freeze)} if self.freeze else {}),
                **({"model_options": dict(self.model_options)} if self.model_options else {})}

    @property
    def thread_count(self) -> int:
        """The threads every measurement of this run gets (resolved: the cores when None)."""
        return resolve_threads(self.threads)

    def budget(self, model: str) -> int | None:
        return self.budgets.get(model, self.budgets.get("*"))


def plan_entry(plan, strategy: str, batch: int | None) -> dict[str, Any]:
    """The chosen plan of a row, as the report draws it (buffers as BUFFER_COLUMNS lists)."""
    return {
        "model": plan.model, "strategy": strategy, "batch": batch, "order_policy": plan.order_policy,
        "planner": plan.planner, "persistent_bytes": plan.persistent_bytes, "arena_bytes": plan.arena_bytes,
        "peak_bytes": plan.peak_bytes, "lower_bound_bytes": plan.lower_bound_bytes, "eo_count": len(plan.order),
        "buffers": [[b.name, b.bytes, b.vclass, b.first_eo, b.last_eo, b.offset] for b in plan.buffers],
    }


def _plan_row(model: str, meta: dict, strategy: Strategy, plan, budget: int | None, threads: int) -> dict[str, Any]:
    row: dict[str, Any] = {k: None for k in ROW_FIELDS}
    row.update(
        model=model, batch=meta.get("batch"), optimizer=meta.get("optimizer"), loss=meta.get("loss"),
        strategy=strategy.name, order=plan.order_policy, planner=plan.planner,
        interleave=strategy.interleave, inplace=strategy.inplace, nodes=len(plan.order),
        buffers=len(plan.buffers), planned_peak_bytes=plan.peak_bytes,
        lower_bound_bytes=plan.lower_bound_bytes, persistent_bytes=plan.persistent_bytes,
        arena_bytes=plan.arena_bytes, fragmentation=plan.fragmentation, solve_seconds=plan.solve_seconds,
        budget_bytes=budget, fits_budget=None if budget is None else plan.peak_bytes <= budget,
        measured=False, steps_timed=0, host=platform.node(), threads=threads,
    )
    return row


def model_meta(folder, config: BenchConfig, model: str) -> dict:
    """The artifacts' onnxplan.json (batch, optimizer, loss), or just the batch asked for."""
    try:
        return read_metadata(folder)
    except OnnxplanError:  # a user's artifact folder from elsewhere: no onnxplan.json
        return {"batch": config.request(model).batch}


def plan_one(graph, model: str, meta: dict, strategy: Strategy, config: BenchConfig):
    """Plan one row: (the row, without measurement, and the plan). A model with a budget is
    planned by the budget layer (onnxplan.budget.decide, its default cost model), as `plan
    --budget` and onnxplan.plan(budget=...) plan it; the row's memory_strategy says which
    strategy it chose."""
    budget = config.budget(model)
    if budget is None:
        plan = plan_step(graph, strategy.options(config.time_limit)).plan
        return _plan_row(model, meta, strategy, plan, None, config.thread_count), plan
    costs = cost_model(DEFAULT_PROFILE, threads=config.thread_count)
    plan = plan_for_budget(graph, strategy.options(config.time_limit), MemoryRequest(budget), costs).plan
    row = _plan_row(model, meta, strategy, plan, budget, config.thread_count)
    row["memory_strategy"] = chosen_strategy(plan)  # what the budget layer chose (budget.decide)
    return row, plan


def _row_done(row: dict | None, config: BenchConfig) -> bool:
    """A row kept from an earlier run: measured when measuring, at this run's thread count."""
    if row is None:
        return False
    r = BenchRow.of(row)
    return not config.measure or (bool(r.measured) and r.threads == config.thread_count
                                  and (r.rounds or 1) == config.rounds)


def _peers_todo(doc: dict, key: str, config: BenchConfig) -> list[str]:
    have = {name: record_of(PeerFigures, figures) for name, figures in doc["peers"].get(key, {}).items()}
    return [p for p in config.peers if p not in have or have[p].error
            or (have[p].threads or {}).get("threads") != config.thread_count
            or (have[p].rounds or 1) != config.rounds]


def count_tasks(config: BenchConfig) -> int:
    """Progress units: one per (model, strategy) and one per (model, peer)."""
    return len(config.models) * (len(config.strategies) + len(config.peers))


def run_bench(config: BenchConfig, doc: dict[str, Any], save: Callable[[dict], None],
              advance: Callable[[str, int], None] = lambda text, n: None) -> dict[str, Any]:
    """Fill `doc` (a results document, possibly from an earlier run) with the missing rows.

    Rows already in `doc` (same model, batch, strategy; measured when measuring, at this run's
    threads and rounds) are kept and skipped, and so are peers already measured. A model's
    plans are made first; then, round by round, each distinct plan runs in a fresh process and
    each peer in its own (alternating, ours first in one round and the peers first in the next,
    so that a slow spell of the machine, or a drift, falls on all of them alike). `save(doc)` runs after every model's rows and peers, so an interrupted run resumes
    where it stopped. `advance(text, n)` reports progress in units of count_tasks(config).
    """
    rows = {row_key(r): r for r in doc["rows"]}
    run, t0 = _start_run(doc), time.perf_counter()
    def save_run(d: dict) -> None:  # `save`, with this run's figures brought up to date
        run.update(wall_seconds=round(time.perf_counter() - t0, 1), rows_after=len(rows), loadavg_end=_loadavg())
        d["rows"] = list(rows.values())
        save(d)

    for model in config.models:
        advance(f"{model}: artifacts", 0)
        folder = resolve_artifacts(config.request(model))
        meta = model_meta(folder, config, model)
        batch = meta.get("batch")
        planned = _plan_model(config, model, folder, meta, rows, advance)
        for key, row, plan in planned:
            rows[key] = row
            doc["plans"][plan_key(model, batch, key[2])] = plan_entry(plan, key[2], batch)
        pkey = peer_key(model, batch)
        todo = _peers_todo(doc, pkey, config)
        advance(f"{model}: peers", len(config.peers) - len(todo))
        if config.measure or todo:
            doc["peers"].setdefault(pkey, {}).update(_measure_model(config, model, folder, planned, todo, advance))
            for key, _, _ in planned if config.measure else ():
                advance(f"{model} {key[2]}: done", 1)
            advance(f"{model}: peers done", len(todo))
        doc["rows"] = list(rows.values())
        _fill_peers(doc, model, batch)
        save_run(doc)
    save_run(doc)
    return doc


def _plan_model(config: BenchConfig, model: str, folder, meta: dict, rows: dict, advance) -> list[tuple]:
    """(row key, row, plan) for each of `model`'s strategies not kept from an earlier run."""
    out, graph = [], None
    for strategy in config.strategies:
        key = (model, meta.get("batch"), strategy.name)
        if _row_done(rows.get(key), config):
            advance(f"{model} {strategy.name}: kept", 1)
            continue
        advance(f"{model} {strategy.name}: planning", 0)
        if graph is None:
            graph = step_at(folder, config.request(model))
        row, plan = plan_one(graph, model, meta, strategy, config)
        out.append((key, row, plan))
        if not config.measure:
            advance(f"{model} {strategy.name}: done", 1)
    return out


def _measure_model(config: BenchConfig, model: str, folder, planned: list[tuple], peers: list[str],
                   advance) -> dict[str, dict]:
    """Run each distinct plan of `planned` (when measuring) and each of `peers`, in
    config.rounds rounds; fill the rows' measured figures; the peers' figures by peer."""
    measured = [(key, row, _fingerprint(plan), plan) for key, row, plan in planned] if config.measure else []
    distinct: dict[str, tuple[str, Any]] = {}  # plan fingerprint -> (strategy, plan): one run per program
    for key, _, fp, plan in measured:
        distinct.setdefault(fp, (key[2], plan))
    ours: dict[str, list] = {fp: [] for fp in distinct}
    theirs: dict[str, list] = {p: [] for p in peers}
    def run_ours(of: str) -> None:
        for fp, (name, plan) in distinct.items():
            advance(f"{model} {name}: running{of}", 0)
            ours[fp].append(measure_plan(folder, plan, config.repeat, config.warmup, threads=config.thread_count,
                                         warmup_seconds=config.warmup_seconds))

    def run_peers(of: str) -> None:
        for peer in peers:
            advance(f"{model}: {peer} (probe){of}", 0)
            theirs[peer].append(measure_peer(peer, folder, config.repeat, config.warmup, threads=config.thread_count,
                                             warmup_seconds=config.warmup_seconds))

    for r in range(config.rounds):  # ours first in odd rounds, the peers first in even ones
        of = f" (round {r + 1}/{config.rounds})" if config.rounds > 1 else ""
        for run in (run_ours, run_peers) if r % 2 == 0 else (run_peers, run_ours):
            run(of)
    figures = {fp: combine_rounds(runs, "measured_peak_bytes", "measure_error") for fp, runs in ours.items()}
    for key, row, fp, _ in measured:
        name, _ = distinct[fp]
        row.update({k: figures[fp][k] for k in MEASURED_FIELDS})
        if name != key[2]:  # the very same program: its run stands for this row too
            row["measured_as"] = name
        row["measured"] = row["measured_peak_bytes"] is not None
    return {p: combine_rounds(runs, "peak_bytes", "error") for p, runs in theirs.items()}


def _fingerprint(plan) -> str:
    """Equal for two plans that run the same program: same passes, order and offsets."""
    body = json.dumps([plan.passes, plan.order, [(b.name, b.bytes, b.offset, b.first_eo, b.last_eo)
                                                 for b in plan.buffers]])
    return hashlib.sha256(body.encode()).hexdigest()


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _start_run(doc: dict) -> dict:
    """A record of this invocation in doc["runs"]: when, for how long, the machine's load."""
    run = {"started": datetime.now(UTC).isoformat(timespec="seconds"), "wall_seconds": 0.0,
           "rows_before": len(doc["rows"]), "rows_after": len(doc["rows"]), "loadavg_start": _loadavg(),
           "loadavg_end": None}
    doc.setdefault("runs", []).append(run)
    return run


def _fill_peers(doc: dict, model: str, batch: int | None) -> None:
    figures = doc["peers"].get(peer_key(model, batch), {})
    for row in doc["rows"]:
        r = BenchRow.of(row)
        if r.model == model and r.batch == batch:
            for peer in ("ort", "torch"):
                if peer in figures:
                    row.update(peer_row_fields(peer, figures[peer]))
