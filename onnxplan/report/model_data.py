"""Bench results grouped for the report: per (model, batch) its rows, plans, peers and best row."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from onnxplan.bench.result_models import BenchRow, PeerFigures, PlanEntry
from onnxplan.bench.results import BUFFER_COLUMNS, peer_key, plan_key
from onnxplan.json_models import record_of
from onnxplan.plan import PlannedBuffer

__all__ = ["ModelGroup", "group_models", "plan_buffers", "slug"]


@dataclass
class ModelGroup:
    """One model at one batch size: its rows in strategy order, their plans and the peers."""

    model: str
    batch: int | None
    rows: list[BenchRow]
    plans: list[tuple[str, PlanEntry]]  # (strategy, plan) for the rows that have one
    peers: dict[str, PeerFigures] = field(default_factory=dict)
    budget: int | None = None

    @property
    def title(self) -> str:
        return self.model if self.batch is None else f"{self.model} (batch {self.batch})"

    @property
    def best(self) -> BenchRow:
        """The row with the smallest planned peak (the first such in strategy order)."""
        return min(self.rows, key=lambda r: r.planned_peak_bytes)

    @property
    def best_plan_index(self) -> int:
        names = [name for name, _ in self.plans]
        return names.index(self.best.strategy) if self.best.strategy in names else 0

    def peer(self, name: str) -> PeerFigures:
        """A peer's figures (all None when it was not measured)."""
        return self.peers.get(name) or PeerFigures()


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "model"


def group_models(doc: dict[str, Any]) -> list[ModelGroup]:
    """Rows grouped by (model, batch), in the order models first appear; strategies in the
    order of the run's config (then first appearance)."""
    order = {name: i for i, name in enumerate(doc.get("config", {}).get("strategies", []))}
    groups: dict[tuple, list[BenchRow]] = {}
    for row in map(BenchRow.of, doc["rows"]):
        groups.setdefault((row.model, row.batch), []).append(row)
    out = []
    for (model, batch), rows in groups.items():
        rows = sorted(rows, key=lambda r: (order.get(r.strategy, len(order)), rows.index(r)))
        plans = [(r.strategy, record_of(PlanEntry, doc["plans"][plan_key(model, batch, r.strategy)])) for r in rows
                 if plan_key(model, batch, r.strategy) in doc["plans"]]
        budget = next((r.budget_bytes for r in rows if r.budget_bytes is not None), None)
        peers = {name: record_of(PeerFigures, figures)
                 for name, figures in doc["peers"].get(peer_key(model, batch), {}).items()}
        out.append(ModelGroup(model, batch, rows, plans, peers, budget))
    return out


def buffer_columns(doc: dict[str, Any]) -> list[str]:
    return list(doc.get("buffer_columns") or BUFFER_COLUMNS)


def plan_buffers(plan: PlanEntry, columns: list[str]) -> list[PlannedBuffer]:
    """A plan entry's buffers (lists in `columns` order) as records."""
    names = {"class": "vclass"}
    return [PlannedBuffer(**{names.get(c, c): v for c, v in zip(columns, b) if c in _BUFFER_KEYS})
            for b in plan.buffers]


_BUFFER_KEYS = set(BUFFER_COLUMNS)
