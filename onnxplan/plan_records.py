"""The typed sections of a Plan (schema v2): planning settings, solver statistics, swap,
checkpoint, joint-solver and memory-strategy records. Each reads and writes its own JSON object; `from_v1`
reads the free-form `options` of a schema-1 plan file into them (onnxplan/PLAN_SCHEMA.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["CheckpointRecord", "JointBuffer", "JointRecord", "PlanSettings", "SolverStats", "StrategyCandidate", "StrategyRecord", "SwapRecord",
           "from_v1"]


def _take(cls, d: dict[str, Any]) -> dict[str, Any]:
    """The keys of `d` that are fields of `cls` (a record written by a later version may have more)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


@dataclass(frozen=True)
class PlanSettings:
    """What plan_step was asked: the optional passes and the ILP time limit (None: anytime default)."""

    interleave: bool = True
    inplace: bool = True
    time_limit: float | None = None
    split_grad: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PlanSettings:
        limit = d.get("time_limit")
        return cls(bool(d.get("interleave", True)), bool(d.get("inplace", True)),
                   None if limit is None else float(limit), bool(d.get("split_grad", False)))


@dataclass(frozen=True)
class SolverStats:
    """How the order was found (seconds; for the ILP order whether proven optimal, its gap, its
    notes) and what the anytime default skipped, and why."""

    order_seconds: float = 0.0
    order_optimal: bool | None = None
    order_gap: float | None = None
    order_notes: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "order_notes": list(self.order_notes), "skipped": list(self.skipped)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SolverStats:
        gap = d.get("order_gap")
        optimal = d.get("order_optimal")
        return cls(float(d.get("order_seconds", 0.0)), None if optimal is None else bool(optimal),
                   None if gap is None else float(gap), tuple(map(str, d.get("order_notes", ()))),
                   tuple(map(str, d.get("skipped", ()))))


@dataclass(frozen=True)
class SwapRecord:
    """The swap policy asked for and the one planned (policy "none": no swap), its settings,
    the budget it worked towards, and its transfers per step."""

    policy: str = "none"
    requested: str = "none"
    described: str = ""
    budget: int | None = None
    lookahead: int | None = None  # proactive
    window_bytes: int | None = None  # window
    swaps: int = 0
    transfers: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    # the swap store the transfers were priced for (onnxplan.swap.pricing.StoreRates.record):
    # folder (None: the default), store, bandwidth, cpu_per_byte, source; None: no swaps
    store: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SwapRecord:
        return cls(**_take(cls, d))


@dataclass(frozen=True)
class CheckpointRecord:
    """The recompute schedule a checkpoint policy chose (onnxplan.budget): the policy, the
    schedule the recompute pass replays, per-stage rows (what is kept, recomputed, how often it
    runs), the chain model's time and peak, the predicted step time with and without, notes,
    and the schedules tried."""

    policy: str
    schedule: str = ""
    budget_bytes: int | None = None
    slots: int = 0
    stages: tuple[dict[str, Any], ...] = ()
    time_source: str = ""
    chain_time_seconds: float = 0.0
    chain_model_peak_bytes: int = 0
    extra_forward_seconds: float = 0.0
    predicted_step_seconds: float | None = None
    predicted_step_seconds_without: float | None = None
    notes: tuple[str, ...] = ()
    select_seconds: float = 0.0
    tried: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "stages": [dict(s) for s in self.stages], "notes": list(self.notes),
                "tried": [dict(t) for t in self.tried]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CheckpointRecord:
        kw = _take(cls, d)
        kw["stages"] = tuple(dict(s) for s in kw.get("stages", ()))
        kw["tried"] = tuple(dict(t) for t in kw.get("tried", ()))
        kw["notes"] = tuple(map(str, kw.get("notes", ())))
        kw["schedule"] = str(kw.get("schedule", ""))
        return cls(**kw)


@dataclass(frozen=True)
class JointBuffer:
    """One buffer the joint solver decided: kept into which stages, recomputed in which (by its
    producer `recomputed_by`, whose copies are `recomputed_by@rcK` in the order), paged out and
    in for which stages, the anchors (backward nodes) that read it, and the predicted extra
    seconds of those choices (recomputations; transfers at the store's bandwidth, before overlap)."""

    buffer: str
    bytes: int
    kept_into: tuple[int, ...] = ()
    recomputed_in: tuple[int, ...] = ()
    recomputed_by: str = ""
    paged_out: bool = False
    paged_in_for: tuple[int, ...] = ()
    anchors: tuple[str, ...] = ()
    extra_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "kept_into": list(self.kept_into), "recomputed_in": list(self.recomputed_in),
                "paged_in_for": list(self.paged_in_for), "anchors": list(self.anchors)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JointBuffer:
        return cls(str(d["buffer"]), int(d["bytes"]), tuple(map(int, d.get("kept_into", ()))),
                   tuple(map(int, d.get("recomputed_in", ()))), str(d.get("recomputed_by", "")),
                   bool(d.get("paged_out", False)), tuple(map(int, d.get("paged_in_for", ()))),
                   tuple(map(str, d.get("anchors", ()))), float(d.get("extra_seconds", 0.0)))


@dataclass(frozen=True)
class JointRecord:
    """The joint solver's schedule (onnxplan.joint, strategy "joint"): the recompute code the
    recompute pass replays, the CP-SAT status and gap (None: no bound), the model's peak
    estimate and the placed peak, the predicted step time and its recompute and stall parts,
    the swap store's bandwidth (None: recompute only), what the times rest on, the rounds
    solved, notes, and per decided buffer what was done (`buffers`: JointBuffer)."""

    schedule: str = ""
    budget_bytes: int | None = None
    status: str = ""
    gap: float | None = None
    estimate_bytes: int = 0
    placed_peak_bytes: int = 0
    predicted_step_seconds: float = 0.0
    recompute_seconds: float = 0.0
    stall_seconds: float = 0.0
    swap_bandwidth: float | None = None
    time_source: str = ""
    stages: int = 0
    order_policy: str = ""
    recomputations: int = 0
    rounds: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    buffers: tuple[JointBuffer, ...] = ()
    # which candidate the strategy returned: "joint", "joint-recompute" (the same without paging),
    # "recompute" (rotor) or "swap" (the budget layer's own strategies, when predicted faster), and
    # every candidate weighed: {"strategy", "peak_bytes", "fits", "predicted_step_seconds"}
    chosen: str = "joint"
    candidates: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "rounds": [dict(r) for r in self.rounds], "notes": list(self.notes),
                "buffers": [b.to_json() for b in self.buffers], "candidates": [dict(c) for c in self.candidates]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JointRecord:
        kw = _take(cls, d)
        kw["schedule"] = str(kw.get("schedule", ""))
        kw["rounds"] = tuple(dict(r) for r in kw.get("rounds", ()))
        kw["notes"] = tuple(map(str, kw.get("notes", ())))
        kw["buffers"] = tuple(JointBuffer.from_json(b) for b in kw.get("buffers", ()))
        kw["candidates"] = tuple(dict(c) for c in kw.get("candidates", ()))
        return cls(**kw)


@dataclass(frozen=True)
class StrategyCandidate:
    strategy: str
    peak_bytes: int
    predicted_step_seconds: float
    fits: bool


@dataclass(frozen=True)
class StrategyRecord:
    """How the budget layer met a budget no policy was named for: each strategy planned (its
    peak, predicted step time, whether it fits), the one chosen and why."""

    chosen: str
    reason: str
    budget_bytes: int | None
    candidates: tuple[StrategyCandidate, ...] = ()

    @property
    def chosen_candidate(self) -> StrategyCandidate | None:
        return next((c for c in self.candidates if c.strategy == self.chosen), None)

    def to_json(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "reason": self.reason, "budget_bytes": self.budget_bytes,
                "candidates": [asdict(c) for c in self.candidates]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StrategyRecord:
        return cls(str(d["chosen"]), str(d.get("reason", "")), d.get("budget_bytes"),
                   tuple(StrategyCandidate(str(c["strategy"]), int(c["peak_bytes"]), float(c["predicted_step_seconds"]),
                                           bool(c["fits"])) for c in d.get("candidates", ())))


def from_v1(options: dict[str, Any]) -> dict[str, Any]:
    """A schema-1 plan's free-form `options` as the v2 sections (Plan field name -> record)."""
    ck, ms, jt = options.get("checkpoint"), options.get("memory_strategy"), options.get("joint")
    return {
        "settings": PlanSettings.from_json(options),
        "solver": SolverStats.from_json(options),
        "swap": SwapRecord.from_json(options.get("swap") or {}),
        "checkpoint": CheckpointRecord.from_json(ck) if ck else None,
        "strategy": StrategyRecord.from_json(ms) if ms else None,
        "joint": JointRecord.from_json(jt) if jt else None,
    }


def to_v1(settings: PlanSettings, solver: SolverStats, swap: SwapRecord, checkpoint: CheckpointRecord | None,
          strategy: StrategyRecord | None, joint: JointRecord | None = None) -> dict[str, Any]:
    """The sections as schema 1's `options` (written beside them for readers of v1 files; never read)."""
    out: dict[str, Any] = {**settings.to_json(), **solver.to_json(),
                           "swap": {k: v for k, v in swap.to_json().items() if v is not None or k == "budget"}}
    if checkpoint is not None:
        out["checkpoint"] = checkpoint.to_json()
    if strategy is not None:
        out["memory_strategy"] = strategy.to_json()
    if joint is not None:
        out["joint"] = joint.to_json()
    return out
