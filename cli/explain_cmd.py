"""`onnxplan explain PLAN`: per stage, what the plan keeps, what it recomputes, the extra compute;
for a joint plan (--strategy joint), per value: kept, recomputed, swapped, and the extra time."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Column, Table

from onnxplan.api import load_plan
from onnxplan.cli.common import console, handle_errors, print_json
from onnxplan.explain import joint_rows, split_convgrads, stage_rows
from onnxplan.json_models import dumped
from onnxplan.plan import Plan
from onnxplan.plan_records import CheckpointRecord
from onnxplan.progress import Progress
from onnxplan.sizes import format_bytes
from onnxplan.swap import swap_totals

__all__ = ["explain_command"]


def explain_command(
    plan_file: Path = typer.Argument(..., help="A plan JSON written by `onnxplan plan -o`."),
    names: bool = typer.Option(False, "--names", help="List the kept and recomputed values by name."),
    json_out: bool = typer.Option(False, "--json", help="Print the plan's checkpoint and joint records as JSON."),
) -> None:
    """Explain a plan's recomputation: the chain of stages (cut at single-tensor cuts), and per
    stage what the forward pass keeps (everything its backward needs, only its input, or
    nothing), how often its forward runs, which values are recomputed and the extra compute.
    A plan of the joint solver (--strategy joint): per value it decided, the stages it is kept
    into, recomputed in (by which node: its copies NODE@rcK), swapped out and in (the EOs of
    the plan's swap nodes), and the predicted extra time of each choice. Every plan: its swaps
    (value, bytes, class, out and in EO) and the ConvGrads split-grad split. The plan is
    re-verified in full against the model it names first, as `run --plan` does.
    Exit 0; 2 when the file is missing, not a plan, or fails verification."""
    handle_errors(_explain)(plan_file, names, json_out)


def _explain(plan_file: Path, names: bool, json_out: bool) -> None:
    with Progress("explain") as progress:
        progress.update(f"verifying {plan_file} against its model")
        plan, graph = load_plan(plan_file)  # re-verified in full against its model, as run --plan does
    info = plan.checkpoint
    splits = split_convgrads(graph)
    if json_out:
        print_json({"model": plan.model, "peak_bytes": plan.peak_bytes,
                    "checkpoint": dumped(info) if info is not None else None,
                    "joint": dumped(plan.joint) if plan.joint is not None else None,
                    "swap": dumped(plan.swap), "swaps": [asdict(sw) for sw in plan.swaps],
                    "split_grad": splits, "splits": [asdict(s) for s in plan.splits],
                    "pieces": [asdict(p) for p in plan.pieces]})
        return
    con = console(140, 100, highlight=False)
    if plan.joint is not None:
        _explain_joint(con, plan, names)
        return
    if not info:
        con.print(f"[bold]{plan.model}[/]: no recomputation in this plan (planned peak "
                  f"{format_bytes(plan.peak_bytes)})" + ("" if plan.swaps or splits or plan.splits else
                  "; plan with --checkpoint sqrt|chen|rotor to trade compute for memory"))
    else:
        _explain_checkpoint(con, plan, info, names)
    _explain_swaps(con, plan)
    _explain_splits(con, plan)
    if splits:
        con.print(f"split-grad: {len(splits)} ConvGrad node(s) split into a dW half (reads X) and a dX half "
                  f"(does not), so X can die before dX is made" + (
                      ": " + ", ".join(splits) if names else " (--names lists them)"))


def _explain_swaps(con: Console, plan: Plan) -> None:
    """Every swap of the plan: the value, its bytes and class, and the EOs it leaves and comes back."""
    if not plan.swaps:
        return
    t = swap_totals(plan.swaps)
    con.print(f"swap {plan.swap.described or plan.swap.policy}: {t['swaps']} swaps ({t['transfers']} transfers), "
              f"{format_bytes(t['bytes_out'])} out, {format_bytes(t['bytes_in'])} in per step")
    table = Table(Column("value", overflow="fold"), "bytes", "class", "out EO -> in EO", "written", "next use")
    for sw in plan.swaps:
        table.add_row(sw.value, format_bytes(sw.bytes), sw.vclass,
                      f"{sw.out_eo} -> {sw.in_eo}" + (" (across steps)" if sw.wraps else ""),
                      "yes" if sw.write else "no (the store holds it)", sw.next_use or "-")
    con.print(table)


def _explain_splits(con: Console, plan: Plan) -> None:
    """Every node the plan splits in chunks, and the bytes its pieces move through the host store."""
    if not plan.splits:
        return
    moved = {"in": 0, "out": 0}
    for p in plan.pieces:
        moved[p.kind] += p.nbytes
    con.print(f"split: {len(plan.splits)} node(s) in chunks over pieces of their tensors; {len(plan.pieces)} piece "
              f"transfers, {format_bytes(moved['out'])} out, {format_bytes(moved['in'])} in per step")
    table = Table(Column("node", overflow="fold"), "op", "axis", "chunks")
    for s in plan.splits:
        table.add_row(s.node, s.op, str(s.axis), str(s.k))
    con.print(table)


def _explain_checkpoint(con: Console, plan: Plan, info: CheckpointRecord, names: bool) -> None:
    stages = info.stages
    budget = info.budget_bytes
    rerun = [s for s in stages if s.runs > 1]
    con.print(f"[bold]{plan.model}[/]: checkpoint policy [bold]{info.policy}[/]"
              + (f", budget {format_bytes(budget)}" if budget else "")
              + f"; {len(stages)} stages, {len(rerun)} run again; planned peak {format_bytes(plan.peak_bytes)}")
    t = Table("stage", "nodes", "from .. to", "output", "forward pass", "runs", "kept", "recomputed",
              "extra compute")
    rows = stage_rows(info)
    for s in rows:
        kept_txt = format_bytes(s.kept_bytes) if s.kept_bytes else "-"
        rec_txt = f"{len(s.recomputed)} ({format_bytes(s.recomputed_bytes)})" if s.recomputed else "-"
        if names:
            kept_txt += ("\n" + "\n".join(s.kept)) if s.kept else ""
            rec_txt += ("\n" + "\n".join(s.recomputed)) if s.recomputed else ""
        note = f" [red](kept: {s.not_recomputable})[/]" if s.not_recomputable else ""
        t.add_row(str(s.stage), str(s.nodes), s.span, s.output, s.forward_pass + note, str(s.runs),
                  kept_txt, rec_txt, _ms(s.extra_seconds), style="bold" if s.runs > 1 else None)
    con.print(t)
    extra = sum(s.extra_seconds for s in rows)
    con.print(f"extra forward compute {extra * 1e3:.3f} ms per step ({info.time_source} estimate); "
              f"predicted step {info.predicted_step_seconds * 1e3:.2f} ms vs "
              f"{info.predicted_step_seconds_without * 1e3:.2f} ms without recomputation")
    con.print(f"schedule: {info.schedule or 'store everything'}")
    for note in info.notes:
        con.print(f"  {note}")


def _explain_joint(con: Console, plan: Plan, names: bool) -> None:
    """Per value the joint schedule decided, and every swap of the plan (those of the swap
    module's `auto` policy too, when it was planned on top)."""
    j = plan.joint
    gap = "no bound" if j.gap is None else f"gap {j.gap:.0%}"
    con.print(f"[bold]{plan.model}[/]: joint schedule ({j.status}, {gap}), budget "
              f"{format_bytes(j.budget_bytes) if j.budget_bytes is not None else '-'}; {j.stages} stages, "
              f"{j.recomputations} recomputations; model peak {format_bytes(j.estimate_bytes)}, planned peak "
              f"{format_bytes(plan.peak_bytes)}")
    t = Table("value", "bytes", "kept", "recomputed", "swapped (out EO -> in EO)", "extra time")
    for r in joint_rows(plan):
        if r.from_swap_module:  # the swap module's, planned on top of the schedule
            sw = r.swaps[0]
            t.add_row(r.value, format_bytes(r.bytes), "-", "-", f"{sw.out_eo} -> {sw.in_eo} (swap module)",
                      "?" if r.extra_seconds is None else _ms(r.extra_seconds))
            continue
        kept = f"{len(r.kept_into)} stage{'s' * (len(r.kept_into) > 1)}" if r.kept_into else "-"
        rec = "-"
        if r.recomputed_in:
            rec = f"stages {', '.join(map(str, r.recomputed_in))} by {r.recomputed_by}"
            if names and r.copies:
                rec += "\n" + "\n".join(r.copies)
        swp = ", ".join(f"{sw.out_eo} -> {sw.in_eo}" for sw in r.swaps) or (
            "paged by the schedule; the swap module's swaps replaced it" if r.paged_out else "-")
        t.add_row(r.value, format_bytes(r.bytes), kept, rec, swp, _ms(r.extra_seconds))
    bandwidth = j.swap_bandwidth
    con.print(t)
    con.print(f"predicted step {j.predicted_step_seconds * 1e3:.2f} ms: recomputation "
              f"{j.recompute_seconds * 1e3:.3f} ms, exposed transfers {j.stall_seconds * 1e3:.3f} ms "
              f"({j.time_source or 'FLOP estimate'}; extra time of a swap: its bytes at "
              f"{format_bytes(bandwidth) + '/s' if bandwidth else 'no store'}, before overlap)")
    con.print(f"schedule: {j.schedule or 'no recomputation'}" if names else
              f"schedule: {len(j.schedule)} characters (--names prints it)")
    if j.candidates:
        con.print(f"chosen: [bold]{j.chosen}[/] of " + ", ".join(
            f"{c.strategy} {c.predicted_step_seconds * 1e3:.2f} ms"
            + (f" ({format_bytes(c.peak_bytes)})" if c.fits else f" (misses: {format_bytes(c.peak_bytes)})")
            for c in j.candidates) + " (predicted, one footing: onnxplan.swap.pricing)")
    for note in j.notes:
        con.print(f"  {note}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds else "-"
