"""What a plan does, for `onnxplan explain`: per checkpoint stage what is kept and recomputed,
per value a joint schedule decided what became of it, the ConvGrads split-grad split. Built
from the plan (and the graph its passes rewrote); the CLI only formats it."""

from __future__ import annotations

from dataclasses import dataclass

from onnxplan.ir.graph import StepGraph, recomputed_from
from onnxplan.plan import Plan, PlannedSwap
from onnxplan.plan_records import CheckpointRecord

__all__ = ["JointRow", "StageRow", "joint_rows", "recompute_copies", "split_convgrads", "stage_rows"]


@dataclass(frozen=True)
class StageRow:
    """One stage of a checkpoint plan: what its forward pass keeps and what is recomputed."""

    stage: int
    nodes: int
    span: str  # first node .. last node
    output: str
    forward_pass: str  # "keep all", "keep input" or "keep nothing"
    runs: int  # forward runs per step (> 1: recomputed)
    kept_bytes: int  # bytes the forward pass keeps for the backward
    kept: tuple[str, ...]
    recomputed: tuple[str, ...]
    recomputed_bytes: int
    extra_seconds: float
    not_recomputable: str = ""


@dataclass(frozen=True)
class JointRow:
    """One value a joint schedule decided, or one swap the swap module planned on top of it."""

    value: str
    bytes: int
    kept_into: tuple[int, ...]
    recomputed_in: tuple[int, ...]
    recomputed_by: str
    copies: tuple[str, ...]  # the recomputing node's copies in the order (NODE@rcK)
    swaps: tuple[PlannedSwap, ...]
    paged_out: bool  # paged by the schedule, its swaps replaced by the swap module's
    extra_seconds: float | None  # None: a swap module's swap with no store bandwidth to price it
    from_swap_module: bool = False


def split_convgrads(graph: StepGraph) -> list[str]:
    """The ConvGrad nodes split-grad split (by their names before the split)."""
    return [n.name.removesuffix("/dX") for n in graph.nodes if n.op_type == "ConvGradInput" and n.domain == "onnxplan"]


def stage_rows(info: CheckpointRecord) -> list[StageRow]:
    """The stages of a plan's checkpoint record, each with the bytes its forward pass keeps:
    all its values (keep all), the previous stage's output (keep input) or none."""
    rows, prev_a = [], 0
    for s in info.stages:
        mode = s.forward_pass
        kept = s.abar_bytes if mode == "keep all" else prev_a if mode == "keep input" else 0
        span = s.first if s.first == s.last else f"{s.first} .. {s.last}"
        rows.append(StageRow(s.stage, s.nodes, span, s.output, mode, s.runs, kept, tuple(s.kept),
                             tuple(s.recomputed), s.abar_bytes if s.recomputed else 0, s.extra_seconds,
                             s.not_recomputable or ""))
        prev_a = s.a_bytes
    return rows


def recompute_copies(order: list[str]) -> dict[str, list[str]]:
    """Node -> its recomputed copies (NODE@rcK) in `order` (one parser of copy names: ir.graph.recomputed_from)."""
    copies: dict[str, list[str]] = {}
    for name in order:
        base = recomputed_from(name)
        if base is not None:
            copies.setdefault(base, []).append(name)
    return copies


def joint_rows(plan: Plan) -> list[JointRow]:
    """Per buffer the joint schedule decided: kept, recomputed (by which node, its copies),
    swapped (the plan's swaps of its alias group); then the swap module's swaps planned on top,
    each priced at the store's bandwidth (its bytes, twice when written out)."""
    j = plan.joint
    if j is None:
        return []
    group = {v: b.name for b in plan.buffers for v in (b.name, *b.aliases)}  # value -> its buffer
    swaps: dict[str, list[PlannedSwap]] = {}
    for sw in plan.swaps:
        swaps.setdefault(group.get(sw.value, sw.value), []).append(sw)
    copies = recompute_copies(list(plan.order))
    rows: list[JointRow] = []
    shown: set[int] = set()
    for b in j.buffers:
        mine = swaps.get(group.get(b.buffer, b.buffer), [])
        shown.update(id(sw) for sw in mine)
        rows.append(JointRow(b.buffer, b.bytes, tuple(b.kept_into), tuple(b.recomputed_in), b.recomputed_by,
                             tuple(copies.get(b.recomputed_by, ())), tuple(mine), b.paged_out, b.extra_seconds))
    for sw in plan.swaps:
        if id(sw) not in shown:
            moved = sw.bytes * (2 if sw.write else 1)
            seconds = moved / j.swap_bandwidth if j.swap_bandwidth else None
            rows.append(JointRow(sw.value, sw.bytes, (), (), "", (), (sw,), False, seconds, from_swap_module=True))
    return rows
