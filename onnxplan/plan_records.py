"""The typed sections of a Plan (schema v2): planning settings, solver statistics, swap,
checkpoint, joint-solver and memory-strategy records, and the items they list. Frozen
dataclasses read and written through pydantic (onnxplan.json_models); each field's description
is its line in onnxplan/PLAN_SCHEMA.md (generated: onnxplan.schema_doc). `from_v1` turns a
schema-1 plan's free-form `options` into these sections, `to_v1` writes that view back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from onnxplan.json_models import doc, dumped, optional, typed_items

__all__ = ["CheckpointRecord", "CheckpointStage", "CheckpointTry", "JointBuffer", "JointRecord", "JointRound",
           "PlanSettings", "SolverStats", "StrategyCandidate", "StrategyRecord", "SwapRecord", "from_v1", "to_v1"]


@dataclass(frozen=True)
class PlanSettings:
    """What plan_step was asked: the optional passes and the ILP time limit (None: anytime default)."""

    interleave: Annotated[bool, doc("the interleave pass ran (must agree with `passes`)")] = True
    inplace: Annotated[bool, doc("the in-place pass ran (must agree with `passes`)")] = True
    time_limit: Annotated[float | None, doc("seconds per ILP; null: the anytime default")] = None
    split_grad: Annotated[bool, doc("ConvGrads were split (must agree with `passes`; absent: false)")] = False


@dataclass(frozen=True)
class SolverStats:
    """How the order was found (seconds; for the ILP order whether proven optimal, its gap, its
    notes) and what the anytime default skipped, and why."""

    order_seconds: Annotated[float, doc("seconds the order policy took")] = 0.0
    order_optimal: Annotated[bool | None, doc("ILP order: proven optimal (else null/false)")] = None
    order_gap: Annotated[float | None, doc("ILP order: its relative gap")] = None
    order_notes: Annotated[tuple[str, ...], doc("what the order policy noted")] = ()
    skipped: Annotated[tuple[str, ...], doc("what the anytime default did not run, and why")] = ()


@dataclass(frozen=True)
class SwapRecord:
    """The swap policy asked for and the one planned (policy "none": no swap), its settings,
    the budget it worked towards, and its transfers per step."""

    policy: Annotated[str, doc("`none` (no swap), `on-demand`, `reduced`, `proactive`, `adaptive`, `window`, "
                               "`joint`")] = "none"
    requested: Annotated[str, doc("what was asked, `auto` included")] = "none"
    described: Annotated[str, doc("the policy in words")] = ""
    budget: Annotated[int | None, doc("bytes swapping worked towards, or null")] = None
    lookahead: Annotated[int | None, doc("proactive: nodes of lookahead")] = None
    window_bytes: Annotated[int | None, doc("window: the window's bytes")] = None
    swaps: Annotated[int, doc("swaps per step")] = 0
    transfers: Annotated[int, doc("transfers per step")] = 0
    bytes_out: Annotated[int, doc("bytes written to the store per step")] = 0
    bytes_in: Annotated[int, doc("bytes read back per step")] = 0
    store: Annotated[dict[str, Any] | None, doc(
        "the swap store the transfers were priced for (onnxplan.swap.pricing.StoreRates.record): `folder` "
        "(`--swap-dir`; null: the default temporary folder), `store` (the device it lives on; \"\" for an "
        "override), `bandwidth` (bytes/s), `cpu_per_byte`, `source`: `override` (`$ONNXPLAN_SWAP_BANDWIDTH`), "
        "`measured` or `estimate` (moved by runs' own transfers); null: no swaps; informational, not checked "
        "on load")] = None


@dataclass(frozen=True)
class CheckpointStage:
    """One stage of the checkpoint chain: what its forward pass keeps, what is recomputed, how
    often it runs."""

    stage: Annotated[int, doc("1-based index")]
    nodes: Annotated[int, doc("forward nodes")]
    first: Annotated[str, doc("its first forward node")]
    last: Annotated[str, doc("its last forward node")]
    input: Annotated[str, doc("the value it reads (\"\" for the first stage)")]
    output: Annotated[str, doc("the value it hands on")]
    a_bytes: Annotated[int, doc("bytes of its output")]
    abar_bytes: Annotated[int, doc("bytes its backward reads")]
    forward_pass: Annotated[str, doc("`keep all`, `keep input` or `keep nothing`")]
    runs: Annotated[int, doc("how often its forward runs")]
    kept: Annotated[tuple[str, ...], doc("values the first forward pass keeps")]
    recomputed: Annotated[tuple[str, ...], doc("values recomputed")]
    forward_seconds: Annotated[float, doc("its forward time")]
    extra_seconds: Annotated[float, doc("its forward time x (runs - 1)")]
    not_recomputable: Annotated[str, doc("why it may not run twice (\"\" if it may)")] = ""


@dataclass(frozen=True)
class CheckpointTry:
    """One schedule the checkpoint policy evaluated."""

    schedule: Annotated[str, doc("the schedule's code")]
    planned_peak_bytes: Annotated[int, doc("its planned peak")]
    chain_time_seconds: Annotated[float, doc("the chain model's time of it")]


@dataclass(frozen=True)
class CheckpointRecord:
    """The recompute schedule a checkpoint policy chose (onnxplan.budget): the policy, the
    schedule the recompute pass replays, per-stage rows (what is kept, recomputed, how often it
    runs), the chain model's time and peak, the predicted step time with and without, notes,
    and the schedules tried."""

    policy: Annotated[str, doc("`sqrt`, `chen`, `rotor`")]
    schedule: Annotated[str, doc("the code `recompute:` replays (\"\" when nothing is recomputed); must equal "
                                 "the recompute pass's code (checked on load)")] = ""
    budget_bytes: Annotated[int | None, doc("the budget asked")] = None
    slots: Annotated[int, doc("rotor's table")] = 0
    stages: Annotated[tuple[CheckpointStage, ...], doc("per stage (CheckpointStage)")] = ()
    time_source: Annotated[str, doc("`flops` or `profile`")] = ""
    chain_time_seconds: Annotated[float, doc("the chain model's step time")] = 0.0
    chain_model_peak_bytes: Annotated[int, doc("the chain model's peak")] = 0
    extra_forward_seconds: Annotated[float, doc("recomputation time")] = 0.0
    predicted_step_seconds: Annotated[float | None, doc("predicted step time")] = None
    predicted_step_seconds_without: Annotated[float | None, doc("predicted step time without recomputation")] = None
    notes: Annotated[tuple[str, ...], doc("notes")] = ()
    select_seconds: Annotated[float, doc("seconds choosing the schedule took")] = 0.0
    tried: Annotated[tuple[CheckpointTry, ...], doc("the schedules tried (CheckpointTry)")] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", typed_items(CheckpointStage, self.stages))
        object.__setattr__(self, "tried", typed_items(CheckpointTry, self.tried))


@dataclass(frozen=True)
class JointBuffer:
    """One buffer the joint solver decided: kept into which stages, recomputed in which (by its
    producer `recomputed_by`, whose copies are `recomputed_by@rcK` in the order), paged out and
    in for which stages, the anchors (backward nodes) that read it, and the predicted extra
    seconds of those choices (recomputations; transfers at the store's bandwidth, before overlap)."""

    buffer: Annotated[str, doc("the buffer")]
    bytes: Annotated[int, doc("its bytes")]
    kept_into: Annotated[tuple[int, ...], doc("stages it is kept into")] = ()
    recomputed_in: Annotated[tuple[int, ...], doc("stages it is recomputed in")] = ()
    recomputed_by: Annotated[str, doc("the node whose copies `NODE@rcK` remake it")] = ""
    paged_out: Annotated[bool, doc("paged out by the schedule")] = False
    paged_in_for: Annotated[tuple[int, ...], doc("stages it is paged in for")] = ()
    anchors: Annotated[tuple[str, ...], doc("the backward nodes that read it")] = ()
    extra_seconds: Annotated[float, doc("its recomputations plus its transfers at `swap_bandwidth`, before "
                                        "overlap")] = 0.0


@dataclass(frozen=True)
class JointRound:
    """One solve of the joint model (or the plain or rotor schedule reported as one)."""

    model_budget_bytes: Annotated[int, doc("the budget the model was given")]
    estimate_bytes: Annotated[int, doc("the model's peak")]
    placed_peak_bytes: Annotated[int, doc("the placed plan's peak")]
    status: Annotated[str, doc("CP-SAT's status")]
    gap: Annotated[float | None, doc("relative gap (null: no bound)")]
    solve_seconds: Annotated[float, doc("wall seconds")]
    warm_start: Annotated[str, doc("the hint the solve started from")]
    recompute_seconds: Annotated[float, doc("predicted recomputation")]
    stall_seconds: Annotated[float, doc("predicted exposed transfers")]
    page_ins: Annotated[int, doc("page-ins decided")]
    page_ins_not_lowered: Annotated[tuple[str, ...], doc("page-ins the plan could not lower")]
    time_limit: Annotated[float | None, optional("the round's CP-SAT seconds")] = None
    cpsat_limits: Annotated[tuple[float, ...] | None, optional("every CP-SAT limit the round set")] = None
    stopped: Annotated[str | None, optional("why no round followed (a deadline)")] = None


@dataclass(frozen=True)
class StrategyCandidate:
    """One strategy planned for a budget: its peak, predicted step time, whether it fits."""

    strategy: Annotated[str, doc("the strategy")]
    peak_bytes: Annotated[int, doc("its planned peak")]
    predicted_step_seconds: Annotated[float, doc("its predicted step time")]
    fits: Annotated[bool, doc("its peak is within the budget")]


@dataclass(frozen=True)
class JointRecord:
    """The joint solver's schedule (onnxplan.joint, strategy "joint"): the recompute code the
    recompute pass replays, the CP-SAT status and gap (None: no bound), the model's peak
    estimate and the placed peak, the predicted step time and its recompute and stall parts,
    the swap store's bandwidth (None: recompute only), what the times rest on, the rounds
    solved, notes, and per decided buffer what was done (`buffers`: JointBuffer)."""

    schedule: Annotated[str, doc("the code `recompute:` replays, starting `dag.` (\"\" when nothing is "
                                 "recomputed); must equal the recompute pass's code (checked on load)")] = ""
    budget_bytes: Annotated[int | None, doc("the budget")] = None
    status: Annotated[str, doc("CP-SAT: `OPTIMAL`, `FEASIBLE`, `UNKNOWN`, or `INFEASIBLE (... least memory)`: "
                               "nothing fits the model's budget, its least-peak schedule; a plan of another "
                               "strategy: `RECOMPUTE-STRATEGY` or `SWAP-STRATEGY`")] = ""
    gap: Annotated[float | None, doc("relative gap of the extra seconds; null: no bound")] = None
    estimate_bytes: Annotated[int, doc("the model's peak")] = 0
    placed_peak_bytes: Annotated[int, doc("the placed plan's peak")] = 0
    predicted_step_seconds: Annotated[float, doc("predicted step time")] = 0.0
    recompute_seconds: Annotated[float, doc("its recomputation part")] = 0.0
    stall_seconds: Annotated[float, doc("its exposed transfers")] = 0.0
    swap_bandwidth: Annotated[float | None, doc("bytes/s the page-ins were weighed at; null: recompute "
                                                "only")] = None
    time_source: Annotated[str, doc("what the node times rest on")] = ""
    stages: Annotated[int, doc("backward anchors")] = 0
    order_policy: Annotated[str, doc("the order policy")] = ""
    recomputations: Annotated[int, doc("recomputations decided")] = 0
    rounds: Annotated[tuple[JointRound, ...], doc("per solve (JointRound)")] = ()
    notes: Annotated[tuple[str, ...], doc("notes; when the swap module's `auto` policy was planned on top (the "
                                          "schedule alone missed the budget) a note says so, and the plan's "
                                          "`swaps` are that policy's")] = ()
    buffers: Annotated[tuple[JointBuffer, ...], doc("per buffer the schedule recomputes or pages "
                                                    "(JointBuffer)")] = ()
    chosen: Annotated[str, doc("which candidate the strategy returned: `joint`, `joint-recompute`, `recompute` "
                               "(rotor) or `swap` (a plan of another strategy keeps its own passes)")] = "joint"
    candidates: Annotated[tuple[StrategyCandidate, ...], doc(
        "each candidate weighed on one footing, onnxplan.swap.pricing (StrategyCandidate)")] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "rounds", typed_items(JointRound, self.rounds))
        object.__setattr__(self, "candidates", typed_items(StrategyCandidate, self.candidates))


@dataclass(frozen=True)
class StrategyRecord:
    """How the budget layer met a budget no policy was named for: each strategy planned (its
    peak, predicted step time, whether it fits), the one chosen and why."""

    chosen: Annotated[str, doc("`none`, `recompute`, `swap`, or a strategy registered with "
                               "`onnxplan.budget.register_strategy`")]
    reason: Annotated[str, doc("why, in one line")] = ""
    budget_bytes: Annotated[int | None, doc("the budget")] = None
    candidates: Annotated[tuple[StrategyCandidate, ...], doc("per strategy planned (StrategyCandidate)")] = ()

    @property
    def chosen_candidate(self) -> StrategyCandidate | None:
        return next((c for c in self.candidates if c.strategy == self.chosen), None)


def from_v1(options: dict[str, Any]) -> dict[str, Any]:
    """A schema-1 plan's free-form `options` as the v2 sections' JSON (section name -> object):
    the settings and solver keys at its top level, `swap`, `checkpoint`, `memory_strategy`
    (-> `strategy`), `joint`."""
    return {"settings": options, "solver": options, "swap": options.get("swap") or {},
            "checkpoint": options.get("checkpoint") or None, "strategy": options.get("memory_strategy") or None,
            "joint": options.get("joint") or None}


def to_v1(settings: PlanSettings, solver: SolverStats, swap: SwapRecord, checkpoint: CheckpointRecord | None,
          strategy: StrategyRecord | None, joint: JointRecord | None = None) -> dict[str, Any]:
    """The sections as schema 1's `options` (written beside them for readers of v1 files; never read)."""
    out: dict[str, Any] = {**dumped(settings), **dumped(solver),
                           "swap": {k: v for k, v in dumped(swap).items() if v is not None or k == "budget"}}
    for key, record in (("checkpoint", checkpoint), ("memory_strategy", strategy), ("joint", joint)):
        if record is not None:
            out[key] = dumped(record)
    return out
