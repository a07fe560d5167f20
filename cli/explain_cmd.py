"""`onnxplan explain PLAN`: per stage, what the plan keeps, what it recomputes, the extra compute."""

from __future__ import annotations

import shutil
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from onnxplan.cli.common import handle_errors, print_json
from onnxplan.executor.prepare import check_plan_record
from onnxplan.plan import Plan
from onnxplan.sizes import format_bytes

__all__ = ["explain_command"]


def explain_command(
    plan_file: Path = typer.Argument(..., help="A plan JSON written by `onnxplan plan -o`."),
    names: bool = typer.Option(False, "--names", help="List the kept and recomputed values by name."),
    json_out: bool = typer.Option(False, "--json", help="Print the plan's checkpoint record as JSON."),
) -> None:
    """Explain a plan's recomputation: the chain of stages (cut at single-tensor cuts), and per
    stage what the forward pass keeps (everything its backward needs, only its input, or
    nothing), how often its forward runs, which values are recomputed and the extra compute.
    Exit 0; 2 when the file is missing or not a plan."""
    handle_errors(_explain)(plan_file, names, json_out)


def _explain(plan_file: Path, names: bool, json_out: bool) -> None:
    plan = Plan.load(plan_file)
    check_plan_record(plan)  # (run --plan re-verifies it in full against its model)
    info = plan.checkpoint.to_json() if plan.checkpoint is not None else None
    if json_out:
        print_json({"model": plan.model, "peak_bytes": plan.peak_bytes, "checkpoint": info})
        return
    con = Console(width=max(shutil.get_terminal_size((140, 24)).columns, 100), highlight=False)
    if not info:
        con.print(f"[bold]{plan.model}[/]: no recomputation in this plan (planned peak "
                  f"{format_bytes(plan.peak_bytes)}); plan with --checkpoint sqrt|chen|rotor to trade compute for memory")
        return
    stages = info["stages"]
    budget = info.get("budget_bytes")
    rerun = [s for s in stages if s["runs"] > 1]
    con.print(f"[bold]{plan.model}[/]: checkpoint policy [bold]{info['policy']}[/]"
              + (f", budget {format_bytes(budget)}" if budget else "")
              + f"; {len(stages)} stages, {len(rerun)} run again; planned peak {format_bytes(plan.peak_bytes)}")
    t = Table("stage", "nodes", "from .. to", "output", "forward pass", "runs", "kept", "recomputed",
              "extra compute")
    prev_a = 0
    for s in stages:
        mode = s["forward_pass"]
        kept = s["abar_bytes"] if mode == "keep all" else prev_a if mode == "keep input" else 0
        kept_txt = format_bytes(kept) if kept else "-"
        rec_txt = f"{len(s['recomputed'])} ({format_bytes(s['abar_bytes'])})" if s["recomputed"] else "-"
        if names:
            kept_txt += ("\n" + "\n".join(s["kept"])) if s["kept"] else ""
            rec_txt += ("\n" + "\n".join(s["recomputed"])) if s["recomputed"] else ""
        extra = f"{s['extra_seconds'] * 1e3:.3f} ms" if s["extra_seconds"] else "-"
        note = f" [red](kept: {s['not_recomputable']})[/]" if s.get("not_recomputable") else ""
        t.add_row(str(s["stage"]), str(s["nodes"]), _span(s), s["output"], mode + note, str(s["runs"]),
                  kept_txt, rec_txt, extra, style="bold" if s["runs"] > 1 else None)
        prev_a = s["a_bytes"]
    con.print(t)
    extra = sum(s["extra_seconds"] for s in stages)
    con.print(f"extra forward compute {extra * 1e3:.3f} ms per step ({info['time_source']} estimate); "
              f"predicted step {info['predicted_step_seconds'] * 1e3:.2f} ms vs "
              f"{info['predicted_step_seconds_without'] * 1e3:.2f} ms without recomputation")
    con.print(f"schedule: {info['schedule'] or 'store everything'}")
    for note in info.get("notes", []):
        con.print(f"  {note}")


def _span(s: dict) -> str:
    return s["first"] if s["first"] == s["last"] else f"{s['first']} .. {s['last']}"
