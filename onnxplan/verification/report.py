"""The text of a verification (`run --verify`): a table per step and the verdict."""

from __future__ import annotations

from rich.table import Table

__all__ = ["describe_verification"]


def _cell(worst: dict, key: str) -> str:
    c = worst.get(key)
    if c is None:
        return "-"
    name = "" if key == "loss" else f"{c['name']} "
    if c["error"] is None or c["ratio"] is None:
        return f"{name}{'inf' if c['error'] is None else format(c['error'], '.2e')} (inf x tol)"
    return f"{name}{c['error']:.2e} ({c['ratio']:.2f}x tol)"


def _zero_note(v: dict) -> list[str]:
    """A warning where gradients were exactly 0 on both sides: their checks say nothing."""
    zero: list[str] = max((s.get("zero_gradients", []) for s in v["steps"]), key=len, default=[])
    if not zero:
        return []
    total = v.get("parameters") or 0
    of = f" of {total}" if total else ""
    return [f"[yellow]note[/]: {len(zero)}{of} parameter(s) got a gradient of exactly 0 on both sides "
            f"(e.g. {zero[0]!r}): the comparison says nothing about them; a model whose values underflow "
            "(a fresh deep network at its published size) trains nothing there"]


def _node_line(v: dict) -> list[str]:
    """The per-node check (verification/node_check.py) of the last step compared: how many nodes,
    the worst, what was skipped and why."""
    nodes = v["steps"][-1].get("nodes") if v["steps"] else None
    if not nodes:
        return []
    w = nodes["worst"]
    worst = "" if w is None else (f"; worst {w['node']!r} ({'inf' if w['error'] is None else format(w['error'], '.2e')}"
                                  f", {'inf' if w['ratio'] is None else format(w['ratio'], '.2g')}x tol)")
    skipped = ", ".join(f"{why}: {n}" for why, n in sorted(nodes["skipped"].items())) or "none"
    return [f"per node (each kernel against ONNX Runtime's on the same inputs): {nodes['checked']} node(s) "
            f"checked{worst}; not checked: {skipped}"]


def describe_verification(v: dict) -> list:
    """Rich renderables: per step the loss (ours, ONNX Runtime's from the same state), the worst
    gradient, optimizer update and running statistic (error and its share of the tolerance) and
    the verdict; then the conclusion, with the first differing value on a failure."""
    t = Table("step", "loss", "ONNX Runtime loss", "loss error", "worst gradient", "optimizer update",
              "running statistics", "verdict", title="compared with ONNX Runtime from the same state, step by step")
    for s in v["steps"]:
        w = s["worst"]
        t.add_row(str(s["step"]), f"{s['loss']:.7g}", f"{s['ort_loss']:.7g}", _cell(w, "loss"),
                  _cell(w, "gradient"), _cell(w, "update"), _cell(w, "running"),
                  "[green]ok[/]" if s["ok"] else "[bold red]DIFFERS[/]")
    out: list = [t]
    tol = v["tolerances"]
    if v["ok"]:
        out.append(f"[green]matches ONNX Runtime[/]: {len(v['steps'])} step(s), each from the same state; loss, every "
                   f"gradient, the optimizer's update and the running statistics within tolerance (gradients: "
                   f"relative norm error <= {tol['gradient']:g} or the tensor's own noise)")
        out += _node_line(v)
        out += _zero_note(v)
        return out
    bad = next(s for s in v["steps"] if not s["ok"])
    out.append(f"[bold red]MISMATCH with ONNX Runtime[/] at step {bad['step']} "
               f"(later steps not compared); beyond tolerance:")
    out += [f"  {f}" for f in bad["failures"][:5]]
    fd = bad["first_difference"]
    if fd is not None:
        at = f" computed by node {fd['node']!r}" if fd["node"] else ""
        out.append(f"first value in execution order that differs: {fd['kind']} {fd['name']}{at} "
                   f"(error {'inf' if fd['error'] is None else format(fd['error'], '.3g')}, "
                   f"tolerance {fd['tolerance']:.3g})")
    if bad["explanation"]:
        out.append(f"  {bad['explanation']}")
    return out + _node_line(v)
