"""Plotly figures of one model's bench rows: memory layout, live bytes, peaks and latency."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from onnxplan.bench.result_models import BenchRow, PeerFigures, PlanEntry
from onnxplan.offsets.buffers import Buffer, live_bytes_by_eo
from onnxplan.plan import PlannedBuffer
from onnxplan.report.model_data import ModelGroup, plan_buffers

__all__ = [
    "CLASS_COLORS",
    "MIB",
    "latency_figure",
    "layout_figure",
    "live_bytes_figure",
    "overview_figure",
    "peak_figure",
]

MIB = float(2**20)
CLASS_COLORS = {
    "activation": "#4C78A8", "gradient": "#F58518", "temporary": "#54A24B", "input": "#B279A2",
    "parameter": "#E45756", "optimizer_state": "#72B7B2", "constant": "#9D755D", "scratch": "#EECA3B",
}
_PEER_COLORS = {"ONNX Runtime": "#888888", "PyTorch": "#EE4C2C"}
_BASE = {"template": "plotly_white", "margin": {"l": 70, "r": 20, "t": 105, "b": 50}, "height": 470,
             "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.01, "x": 0}, "title_y": 0.97, "title_yanchor": "top"}


def _color(vclass: str) -> str:
    return CLASS_COLORS.get(vclass, "#BAB0AC")


def _dropdown(labels: list[str], visible: list[list[bool]], active: int,
              titles: list[str] | None = None) -> list[dict]:
    if len(labels) < 2:
        return []
    buttons = [{"label": label, "method": "update",
                    "args": [{"visible": vis}] + ([{"title.text": titles[i]}] if titles else [])}
               for i, (label, vis) in enumerate(zip(labels, visible))]
    return [{"buttons": buttons, "active": active, "x": 1.0, "xanchor": "right", "y": 1.2, "yanchor": "bottom",
                 "showactive": True, "direction": "down"}]


def _plans_visibility(counts: list[int]) -> list[list[bool]]:
    total = sum(counts)
    out, start = [], 0
    for n in counts:
        out.append([start <= i < start + n for i in range(total)])
        start += n
    return out


def _layout_traces(plan: PlanEntry, columns: list[str], visible: bool) -> list[go.Bar]:
    """One horizontal bar trace per value class: bar = buffer, x = EO span, y = offset range."""
    by_class: dict[str, list[PlannedBuffer]] = {}
    for b in plan_buffers(plan, columns):
        if b.bytes > 0:
            by_class.setdefault(b.vclass, []).append(b)
    traces = []
    for vclass, bufs in sorted(by_class.items()):
        first = [b.first_eo for b in bufs]
        span = [b.last_eo - b.first_eo + 1 for b in bufs]
        size = [b.bytes / MIB for b in bufs]
        mid = [b.offset / MIB + s / 2 for b, s in zip(bufs, size)]
        custom = [[b.name, b.bytes, vclass, b.first_eo, b.last_eo, b.offset] for b in bufs]
        traces.append(go.Bar(
            x=span, base=first, y=mid, width=size, orientation="h", name=vclass, visible=visible,
            marker={"color": _color(vclass), "line": {"color": "rgba(0,0,0,0.45)", "width": 0.5}},
            customdata=custom, legendgroup=vclass,
            hovertemplate=("<b>%{customdata[0]}</b><br>%{customdata[1]:,} B (%{customdata[2]})<br>"
                           "EO %{customdata[3]}–%{customdata[4]}, offset %{customdata[5]:,}<extra></extra>"),
        ))
    return traces


def layout_figure(model: str, plans: list[tuple[str, PlanEntry]], columns: list[str], active: int = 0) -> go.Figure:
    """The arena of each strategy's plan (dropdown): rectangles coloured by value class."""
    fig = go.Figure()
    counts = []
    for i, (_, plan) in enumerate(plans):
        traces = _layout_traces(plan, columns, i == active)
        counts.append(len(traces))
        fig.add_traces(traces)
    titles = [f"{model}: arena layout, {name} ({plan.order_policy}+{plan.planner}, "
              f"arena {plan.arena_bytes / MIB:.2f} MiB)" for name, plan in plans]
    fig.update_layout(
        **_BASE, title=titles[active], xaxis_title="execution order (EO)", yaxis_title="arena offset (MiB)",
        bargap=0, barmode="overlay",
        updatemenus=_dropdown([n for n, _ in plans], _plans_visibility(counts), active, titles),
    )
    return fig


def _live_series(plan: PlanEntry, columns: list[str]) -> list[float]:
    bufs = [Buffer(b.name, b.bytes, b.first_eo, b.last_eo) for b in plan_buffers(plan, columns)]
    live = live_bytes_by_eo(bufs)
    n = max(plan.eo_count, len(live))
    live = live + [0] * (n - len(live))
    return [(plan.persistent_bytes + v) / MIB for v in live]


def live_bytes_figure(model: str, plans: list[tuple[str, PlanEntry]], columns: list[str], budget: int | None,
                      active: int = 0) -> go.Figure:
    """Bytes live at each EO (persistent + transient) against the lower bound, the planned
    peak and the budget, for each strategy (dropdown)."""
    fig = go.Figure()
    counts = []
    for i, (name, plan) in enumerate(plans):
        y = _live_series(plan, columns)
        x = list(range(len(y)))
        vis = i == active
        traces = [
            go.Scatter(x=x, y=y, mode="lines", line={"shape": "hv", "color": "#4C78A8"}, fill="tozeroy",
                       name="live bytes", visible=vis,
                       hovertemplate="EO %{x}: %{y:.2f} MiB<extra>live</extra>"),
            go.Scatter(x=[0, max(len(y) - 1, 1)], y=[plan.lower_bound_bytes / MIB] * 2, mode="lines",
                       line={"dash": "dash", "color": "#54A24B"}, name="lower bound", visible=vis),
            go.Scatter(x=[0, max(len(y) - 1, 1)], y=[plan.peak_bytes / MIB] * 2, mode="lines",
                       line={"dash": "dot", "color": "#F58518"}, name="planned peak", visible=vis),
            go.Scatter(x=[0, max(len(y) - 1, 1)], y=[plan.persistent_bytes / MIB] * 2, mode="lines",
                       line={"dash": "dot", "color": "#9D755D", "width": 1}, name="persistent", visible=vis),
        ]
        if budget is not None:
            traces.append(go.Scatter(x=[0, max(len(y) - 1, 1)], y=[budget / MIB] * 2, mode="lines",
                                     line={"color": "#E45756", "width": 2}, name="budget", visible=vis))
        counts.append(len(traces))
        fig.add_traces(traces)
    fig.update_layout(**_BASE, title=f"{model}: bytes live over the step"
                      + ("" if budget is not None else " (no budget set)"),
                      xaxis_title="execution order (EO)", yaxis_title="MiB",
                      updatemenus=_dropdown([n for n, _ in plans], _plans_visibility(counts), active))
    return fig


def _peer_values(peers: dict[str, PeerFigures], name: str) -> tuple[list[str], list[float]]:
    names: list[str] = []
    values: list[float] = []
    for key, label in (("ort", "ONNX Runtime"), ("torch", "PyTorch")):
        value = getattr(peers.get(key) or PeerFigures(), name)
        if value is not None:
            names.append(label)
            values.append(value)
    return names, values


def peak_figure(model: str, rows: list[BenchRow], peers: dict[str, PeerFigures]) -> go.Figure:
    """Peak memory by strategy (planned, lower bound, measured) next to ORT's and PyTorch's."""
    names = [r.strategy for r in rows]
    fig = go.Figure([
        go.Bar(x=names, y=[r.planned_peak_bytes / MIB for r in rows], name="planned peak",
               marker_color="#4C78A8", hovertemplate="%{x}: %{y:.2f} MiB<extra>planned</extra>"),
        go.Bar(x=names, y=[None if r.measured_peak_bytes is None else r.measured_peak_bytes / MIB for r in rows],
               name="measured peak (onnxplan)", marker_color="#72B7B2",
               hovertemplate="%{x}: %{y:.2f} MiB<extra>measured</extra>"),
    ])
    fig.add_trace(go.Scatter(x=names, y=[r.lower_bound_bytes / MIB for r in rows], mode="markers",
                             marker={"symbol": "line-ew-open", "size": 28, "color": "#54A24B", "line": {"width": 3}},
                             name="lower bound", hovertemplate="%{x}: %{y:.2f} MiB<extra>lower bound</extra>"))
    pnames, pvalues = _peer_values(peers, "peak_bytes")
    if pnames:
        fig.add_trace(go.Bar(x=pnames, y=[v / MIB for v in pvalues], name="peers (measured)",
                             marker_color=[_PEER_COLORS[n] for n in pnames],
                             hovertemplate="%{x}: %{y:.2f} MiB<extra>measured</extra>"))
    fig.update_layout(**_BASE, title=f"{model}: peak memory by strategy", yaxis_title="MiB", barmode="group")
    return fig


def _latency_bar(names: list[str], timed: Sequence[BenchRow | PeerFigures], label: str, color) -> go.Bar:
    """Median step per bar with min-max whiskers; `color`: one, or one per bar."""
    med = [t.median_step_seconds for t in timed]
    ms = [None if m is None else m * 1000 for m in med]
    plus = [None if m is None or t.max_step_seconds is None else (t.max_step_seconds - m) * 1000
            for m, t in zip(med, timed)]
    minus = [None if m is None or t.min_step_seconds is None else (m - t.min_step_seconds) * 1000
             for m, t in zip(med, timed)]
    return go.Bar(x=names, y=ms, name=label, marker_color=color,
                  error_y={"type": "data", "array": plus, "arrayminus": minus, "visible": True},
                  hovertemplate="%{x}: %{y:.1f} ms<extra>" + label + "</extra>")


def latency_figure(model: str, rows: list[BenchRow], peers: dict[str, PeerFigures]) -> go.Figure:
    """Median step latency by strategy (bars, min-max whiskers) next to ORT's and PyTorch's."""
    fig = go.Figure([_latency_bar([r.strategy for r in rows], rows, "onnxplan (median)", "#4C78A8")])
    pnames, prows = [], []
    for key, label in (("ort", "ONNX Runtime"), ("torch", "PyTorch")):
        figures = peers.get(key)
        if figures is not None and figures.median_step_seconds is not None:
            pnames.append(label)
            prows.append(figures)
    if pnames:
        fig.add_trace(_latency_bar(pnames, prows, "peers (median)", [_PEER_COLORS[n] for n in pnames]))
    measured = any(r.median_step_seconds is not None for r in rows)
    title = f"{model}: step latency" + ("" if measured else " (onnxplan not measured in this run)")
    fig.update_layout(**_BASE, title=title, yaxis_title="ms per training step", barmode="group")
    if not measured and not pnames:
        fig.add_annotation(text="no step was run (bench --no-measure)", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper", font={"size": 16, "color": "#888"})
    return fig


def overview_figure(groups: list[ModelGroup]) -> go.Figure:
    """Every model: best planned peak, onnxplan measured, ORT and PyTorch peaks (log scale)."""
    best = [g.best for g in groups]
    models = [r.model for r in best]
    series: list[tuple[str, list[float | None], str]] = [("planned (best strategy)", [r.planned_peak_bytes for r in best], "#4C78A8"),
              ("lower bound", [r.lower_bound_bytes for r in best], "#54A24B"),
              ("onnxplan measured", [r.measured_peak_bytes for r in best], "#72B7B2"),
              ("ONNX Runtime", [g.peer("ort").peak_bytes for g in groups], "#888888"),
              ("PyTorch", [g.peer("torch").peak_bytes for g in groups], "#EE4C2C")]
    fig = go.Figure()
    for name, values, color in series:
        if any(v is not None for v in values):
            fig.add_trace(go.Bar(x=models, y=[None if v is None else v / MIB for v in values], name=name,
                                 marker_color=color, hovertemplate="%{x}: %{y:.2f} MiB<extra>" + name + "</extra>"))
    fig.update_layout(**_BASE, title="Peak memory of one training step, every model", yaxis_title="MiB (log)",
                      yaxis_type="log", barmode="group")
    return fig
