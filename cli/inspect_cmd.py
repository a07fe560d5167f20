"""`onnxplan inspect MODEL`: nodes, values and bytes by class, op histogram."""

from __future__ import annotations

import typer
from rich.table import Table

from onnxplan.cli import options as opt
from onnxplan.cli.common import (
    console,
    handle_errors,
    model_request,
    print_json,
)
from onnxplan.loading import load_step
from onnxplan.loading.parameters import parameter_report
from onnxplan.progress import Progress
from onnxplan.sizes import format_bytes

__all__ = ["inspect_command", "inspect_summary"]


def inspect_summary(graph) -> dict:
    counts: dict[str, int] = {}
    for v in graph.values.values():
        counts[v.vclass.value] = counts.get(v.vclass.value, 0) + 1
    return {
        "model": graph.name,
        "nodes": len(graph.nodes),
        "values": len(graph.values),
        "values_by_class": counts,
        "bytes_by_class": graph.bytes_by_class(),
        "persistent_bytes": graph.persistent_bytes,
        "ops": dict(sorted(graph.op_histogram().items(), key=lambda kv: (-kv[1], kv[0]))),
        "phases": {p: sum(n.phase == p for n in graph.nodes) for p in ("forward", "backward", "optimizer")},
        "optimizer": graph.optimizer.get("type"),
        "unshaped_values": graph.unshaped_values(),
        "ops_without_rule": [],
        "parameters": parameter_report(graph).to_json(),
    }


def inspect_command(
    model: str = opt.MODEL,
    batch: int = opt.BATCH,
    dim: list[str] = opt.DIM,
    optimizer: str = opt.OPTIMIZER,
    loss: str = opt.LOSS,
    train: list[str] = opt.TRAIN,
    freeze: list[str] = opt.FREEZE,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Show one training step: nodes, values and bytes by class, op histogram.

    Every value must get a static shape; an op without a shape rule is an error (exit 2).
    """
    handle_errors(_inspect)(model, batch, dim, optimizer, loss, json_out, train, freeze)


def _inspect(model, batch, dim, optimizer, loss, json_out, train=None, freeze=None) -> None:
    req = model_request(model, batch, optimizer, loss, dim, train, freeze)
    with Progress("inspect") as progress:  # building artifacts (an export, ORT's generation) takes a while
        progress.update(f"loading {model}")
        graph = load_step(req)
    s = inspect_summary(graph)
    if json_out:
        print_json(s)
        return
    con = console(120)
    con.print(f"[bold]{s['model']}[/]: {s['nodes']} nodes ({s['phases']['forward']} forward, "
              f"{s['phases']['backward']} backward, {s['phases']['optimizer']} optimizer), "
              f"{s['values']} values, optimizer {s['optimizer']}")
    t = Table("class", "values", "bytes", title="values by class")
    for cls, b in s["bytes_by_class"].items():
        t.add_row(cls, str(s["values_by_class"].get(cls, 0)), format_bytes(b))
    con.print(t)
    t = Table("op", "count", title="op histogram")
    for op, c in s["ops"].items():
        t.add_row(op, str(c))
    con.print(t)
    for line in parameter_report(graph).lines():
        con.print(line, highlight=False, markup=False)
    con.print(f"values without a shape: {len(s['unshaped_values'])}; "
              f"ops without a shape rule: {len(s['ops_without_rule'])}")
