"""The Plan: execution order and arena offsets of one training step, as versioned JSON
(onnxplan/PLAN_SCHEMA.md)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from onnxplan.errors import ModelError
from onnxplan.plan_records import (CheckpointRecord, JointRecord, PlanSettings, SolverStats, StrategyRecord, SwapRecord, from_v1,
                                   to_v1)

__all__ = ["READABLE_VERSIONS", "SCHEMA_VERSION", "PlannedBuffer", "PlannedSwap", "Plan"]

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: migrated on load (its `options` read into the typed sections)


@dataclass(frozen=True)
class PlannedBuffer:
    """One arena buffer: its values, byte size, class, EO span and offset."""

    name: str
    bytes: int
    vclass: str
    first_eo: int
    last_eo: int
    offset: int
    aliases: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["class"] = d.pop("vclass")
        d["aliases"] = list(self.aliases)
        return d


@dataclass(frozen=True)
class PlannedSwap:
    """One eviction of a buffer between two uses (onnxplan.swap): its SwapOut node releases
    the memory at out_eo, its SwapIn node brings the bytes back at in_eo, before next_use.

    `wraps`: a persistent value (parameter, optimizer state) whose home between steps is the
    swap store; out_eo (after its last use, the write-back) comes after in_eo (before its first
    use). `write` False: the store already holds these bytes, the swap-out only frees memory.
    """

    value: str  # the buffer (alias-group root) that leaves memory; also the store slot
    bytes: int
    vclass: str
    out_node: str
    in_node: str
    out_eo: int
    in_eo: int
    last_use: str = ""  # node before the gap ("" for a step input fed before EO 0)
    next_use: str = ""  # node after the gap
    write: bool = True
    wraps: bool = False

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["class"] = d.pop("vclass")
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "PlannedSwap":
        return cls(d["value"], int(d["bytes"]), d["class"], d["out_node"], d["in_node"], int(d["out_eo"]),
                   int(d["in_eo"]), d.get("last_use", ""), d.get("next_use", ""), bool(d.get("write", True)),
                   bool(d.get("wraps", False)))


@dataclass(frozen=True)
class Plan:
    """A promise the executor keeps: order, where every transient byte lives, the peak."""

    model: str
    order: tuple[str, ...]
    buffers: tuple[PlannedBuffer, ...]
    persistent_bytes: int
    arena_bytes: int
    lower_bound_bytes: int  # persistent + live-bytes bound of the transient part
    planner: str
    order_policy: str
    solve_seconds: float
    passes: tuple[str, ...] = ()
    settings: PlanSettings = PlanSettings()
    solver: SolverStats = SolverStats()
    swap: SwapRecord = SwapRecord()  # the swap policy's record (policy "none": no swap)
    checkpoint: CheckpointRecord | None = None  # a checkpoint policy's schedule (onnxplan.budget)
    strategy: StrategyRecord | None = None  # the budget layer's choice when no policy was named
    joint: JointRecord | None = None  # the joint solver's schedule (strategy "joint")
    swaps: tuple[PlannedSwap, ...] = ()  # onnxplan.swap: evictions; the order holds their nodes
    # what the plan was made for: StepGraph.fingerprint() of the loaded (pre-pass) graph, the
    # onnxplan version, and the model reference `run --plan` resolves without a MODEL
    # (model: zoo name or absolute path; batch, dims, optimizer, loss; content_hash)
    graph_fingerprint: str = ""
    onnxplan_version: str = ""
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def peak_bytes(self) -> int:
        return self.persistent_bytes + self.arena_bytes

    @property
    def fragmentation(self) -> float:
        transient_bound = self.lower_bound_bytes - self.persistent_bytes
        return self.arena_bytes / transient_bound - 1.0 if transient_bound > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "model": self.model,
            "onnxplan_version": self.onnxplan_version,
            "graph_fingerprint": self.graph_fingerprint,
            "source": self.source,
            "order_policy": self.order_policy,
            "planner": self.planner,
            "passes": list(self.passes),
            "settings": self.settings.to_json(),
            "solver": self.solver.to_json(),
            "swap": self.swap.to_json(),
            "checkpoint": self.checkpoint.to_json() if self.checkpoint is not None else None,
            "strategy": self.strategy.to_json() if self.strategy is not None else None,
            "joint": self.joint.to_json() if self.joint is not None else None,
            "options": self.options,  # schema 1's view of the sections above, for its readers; not read
            "persistent_bytes": self.persistent_bytes,
            "arena_bytes": self.arena_bytes,
            "peak_bytes": self.peak_bytes,
            "lower_bound_bytes": self.lower_bound_bytes,
            "fragmentation": self.fragmentation,
            "solve_seconds": self.solve_seconds,
            "order": list(self.order),
            "buffers": [b.to_json() for b in self.buffers],
            "swaps": [s.to_json() for s in self.swaps],
        }

    @property
    def options(self) -> dict[str, Any]:
        """The sections as schema 1's free-form `options` (written for readers of v1 files)."""
        return to_v1(self.settings, self.solver, self.swap, self.checkpoint, self.strategy, self.joint)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Plan":
        """A plan of schema 2, or of schema 1 migrated (its `options` read into the sections);
        any other version, or a malformed plan, is a one-line ModelError (exit 2)."""
        if not isinstance(d, dict):
            raise ModelError(f"not a plan: the JSON is {type(d).__name__}, not an object")
        version = d.get("schema_version")
        if version not in READABLE_VERSIONS:
            raise ModelError(f"plan schema_version {version!r} is not one this onnxplan reads "
                             f"({', '.join(map(str, READABLE_VERSIONS))}): make the plan again with `onnxplan plan -o`")
        try:
            buffers = tuple(
                PlannedBuffer(b["name"], int(b["bytes"]), b["class"], int(b["first_eo"]),
                              int(b["last_eo"]), int(b["offset"]), tuple(b.get("aliases", ())))
                for b in d["buffers"]
            )
            sections = from_v1(dict(d.get("options") or {})) if version == 1 else _sections(d)
            return cls(d["model"], tuple(d["order"]), buffers, int(d["persistent_bytes"]),
                       int(d["arena_bytes"]), int(d["lower_bound_bytes"]), d["planner"],
                       d["order_policy"], float(d["solve_seconds"]), tuple(d.get("passes", ())),
                       swaps=tuple(PlannedSwap.from_json(s) for s in d.get("swaps", ())),
                       graph_fingerprint=str(d.get("graph_fingerprint", "")),
                       onnxplan_version=str(d.get("onnxplan_version", "")),
                       source=dict(d.get("source") or {}), **sections)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ModelError(f"malformed plan: {type(exc).__name__}: {exc}") from None

    @classmethod
    def load(cls, path: Path | str) -> "Plan":
        path = Path(path)
        try:
            return cls.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            raise ModelError(f"{path}: no such plan file") from None
        except IsADirectoryError:
            raise ModelError(f"{path}: is a folder, not a plan file") from None
        except OSError as exc:
            raise ModelError(f"{path}: unreadable plan file ({exc.strerror or exc})") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelError(f"{path}: not a plan JSON file ({exc})") from None
        except ModelError as exc:
            raise ModelError(f"{path}: {exc}") from None


def _sections(d: dict[str, Any]) -> dict[str, Any]:
    """The typed sections of a schema-2 plan (Plan field name -> record)."""
    return {
        "settings": PlanSettings.from_json(d["settings"]),
        "solver": SolverStats.from_json(d["solver"]),
        "swap": SwapRecord.from_json(d["swap"]),
        "checkpoint": CheckpointRecord.from_json(d["checkpoint"]) if d.get("checkpoint") else None,
        "strategy": StrategyRecord.from_json(d["strategy"]) if d.get("strategy") else None,
        "joint": JointRecord.from_json(d["joint"]) if d.get("joint") else None,
    }
