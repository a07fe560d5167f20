"""`onnxplan run MODEL`: execute a planned training step in its arena; measure; check against ORT."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from onnxplan.api import check_run_options, load_step_of, plan_request, solve
from onnxplan.budget import DEFAULT_PROFILE, MemoryRequest, cost_model
from onnxplan.cli import options as opt
from onnxplan.cli.common import (
    console,
    fail,
    handle_errors,
    model_request,
    print_json,
)
from onnxplan.device import array_module
from onnxplan.errors import EXIT_BUDGET, EXIT_FAILURE, UsageError
from onnxplan.executor.prepare import Prepared, prepare
from onnxplan.executor.swap_account import describe_accounting
from onnxplan.plan import Plan
from onnxplan.planning import PlanOptions, check_time_limit, require_budget
from onnxplan.progress import Progress
from onnxplan.run_report import Measurement, RunReport, run_prepared
from onnxplan.sizes import format_bytes
from onnxplan.swap.store import check_swap_dir
from onnxplan.verification.report import describe_verification

__all__ = ["run_command"]


_PLAN_DEFAULTS = {"order": "auto", "planner": "auto", "interleave": True, "inplace": True, "time_limit": None,
                  "split_grad": False}


def run_command(
    model: str = typer.Argument(None, help="Zoo name, forward .onnx, or artifact folder (optional with --plan: the plan names its model)."),
    order: str = opt.ORDER,
    planner: str = opt.PLANNER,
    interleave: bool = opt.INTERLEAVE,
    inplace: bool = opt.INPLACE,
    split_grad: bool = opt.SPLIT_GRAD,
    time_limit: float = opt.TIME_LIMIT,
    plan_file: Path = typer.Option(None, "--plan", help="Run this plan JSON (from `onnxplan plan -o`) instead of planning."),
    batch: int = opt.BATCH,
    dim: list[str] = opt.DIM,
    optimizer: str = opt.OPTIMIZER,
    loss: str = opt.LOSS,
    train: list[str] = opt.TRAIN,
    freeze: list[str] = opt.FREEZE,
    steps: int = typer.Option(3, "--steps", help="Training steps to run and report."),
    warmup: int = typer.Option(1, "--warmup", help="Steps run first on the initial state, then discarded."),
    seed: int = typer.Option(0, "--seed", help="Seed of the step data (the same data ONNX Runtime gets)."),
    lr: float = typer.Option(None, "--lr", help="Learning rate (default: ONNX Runtime's, 1e-3)."),
    verify: bool = typer.Option(False, "--verify", help="Compare every step with ONNX Runtime from the same state (exit 1 on mismatch): loss (relative error <= 1e-5), every gradient before the optimizer (relative norm error <= 3e-2, or 10x the tensor's one-ulp noise if larger), the optimizer's update on identical gradients (<= 1e-5 of the tensor's magnitude), BatchNorm running statistics (<= 1e-4, or 10x noise); random ops use ONNX Runtime's draws. A failure names the first value in execution order that differs, and its node. README: Verifying a run."),
    check_arena: bool = typer.Option(False, "--check-arena", help="Debug: poison dead buffers, check every read is inside its lifetime."),
    threads: int = opt.THREADS,
    measure: bool = typer.Option(True, "--measure/--no-measure", help="Measure the peak in a fresh subprocess (the probe)."),
    swap: str = opt.SWAP,
    lookahead: int = opt.LOOKAHEAD,
    window_bytes: str = opt.WINDOW_BYTES,
    budget: str = typer.Option(None, "--budget", help="Memory budget, e.g. 64MiB: swap (--swap) or recompute (--checkpoint) until the planned peak fits; with neither, the one predicted faster."),
    swap_dir: Path = typer.Option(None, "--swap-dir", help="Folder of the swap file (default: a temporary folder, removed)."),
    checkpoint: str = opt.CHECKPOINT,
    strategy: str = opt.STRATEGY,
    profile: bool = opt.PROFILE,
    device: str = typer.Option("cpu", "--device", help="Where the step runs: cpu (numpy) or cuda (CuPy on the GPU; the measured peak is then the most device memory held by live arrays, from CuPy's pool)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Run the planned training step: every tensor at its planned offset in one arena.

    Prints the loss of each step, the median step latency, the arena and the planned peak
    (persistent + arena) next to the measured peak: the peak RSS increase of a fresh
    process from just before the arena is allocated (with --device cuda: the most device
    memory held at once by live CuPy arrays, counted by a hook on CuPy's pool from just
    before the arena is allocated; no subprocess). With --plan, MODEL is optional: the plan
    file names its model; the plan is re-verified in full against it. Exit 0 ok, 1 mismatch
    with ONNX Runtime (--verify) or an arena check failed, 2 bad input (model, plan file,
    options), 3 the run does not fit the memory available (checked before allocating), the plan
    misses --budget (not run), or the measured peak exceeds --budget by more than the runtime's
    fixed overhead (README: exit codes).
    """
    plan_opts = {"order": order, "planner": planner, "interleave": interleave, "inplace": inplace,
                 "time_limit": time_limit, "split_grad": split_grad}
    swap_args = (swap, lookahead, window_bytes, budget, swap_dir)
    handle_errors(_run)(model, plan_opts, plan_file, batch, dim, optimizer, loss, steps,
                        warmup, seed, lr, verify, check_arena, threads, measure, json_out, swap_args,
                        (checkpoint, profile, strategy), device, (train, freeze))


def _run(model, plan_opts, plan_file, batch, dim, optimizer, loss, steps, warmup, seed, lr, verify,
         check_arena, threads, measure, json_out, swap_args=(None, 1, None, None, None),
         checkpoint_args=(None, DEFAULT_PROFILE, "auto"), device="cpu", select_args=(None, None)) -> None:
    check_run_options(steps, warmup, lr, threads)
    check_time_limit(plan_opts["time_limit"])
    xp = array_module(device)  # before planning: a missing GPU is a usage error, said at once
    if model is None and plan_file is None:
        raise UsageError("run needs a MODEL (zoo name, forward .onnx or artifact folder) or --plan plan.json "
                         "(from `onnxplan plan MODEL -o plan.json`), e.g. `onnxplan run mlp --swap proactive`")
    req = model_request(model or "", batch, optimizer, loss, dim, *select_args)
    swap, lookahead, window_bytes, budget, swap_dir = swap_args
    checkpoint, profile, strategy = checkpoint_args
    swap_dir = check_swap_dir(swap_dir)
    if plan_file is not None:
        if (swap is not None or window_bytes is not None or budget is not None or lookahead != 1 or checkpoint
                or strategy != "auto"):
            raise UsageError("--plan fixes the plan; drop --swap, --lookahead, --window-bytes, --budget, --checkpoint, "
                             "--strategy")
        changed = [k.replace("_", "-") for k, v in plan_opts.items() if v != _PLAN_DEFAULTS[k]]
        if changed:
            raise UsageError(f"--plan fixes the plan; drop --{', --'.join(changed)}")
        how = Plan.load(plan_file)
        req = plan_request(how, req, model is None)
    else:
        how = PlanOptions(**plan_opts, swap_dir=swap_dir)  # priced for the store it runs with
        memory = MemoryRequest.from_flags(budget, swap, lookahead, window_bytes, checkpoint, strategy)
    with Progress("run") as progress:
        progress.update("checking the plan" if plan_file is not None else "planning")
        prep = prepare(req, how) if plan_file is not None else \
            _prepare_planned(req, how, memory, cost_model(profile, device, threads))
        out = run_prepared(req, prep, steps=steps, warmup=warmup, seed=seed, lr=lr, check_arena=check_arena,
                           threads=threads, measure=measure, verify=verify, swap_dir=swap_dir, xp=xp,
                           tell=progress.update, budget=None if plan_file is not None else memory.budget)
        progress.finish("done")
    if json_out:
        print_json(out.to_json())
    else:
        _print(out)
    if out.verified is False:
        first = out.worst[0] if out.worst else "?"
        fail(f"the run differs from ONNX Runtime beyond tolerance: {first}", EXIT_FAILURE)
    if out.budget_check is not None and not out.budget_check.fits:
        fail(out.budget_check.line, EXIT_BUDGET)


def _prepare_planned(req, opts, memory, costs):
    """Load and plan as `onnxplan plan` does (onnxplan.budget decides what the budget needs)."""
    step = load_step_of(req)
    res = solve(step, opts, memory, costs)
    require_budget(res, memory.budget)  # as `plan`: a plan that misses the budget is exit 3, not run
    return Prepared(step.folder, res.graph, res.plan)


def _print(out: RunReport) -> None:
    con = console(120, highlight=False)
    con.print(f"[bold]{out.model}[/]: order {out.order_policy} + planner {out.planner}, passes "
              f"{' -> '.join(out.passes)}; {out.steps} step(s) after {out.warmup} warm-up, "
              f"seed {out.seed}, lr {out.learning_rate:g}" + (", arena checked" if out.check_arena else ""))
    t = Table("step", "loss", "seconds")
    for k, (l, s) in enumerate(zip(out.loss, out.step_seconds)):
        t.add_row(str(k), f"{l:.7g}", f"{s:.4f}")
    con.print(t)
    con.print(f"median step latency {out.median_step_seconds * 1e3:.2f} ms on {out.device}")
    if out.predicted_step_seconds:
        pred, meas = out.predicted_step_seconds, out.median_step_seconds
        con.print(f"predicted step {pred * 1e3:.2f} ms ({out.predicted_from}) vs measured {meas * 1e3:.2f} ms "
                  f"({pred / meas - 1:+.1%})")
    con.print(f"arena {format_bytes(out.arena_bytes)} + persistent {format_bytes(out.persistent_bytes)} "
              f"= planned peak {format_bytes(out.peak_bytes)} ({out.peak_bytes} B)")
    if out.measured_peak_bytes is not None and out.measurement is not None:
        _print_measured(con, out, out.measurement)
    if out.budget_check is not None and out.budget_check.fits and out.budget_check.line:
        con.print(out.budget_check.line)
    if out.swap is not None:
        for line in describe_accounting(out.swap):
            con.print(line)
    if out.verified is not None:
        for line in describe_verification(out.verification):
            con.print(line)


def _print_measured(con, out: RunReport, m: Measurement) -> None:
    diff = out.measured_minus_planned_bytes
    con.print(f"measured peak {format_bytes(out.measured_peak_bytes)} ({out.measured_peak_bytes} B, "
              f"{m.method}): {'+' if diff >= 0 else '-'}{format_bytes(abs(diff))} "
              f"({diff / max(out.peak_bytes, 1):+.1%}) vs planned")
    if m.pool_total_bytes is not None:
        con.print(f"  the difference: state slots aligned to 64 B (+{m.state_alignment_bytes} B), the "
                  "alignment slack of the two allocations, CuPy's 512-byte rounding, and small temporaries "
                  f"of kernels; CuPy's pool holds {format_bytes(m.pool_total_bytes)} in all (cached blocks)")
    else:
        con.print(f"  the difference: state slots aligned to 64 B (+{m.state_alignment_bytes} B), page "
                  "granularity (4 KiB per touched page), Python objects for the views, and what "
                  "kernels and BLAS allocate outside the arena (thread buffers, small temporaries); "
                  "pages of the arena never touched by a live buffer are not counted")
