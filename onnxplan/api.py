"""The Python API: load a model's training step, plan it (under a budget), run and verify the
plan, sweep strategies. The CLI is a thin layer over these functions.

    step = onnxplan.load("mlp", batch=8)
    plan = onnxplan.plan(step, budget="64MiB")          # a Plan (BudgetError if none fits)
    report = onnxplan.run(step, plan, steps=2, verify=True)   # a RunReport
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxplan.bench import BenchConfig, new_results, parse_strategies, run_bench
from onnxplan.bench.peers import parse_peers
from onnxplan.bench.sweep import DEFAULT_WARMUP, DEFAULT_WARMUP_SECONDS, check_timing
from onnxplan.budget import DEFAULT_PROFILE, CostModel, MemoryRequest, cost_model, plan_for_budget
from onnxplan.device import array_module
from onnxplan.errors import UsageError
from onnxplan.executor.prepare import Prepared, adopt_plan, check_plan_record
from onnxplan.ir.graph import StepGraph
from onnxplan.loading import open_step
from onnxplan.loading.request import (
    LoadRequest,
    check_content_hash,
    make_request,
    model_reference,
    request_from_reference,
)
from onnxplan.loading.resolve import resolve_artifacts
from onnxplan.plan import Plan
from onnxplan.planning import PlanOptions, PlanOutcome, check_time_limit, require_budget
from onnxplan.run_report import RunReport, run_prepared
from onnxplan.sizes import parse_size
from onnxplan.swap.store import check_swap_dir
from onnxplan.threads import resolve_threads

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Step", "bench", "check_run_options", "load", "load_plan", "load_step_of", "plan", "plan_request", "run", "solve"]


@dataclass(frozen=True)
class Step:
    """One loaded training step: what was asked for, its artifact folder and its step graph."""

    request: LoadRequest
    folder: Path
    graph: StepGraph

    @property
    def name(self) -> str:
        return self.graph.name


def load(model: str | Path, *, batch: int | None = None, optimizer: str | None = None, loss: str | None = None,
         dims: Mapping[str, int] | None = None, train: Iterable[str] = (), freeze: Iterable[str] = ()) -> Step:
    """A zoo name, a forward .onnx file or an artifact folder, as one training step (artifacts
    are built into the cache when needed; `dims` gives named dynamic dimensions)."""
    return load_step_of(make_request(model, batch, optimizer, loss, tuple(sorted((dims or {}).items())),
                                     train, freeze))


def load_step_of(req: LoadRequest) -> Step:
    """The step of a checked request (a folder our builder made supplies its batch)."""
    folder, graph = open_step(req)
    return Step(req, folder, graph)


def solve(step: Step, opts: PlanOptions = PlanOptions(), memory: MemoryRequest = MemoryRequest(),
          costs: CostModel | None = None) -> PlanOutcome:
    """The planning outcome for `step` (every planner tried, notes, skips, the swap outcome);
    the plan names its model (`source`). It may miss `memory.budget`: compare the peak."""
    res = plan_for_budget(step.graph, opts, memory, costs if costs is not None else cost_model(DEFAULT_PROFILE))
    res.plan = replace(res.plan, source=model_reference(step.request, step.folder))
    return res


def plan(step: Step, *, budget: str | int | None = None, order: str = "auto", planner: str = "auto",
         interleave: bool = True, inplace: bool = True, time_limit: float | None = None,
         swap: str | None = None, lookahead: int = 1, window_bytes: str | int | None = None,
         checkpoint: str | None = None, profile: bool = DEFAULT_PROFILE, device: str = "cpu",
         split_grad: bool = False, strategy: str = "auto", threads: int | None = None,
         swap_dir: str | Path | None = None) -> Plan:
    """Plan `step` (the CLI's `plan` options; sizes as "256MiB" or bytes). Under a budget with
    no swap or checkpoint policy named, `strategy` meets it: "auto", recompute or swap chosen by
    predicted step time (`profile`: time our kernels on `device`, else a FLOP estimate); or one
    named: "recompute", "swap", "joint" (the joint CP-SAT solver, opt-in; plan.joint records
    its schedule). `threads`: what the run will use (the profile times our kernels at it; None:
    every available core). `swap_dir`: the folder the swap file will be in (run's `swap_dir`):
    swap transfers are priced at that store's bandwidth (plan.swap.store records it). A budget
    no plan reaches is a BudgetError (exit code 3) naming the smallest peak."""
    memory = MemoryRequest.from_flags(budget, swap, lookahead, window_bytes, checkpoint, strategy)
    check_time_limit(time_limit)
    array_module(device)  # an unknown device, or cuda without a GPU: a UsageError now
    opts = PlanOptions(order, planner, interleave, inplace, time_limit, split_grad=split_grad,
                       swap_dir=check_swap_dir(swap_dir))
    res = solve(step, opts, memory, cost_model(profile, device, resolve_threads(threads)))
    require_budget(res, memory.budget)
    return res.plan


def plan_request(plan: Plan, req: LoadRequest, no_model: bool) -> LoadRequest:
    """MODEL omitted, or the model the plan's reference names: the request of that reference
    (--batch, --dim, --optimizer, --loss given override it); the artifacts must hold the
    content the plan was made with. Another MODEL: as given (adopt_plan refuses it when its
    graph is not the plan's)."""
    if not plan.source:
        if no_model:
            raise UsageError("this plan file names no model (made by an older onnxplan): give MODEL before --plan")
        return req
    if not no_model and model_reference(req, None)["model"] != plan.source.get("model"):
        return req
    overridden = req.batch is not None or req.optimizer or req.loss or req.dims or req.train or req.freeze
    req = request_from_reference(plan.source, req.batch, req.optimizer, req.loss, req.dims, req.train, req.freeze)
    if not overridden:  # else the graph's fingerprint tells
        check_content_hash(plan.source, resolve_artifacts(req))
    return req


def load_plan(path: str | Path) -> tuple[Plan, StepGraph]:
    """A plan file re-verified in full against the model it names, as `run --plan` does (a
    file that fails any check a fresh plan passes is a ModelError, exit 2): the plan and its
    rewritten step graph."""
    plan = Plan.load(path)
    check_plan_record(plan)
    if not plan.source:
        raise UsageError(f"{path}: this plan file names no model (made by an older onnxplan), so it cannot be "
                         "verified; plan again with `onnxplan plan MODEL -o plan.json`")
    step = load_step_of(plan_request(plan, make_request(""), True))
    return plan, adopt_plan(step.graph, plan)


def check_run_options(steps: int, warmup: int, lr: float | None, threads: int | None) -> None:
    """The run options a run needs valid before any work (UsageError, exit 2)."""
    if steps < 1 or warmup < 0:
        raise UsageError(f"invalid --steps {steps} / --warmup {warmup}: need steps >= 1, warmup >= 0")
    if lr is not None and not lr > 0:
        raise UsageError(f"invalid --lr {lr}: must be positive")
    resolve_threads(threads)


def run(step: Step, plan: Plan | None = None, *, steps: int = 3, warmup: int = 1, seed: int = 0,
        lr: float | None = None, verify: bool = False, check_arena: bool = False, threads: int | None = None,
        measure: bool = False, swap_dir: str | Path | None = None, device: str = "cpu",
        budget: str | int | None = None) -> RunReport:
    """Run `plan` (default: the step planned with the default options) in one arena: `steps` seeded training steps after
    `warmup`. The plan is verified against the step first (a plan for another graph is a
    ModelError). `verify`: compare every step with ONNX Runtime from the same state
    (report.verified); `measure`: the peak in a fresh process (or on the device), held against
    `budget` when given (report.budget_check: the plan must fit it, and the measured peak less
    the runtime's fixed overhead, run_report.RUNTIME_OVERHEAD_BYTES)."""
    check_run_options(steps, warmup, lr, threads)
    xp = array_module(device)
    plan = plan if plan is not None else solve(step).plan
    prep = Prepared(step.folder, adopt_plan(step.graph, plan), plan)
    return run_prepared(step.request, prep, steps=steps, warmup=warmup, seed=seed, lr=lr, check_arena=check_arena,
                        threads=threads, measure=measure, verify=verify, swap_dir=swap_dir, xp=xp,
                        budget=parse_size(budget) if isinstance(budget, str) else budget)


def bench(models: Iterable[str], *, strategies: str = "default", batch: int | None = None, peers: str = "none",
          repeat: int = 3, warmup: int = DEFAULT_WARMUP, measure: bool = False, time_limit: float | None = None,
          budget: str | int | None = None, threads: int | None = None, rounds: int = 1,
          warmup_seconds: float = DEFAULT_WARMUP_SECONDS) -> pd.DataFrame:
    """Sweep models x strategies (bench's names, e.g. "auto,nntrainer+sort"): one row per
    (model, strategy) with the columns of onnxplan/bench/SCHEMA.md. `measure`: run each plan
    (`repeat` timed steps) and measure its peak; `peers`: "ort,torch" measures those too; every
    measurement at `threads` (onnxplan.threads; None: every available core), in `rounds` fresh
    processes (bench --rounds), after `warmup` steps and at least `warmup_seconds` of warm-up."""
    check_time_limit(time_limit)
    check_timing(repeat, warmup, rounds, warmup_seconds)
    budgets = {} if budget is None else {"*": parse_size(budget) if isinstance(budget, str) else budget}
    config = BenchConfig(list(models), parse_strategies(strategies), batch, parse_peers(peers), repeat, warmup,
                         measure, time_limit, budgets, threads=resolve_threads(threads), rounds=rounds,
                         warmup_seconds=warmup_seconds)
    doc: dict[str, Any] = run_bench(config, new_results(config.to_json()), save=lambda d: None)
    import pandas as pd  # 0.3 s to import: on use, so that every CLI command does not pay it

    return pd.DataFrame(doc["rows"])
