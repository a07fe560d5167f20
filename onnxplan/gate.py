"""The CI gate of [tool.onnxplan] (`onnxplan check` with no RESULTS): bench the configured models
and strategies, compare with the baseline (onnxplan.check.compare), check each model's budget,
and the exit code those give. The CLI prints; this module decides."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxplan.bench import BenchConfig, new_results, parse_strategies, run_bench
from onnxplan.bench.result_models import BenchRow
from onnxplan.errors import EXIT_BUDGET, EXIT_FAILURE, UsageError
from onnxplan.gate_config import GateConfig, find_gate_config, load_gate_config
from onnxplan.loading.zoo import model_names

__all__ = ["Gate", "OverBudget", "gate_exit_code", "load_gate", "over_budget", "run_gate"]


@dataclass(frozen=True)
class Gate:
    """A configured gate, checked: its file, the sweep it runs and the baseline it compares with."""

    config: GateConfig
    bench: BenchConfig
    baseline: Path

    @property
    def label(self) -> str:
        return f"the gate of {self.config.source.name}"


@dataclass(frozen=True)
class OverBudget:
    """A model no plan of the gate fits its budget: the smallest planned peak and its strategy."""

    model: str
    budget: int
    smallest: float  # a bench row's planned_peak_bytes (a JSON number; whole bytes as onnxplan writes it)
    strategy: str


def load_gate(baseline: Path | None = None, update_baseline: bool = False, start: Path | None = None) -> Gate:
    """The gate of the nearest pyproject.toml / onnxplan.toml from `start` (the working folder),
    its models and budgets checked; `baseline` overrides the file's. UsageError (exit 2) for a
    budget naming a model outside the gate, or a baseline that does not exist (unless it is
    about to be written)."""
    gate = load_gate_config(find_gate_config(start))
    names = model_names(gate.models, gate.models is None)
    for model in gate.budgets:
        if model != "*" and model not in names:
            raise UsageError(f"{gate.source}: budgets.{model}: not a model of the gate ({', '.join(names)})")
    baseline = baseline or gate.baseline
    if not update_baseline and not baseline.exists():
        raise UsageError(f"{gate.source}: the baseline {baseline} does not exist; "
                         "write it with: onnxplan check --update-baseline")
    bench = BenchConfig(names, parse_strategies(gate.strategies), None, [], measure=gate.measure,
                        budgets=gate.budgets, model_options=gate.model_options)
    return Gate(gate, bench, baseline)


def run_gate(gate: Gate, advance: Callable[[str, int], None] = lambda text, n: None) -> dict[str, Any]:
    """Bench the gate's sweep (here, or on its Dask cluster): the results document."""
    doc = new_results(gate.bench.to_json())
    if gate.config.workers is None and gate.config.scheduler is None:
        return run_bench(gate.bench, doc, lambda d: None, advance)
    from onnxplan.bench.dask_sweep import open_client, run_bench_dask

    with open_client(gate.config.scheduler, gate.config.workers) as client:
        return run_bench_dask(gate.bench, doc, lambda d: None, client, advance)


def over_budget(rows: list[dict], config: BenchConfig) -> list[OverBudget]:
    """The models whose budget no planned row fits, each with its smallest plan."""
    over = []
    typed = [BenchRow.of(r) for r in rows]
    for model in config.models:
        budget = config.budget(model)
        mine = [r for r in typed if r.model == model and r.planned_peak_bytes is not None]
        if budget is None or not mine or any(r.planned_peak_bytes <= budget for r in mine):
            continue
        best = min(mine, key=lambda r: r.planned_peak_bytes)
        over.append(OverBudget(model, budget, best.planned_peak_bytes, best.strategy))
    return over


def gate_exit_code(regressed: bool, over: list[OverBudget], failed_rows: list[dict], update_baseline: bool) -> int:
    """3 when a model's budget is missed (not while the baseline is being rewritten), else 1 on a
    regression or a row that failed, else 0 (README: exit codes)."""
    if over and not update_baseline:
        return EXIT_BUDGET
    if regressed or failed_rows:
        return EXIT_FAILURE
    return 0
