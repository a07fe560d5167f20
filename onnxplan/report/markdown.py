"""The Markdown summary of bench results: one line per model, short enough for a PR comment."""

from __future__ import annotations

from typing import Any

from onnxplan.bench.result_models import MachineInfo, RunRecord
from onnxplan.bench.results import merge_results
from onnxplan.json_models import record_of
from onnxplan.report.model_data import group_models
from onnxplan.sizes import format_bytes

__all__ = ["markdown_summary", "run_header"]


def _mib(n: float | None) -> str:
    return "–" if n is None else f"{n / 2**20:.1f}"


def _ms(s: float | None) -> str:
    return "–" if s is None else f"{s * 1000:.0f}" if s >= 0.1 else f"{s * 1000:.1f}"


def timing_note(cfg: dict[str, Any]) -> str:
    """'5 timed steps after 1 warm-up, in 3 fresh processes (the median of their medians)'."""
    text = f"{cfg.get('repeat', '?')} timed steps after {cfg.get('warmup', '?')} warm-up"
    if cfg.get("warmup_seconds"):
        text += f" (and at least {cfg['warmup_seconds']:g} s of it)"
    rounds = cfg.get("rounds") or 1
    return text + (f", in {rounds} fresh processes each (the median of their medians)" if rounds > 1 else "")


def run_header(doc: dict[str, Any]) -> str:
    """'2026-11-22 · Intel … · 2 cores · 23.4 GiB · Python 3.11.7 · onnxruntime 1.19.2 · torch 2.13.0'."""
    m = record_of(MachineInfo, doc.get("machine") or {})
    parts = [str(doc.get("created", "?"))[:10], m.cpu or m.machine or "unknown CPU"]
    if m.cpus:
        parts.append(f"{m.cpus} cores")
    if m.memory_bytes:
        parts.append(format_bytes(m.memory_bytes))
    for version, label in ((m.python, "Python"), (m.onnxruntime, "onnxruntime"), (m.torch, "torch")):
        if version:
            parts.append(f"{label} {version}")
    runs = [record_of(RunRecord, r) for r in doc.get("runs") or ()]
    if runs:
        loads = [x for r in runs for x in (r.loadavg_start, r.loadavg_end) if x]
        parts.append(f"bench {sum(r.wall_seconds or 0 for r in runs) / 60:.1f} min"
                     + (f", load {min(x[0] for x in loads):.1f}–{max(x[0] for x in loads):.1f}" if loads else ""))
    elif m.loadavg:
        parts.append(f"load {m.loadavg[0]:.1f} at start")
    return " · ".join(parts)


def markdown_summary(docs: list[dict[str, Any]]) -> str:
    """Header, one table row per model (best strategy vs the lower bound and the peers), notes."""
    doc = merge_results(docs)
    groups = group_models(doc)
    cfg = doc.get("config", {})
    lines = [f"### onnxplan bench — {run_header(doc)}", ""]
    lines.append(f"{len(groups)} models × {len(cfg.get('strategies', [])) or '?'} strategies "
                 f"({', '.join(cfg.get('strategies', []))}); peers: {', '.join(cfg.get('peers', [])) or 'none'}; "
                 f"{timing_note(cfg)}. MiB = 2^20 B.")
    lines += ["", ("| model | batch | best strategy | planned MiB | bound MiB | frag. | measured MiB | ORT MiB "
                  "| PyTorch MiB | planned / ORT | step ms onnxplan / ORT / PyTorch |"),
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios = []
    for g in groups:
        best, ort, torch = g.best, g.peer("ort"), g.peer("torch")
        ratio = best.planned_peak_bytes / ort.peak_bytes if ort.peak_bytes else None
        if ratio is not None:
            ratios.append(ratio)
        lines.append(
            f"| {g.model} | {g.batch if g.batch is not None else '–'} | {best.strategy} "
            f"({best.order}+{best.planner}) | {_mib(best.planned_peak_bytes)} "
            f"| {_mib(best.lower_bound_bytes)} | {(best.fragmentation or 0):.1%} "
            f"| {_mib(best.measured_peak_bytes)} | {_mib(ort.peak_bytes)} | {_mib(torch.peak_bytes)} "
            f"| {'–' if ratio is None else f'{ratio:.2f}×'} "
            f"| {_ms(best.median_step_seconds)} / {_ms(ort.median_step_seconds)} / {_ms(torch.median_step_seconds)} |")
    lines.append("")
    notes = [("planned = persistent (parameters, optimizer state) + arena; bound = the most bytes live at any "
             "EO of the chosen order; peers' peaks are measured (peak RSS increase in a fresh process).")]
    if ratios:
        notes.append(f"planned / ORT: median {sorted(ratios)[len(ratios) // 2]:.2f}×, "
                     f"range {min(ratios):.2f}×–{max(ratios):.2f}×.")
    if not any(r.measured_peak_bytes is not None for g in groups for r in g.rows):
        notes.append("onnxplan's own measured peak and latency: not measured in this run.")
    lines += [" ".join(notes), ""]
    return "\n".join(lines)
