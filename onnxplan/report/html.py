"""The HTML report: one self-contained file, plotly.js inlined once, every chart offline."""

from __future__ import annotations

import html
import json
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from onnxplan.bench.result_models import BenchRow, PeerFigures
from onnxplan.bench.results import merge_results
from onnxplan.report.figures import (
    latency_figure,
    layout_figure,
    live_bytes_figure,
    overview_figure,
    peak_figure,
)
from onnxplan.report.markdown import run_header, timing_note
from onnxplan.report.model_data import ModelGroup, buffer_columns, group_models, slug

__all__ = ["render_html"]

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1500px;
padding:0 24px 48px;color:#222}
h1{margin-top:24px}h2{margin-top:40px;border-bottom:2px solid #4C78A8;padding-bottom:4px}
nav a{margin-right:12px}.meta{color:#555}.grid{display:grid;grid-template-columns:1fr 1fr;gap:12px}
.grid>div{min-width:0}@media(max-width:1100px){.grid{grid-template-columns:1fr}}
table{border-collapse:collapse;font-size:13px;margin:12px 0}th,td{border:1px solid #ddd;padding:3px 8px;
text-align:right}th{background:#f3f5f8}td:first-child,th:first-child,td.l{text-align:left}
tr.best td{background:#eef6ee;font-weight:600}.note{color:#666;font-size:13px}
"""
_PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def _mib(n: Any) -> str:
    return "–" if n is None else f"{n / 2**20:,.2f}"


def _ms(s: Any) -> str:
    return "–" if s is None else f"{s * 1000:,.1f}"


def _fig_html(fig: go.Figure, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=_PLOT_CONFIG)


def _table(headers: list[str], rows: list[list[str]], best: int | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for i, cells in enumerate(rows):
        cls = ' class="best"' if i == best else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _spread(fig: BenchRow | PeerFigures) -> str:
    return "–" if fig.min_step_seconds is None else f"{_ms(fig.min_step_seconds)}–{_ms(fig.max_step_seconds)}"


def _model_table(g: ModelGroup) -> str:
    headers = ["strategy", "order+planner", "interleave", "in-place", "planned MiB", "lower bound MiB",
               "persistent MiB", "arena MiB", "fragmentation", "measured MiB", "step ms (median)",
               "step ms (min–max)", "solve s", "fits budget"]
    rows = []
    for r in g.rows:
        rows.append([r.strategy, f"{r.order}+{r.planner}", "yes" if r.interleave else "no",
                     "yes" if r.inplace else "no", _mib(r.planned_peak_bytes),
                     _mib(r.lower_bound_bytes), _mib(r.persistent_bytes), _mib(r.arena_bytes),
                     f"{(r.fragmentation or 0):.2%}", _mib(r.measured_peak_bytes),
                     _ms(r.median_step_seconds), _spread(r), f"{(r.solve_seconds or 0):.2f}",
                     "–" if r.fits_budget is None else ("yes" if r.fits_budget else "NO")])
    table = _table(headers, rows, best=g.rows.index(g.best))
    peer_rows = []
    for key, label in (("ort", "ONNX Runtime training"), ("torch", "PyTorch eager")):
        p = g.peers.get(key)
        if p:
            peer_rows.append([label, _mib(p.peak_bytes), _ms(p.median_step_seconds), _spread(p),
                              "–" if p.first_loss is None else f"{p.first_loss:.6g}", p.error or ""])
    errors = sorted({r.measure_error for r in g.rows if r.measure_error})
    extra = ""
    if peer_rows:
        extra += _table(["peer", "measured peak MiB", "step ms (median)", "step ms (min–max)", "first loss",
                         "error"], peer_rows)
    if errors:
        extra += "<p class='note'>onnxplan runs: " + html.escape("; ".join(errors)) + "</p>"
    return table + extra


def _model_section(g: ModelGroup, columns: list[str]) -> str:
    sid = slug(f"{g.model}-{g.batch}") if g.batch is not None else slug(g.model)
    r0 = g.rows[0]
    best = g.best
    parts = [f'<section id="model-{sid}" class="model"><h2>{html.escape(g.title)}</h2>',
             (f"<p class='meta'>{'?' if r0.nodes is None else r0.nodes} nodes, {html.escape(str(r0.optimizer))}, "
             f"loss {html.escape(str(r0.loss))}. Smallest planned peak: <b>{_mib(best.planned_peak_bytes)} "
             f"MiB</b> by {html.escape(best.strategy)} (lower bound {_mib(best.lower_bound_bytes)} MiB)."
             "</p><div class='grid'>")]
    if g.plans:
        active = g.best_plan_index
        parts.append(f"<div>{_fig_html(layout_figure(g.model, g.plans, columns, active), f'{sid}-layout')}</div>")
        parts.append(f"<div>{_fig_html(live_bytes_figure(g.model, g.plans, columns, g.budget, active), f'{sid}-live')}"
                     "</div>")
    parts.append(f"<div>{_fig_html(peak_figure(g.model, g.rows, g.peers), f'{sid}-peak')}</div>")
    parts.append(f"<div>{_fig_html(latency_figure(g.model, g.rows, g.peers), f'{sid}-latency')}</div>")
    parts.append("</div>")
    parts.append(_model_table(g))
    parts.append("</section>")
    return "\n".join(parts)


def _overview(groups: list[ModelGroup]) -> str:
    rows = []
    for g in groups:
        b, ort, torch = g.best, g.peer("ort"), g.peer("torch")
        rows.append([g.title, b.strategy, _mib(b.planned_peak_bytes), _mib(b.lower_bound_bytes),
                     _mib(b.measured_peak_bytes), _mib(ort.peak_bytes), _mib(torch.peak_bytes),
                     "–" if not ort.peak_bytes else f"{b.planned_peak_bytes / ort.peak_bytes:.2f}×",
                     _ms(b.median_step_seconds), _ms(ort.median_step_seconds), _ms(torch.median_step_seconds)])
    table = _table(["model", "best strategy", "planned MiB", "lower bound MiB", "measured MiB", "ORT MiB",
                    "PyTorch MiB", "planned / ORT", "step ms", "ORT step ms", "PyTorch step ms"], rows)
    return (f'<section id="overview"><h2>Overview</h2><div>{_fig_html(overview_figure(groups), "overview-peaks")}'
            f"</div>{table}</section>")


def render_html(docs: list[dict[str, Any]], title: str = "onnxplan bench report") -> str:
    """The whole report as one HTML string (plotly.js inlined once; no network at view time)."""
    doc = merge_results(docs)
    groups = group_models(doc)
    columns = buffer_columns(doc)
    cfg = doc.get("config", {})
    nav = " ".join(f'<a href="#model-{slug(f"{g.model}-{g.batch}") if g.batch is not None else slug(g.model)}">'
                   f"{html.escape(g.title)}</a>" for g in groups)
    body = [f"<h1>{html.escape(title)}</h1>",
            (f"<p class='meta'>{html.escape(run_header(doc))}<br>strategies: "
            f"{html.escape(', '.join(cfg.get('strategies', [])))}; peers: "
            f"{html.escape(', '.join(cfg.get('peers', [])) or 'none')}; {html.escape(timing_note(cfg))}; "
            f"ILP time limit {_ilp_limit(cfg)}.</p>"),
            f"<nav>{nav}</nav>",
            ("<p class='note'>Planned peak = persistent bytes (parameters, optimizer state) + arena. Lower bound = "
            "persistent + the most transient bytes live at any execution order (EO) of the chosen order. Layout: "
            "each rectangle is one arena buffer, x = its EO span, y = its offset range; hover for name, bytes and "
            "class; the dropdown switches strategy. Peers' peaks are the peak RSS increase of a fresh process from "
            "just before the session is built.</p>")]
    if groups:
        body.append(_overview(groups))
    else:
        body.append("<p>No rows in these results.</p>")
    body += [_model_section(g, columns) for g in groups]
    meta = html.escape(json.dumps({"created": doc.get("created"), "rows": len(doc["rows"])}))
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<meta name='onnxplan-report' content='{meta}'>"
            f"<style>{_CSS}</style>\n<script type='text/javascript'>{get_plotlyjs()}</script>\n</head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _ilp_limit(cfg: dict) -> str:
    """The bench's --time-limit; None (not given) is the anytime default."""
    limit = cfg.get("time_limit", "?")
    return "anytime (ILP only where it can pay)" if limit is None else f"{limit} s"
