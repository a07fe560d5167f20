"""`onnxplan plan MODEL`: order, place and verify one training step; compare planners."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from onnxplan.api import load_step_of, solve
from onnxplan.budget import DEFAULT_PROFILE, MemoryRequest, cost_model
from onnxplan.cli import options as opt
from onnxplan.cli.common import (
    check_output,
    console,
    handle_errors,
    model_request,
    print_json,
    write_atomic,
)
from onnxplan.device import array_module
from onnxplan.loading.parameters import ParameterReport, parameter_report
from onnxplan.planning import PlanOptions, require_budget
from onnxplan.progress import Progress
from onnxplan.sizes import format_bytes
from onnxplan.swap import swap_totals
from onnxplan.swap.store import check_swap_dir
from onnxplan.threads import resolve_threads

__all__ = ["plan_command"]


def plan_command(
    model: str = opt.MODEL,
    budget: str = typer.Option(None, "--budget", help="Memory budget, e.g. 256MiB, 1.5GB (exit 3 if no plan fits)."),
    order: str = opt.ORDER,
    planner: str = opt.PLANNER,
    interleave: bool = opt.INTERLEAVE,
    inplace: bool = opt.INPLACE,
    split_grad: bool = opt.SPLIT_GRAD,
    time_limit: float = opt.TIME_LIMIT,
    swap: str = opt.SWAP,
    lookahead: int = opt.LOOKAHEAD,
    window_bytes: str = opt.WINDOW_BYTES,
    swap_dir: Path = typer.Option(None, "--swap-dir", help="Folder the swap file will be in (run --swap-dir): swap transfers are priced at that store's bandwidth (default: the temporary folder run uses)."),
    profile: bool = opt.PROFILE,
    checkpoint: str = opt.CHECKPOINT,
    strategy: str = opt.STRATEGY,
    out: Path = typer.Option(None, "-o", "--out", help="Write the plan JSON here."),
    batch: int = opt.BATCH,
    dim: list[str] = opt.DIM,
    optimizer: str = opt.OPTIMIZER,
    loss: str = opt.LOSS,
    train: list[str] = opt.TRAIN,
    freeze: list[str] = opt.FREEZE,
    device: str = typer.Option("cpu", "--device", help="Where the step will run: cpu or cuda. The profile behind --checkpoint (and the recompute-or-swap choice) times our kernels there."),
    threads: int = typer.Option(None, "--threads", help="The threads the run will use: the profile times our kernels at this count (default: every core this process may use)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (the plan and a planners list)."),
) -> None:
    """Plan one training step: execution order and an offset for every transient buffer.

    Prints every planner's peak for the chosen order next to the lower bound (the most
    bytes live at any EO); fragmentation = peak / lower bound - 1 on the arena. Peak =
    persistent bytes (parameters, optimizer state) + arena. Exit 0 when the plan fits
    --budget, 3 when no plan reaches it.
    """
    handle_errors(_plan)(model, budget, order, planner, interleave, inplace, time_limit, out,
                         batch, dim, optimizer, loss, json_out, swap, lookahead, window_bytes, checkpoint, profile,
                         device, train, freeze, split_grad, strategy, threads, swap_dir)


def _plan(model, budget, order, planner, interleave, inplace, time_limit, out, batch, dim,
          optimizer, loss, json_out, swap=None, lookahead=1, window_bytes=None, checkpoint=None,
          profile=DEFAULT_PROFILE, device="cpu", train=None, freeze=None, split_grad=False, strategy="auto",
          threads=None, swap_dir=None) -> None:
    memory = MemoryRequest.from_flags(budget, swap, lookahead, window_bytes, checkpoint, strategy)
    budget_bytes = memory.budget
    opts = PlanOptions(order, planner, interleave, inplace, time_limit, split_grad=split_grad,
                       swap_dir=check_swap_dir(swap_dir))
    array_module(device)  # an unknown device, or cuda without a GPU: one line, exit 2
    resolve_threads(threads)  # a bad --threads: one line, exit 2, before any work
    req = model_request(model, batch, optimizer, loss, dim, train, freeze)
    check_output(out)
    with Progress("plan") as progress:  # a budget can take a minute: lines in CI logs, a bar on a terminal
        progress.update(f"loading {model}")
        step = load_step_of(req)
        progress.update(f"planning {step.name}" + (f" for the budget {format_bytes(budget_bytes)}"
                                                   if budget_bytes is not None else ""))
        res = solve(step, opts, memory, cost_model(profile, device, threads))
        progress.finish(f"planned, peak {format_bytes(res.plan.peak_bytes)}")
    plan, graph = res.plan, step.graph  # the plan names its model: `run --plan` finds it
    fits = budget_bytes is None or plan.peak_bytes <= budget_bytes
    if out is not None:
        write_atomic(out, plan.dumps())
    if json_out:
        d = plan.to_json()
        d["budget_bytes"] = budget_bytes
        d["fits_budget"] = fits
        d["orders"] = res.orders
        d["notes"] = res.pass_notes
        d["skipped"] = res.skipped
        d["planners"] = [r.__dict__ for r in res.rows]
        d["parameters"] = parameter_report(graph).to_json()
        if res.swap is not None and res.swap.floor is not None:
            d["swap_floor"] = res.swap.floor.__dict__
        print_json(d)
    else:
        _print_table(res, budget_bytes, parameter_report(graph))
    require_budget(res, budget_bytes)


def _print_swaps(con, res) -> None:
    sw = res.swap
    if sw is None:
        return
    t = swap_totals(sw.swaps)
    con.print(f"swap [bold]{sw.policy}[/]: {t['swaps']} swaps ({t['transfers']} transfers), "
              f"{format_bytes(t['bytes_out'])} out, {format_bytes(t['bytes_in'])} in per step")
    by_class: dict[str, list[int]] = {}
    for s in sw.swaps:
        c = by_class.setdefault(s.vclass, [0, 0])
        c[0] += 1
        c[1] += s.bytes
    if by_class:
        con.print("  by class: " + ", ".join(f"{k} {n} ({format_bytes(b)})" for k, (n, b) in sorted(by_class.items())))


def _print_table(res, budget_bytes, params: ParameterReport | None = None) -> None:
    plan = res.plan
    con = console(120)
    if params and (params.rewrites or params.frozen):
        for line in params.lines():
            con.print(line, highlight=False, markup=False)
    con.print(f"[bold]{plan.model}[/]: {len(plan.order)} nodes, order [bold]{plan.order_policy}[/] "
              f"({', '.join(f'{k} {format_bytes(v)}' for k, v in res.orders.items())} transient bound), "
              f"passes {' -> '.join(plan.passes)}")
    for note in res.pass_notes:
        con.print(f"  {note}")
    if plan.order_policy == "ilp":
        o = plan.solver
        state = "optimal" if o.order_optimal else (
            f"gap {o.order_gap:.1%}" if o.order_gap is not None else "not proven")
        con.print(f"  order ilp: {state} in {o.order_seconds:.2f} s; {'; '.join(o.order_notes)}")
    t = Table("planner", "peak", "arena", "lower bound", "fragmentation", "seconds", "")
    for r in res.rows:
        mark = "chosen" if r.planner == plan.planner else ""
        if r.optimal is not None:
            mark += (" optimal" if r.optimal else f" gap {r.gap:.1%}" if r.gap is not None else " not proven")
        style = "bold green" if r.planner == plan.planner else None
        t.add_row(r.planner, format_bytes(r.peak_bytes), format_bytes(r.arena_bytes),
                  format_bytes(r.lower_bound_bytes), f"{r.fragmentation:.2%}",
                  f"{r.solve_seconds:.3f}", mark.strip(), style=style)
    con.print(t)
    for why in res.skipped:
        con.print(f"  skipped {why}")
    _print_swaps(con, res)
    line = f"persistent {format_bytes(plan.persistent_bytes)} + arena {format_bytes(plan.arena_bytes)} = peak {format_bytes(plan.peak_bytes)}"
    if budget_bytes is not None:
        verdict = "fits" if plan.peak_bytes <= budget_bytes else "does NOT fit"
        line += f"; budget {format_bytes(budget_bytes)}: {verdict}"
    con.print(line)


