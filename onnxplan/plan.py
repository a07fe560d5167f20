"""The Plan: execution order and arena offsets of one training step, as versioned JSON
(onnxplan/PLAN_SCHEMA.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from onnxplan.errors import ModelError
from onnxplan.json_models import doc, dumped, validated
from onnxplan.plan_records import (
    CheckpointRecord,
    JointRecord,
    PlanSettings,
    SolverStats,
    StrategyRecord,
    SwapRecord,
    from_v1,
    to_v1,
)

__all__ = ["READABLE_VERSIONS", "SCHEMA_VERSION", "Plan", "PlannedBuffer", "PlannedPiece", "PlannedSplit", "PlannedSwap"]

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: migrated on load (its `options` read into the typed sections)


@dataclass(frozen=True)
class PlannedBuffer:
    """One arena buffer: its values, byte size, class, EO span and offset."""

    name: Annotated[str, doc("the buffer (alias-group root)")]
    bytes: Annotated[int, doc("its size")]
    vclass: Annotated[str, doc("its value class", alias="class")]
    first_eo: Annotated[int, doc("the EO that writes it first")]
    last_eo: Annotated[int, doc("the EO that reads it last")]
    offset: Annotated[int, doc("its arena offset")]
    aliases: Annotated[tuple[str, ...], doc("values merged into it")] = ()


@dataclass(frozen=True)
class PlannedSwap:
    """One eviction of a buffer between two uses (onnxplan.swap): its SwapOut node releases
    the memory at out_eo, its SwapIn node brings the bytes back at in_eo, before next_use.

    `wraps`: a persistent value (parameter, optimizer state) whose home between steps is the
    swap store; out_eo (after its last use, the write-back) comes after in_eo (before its first
    use). `write` False: the store already holds these bytes, the swap-out only frees memory.
    """

    value: Annotated[str, doc("the buffer (alias-group root) that leaves memory; also the store slot")]
    bytes: Annotated[int, doc("its size")]
    vclass: Annotated[str, doc("its value class", alias="class")]
    out_node: Annotated[str, doc("its SwapOut node")]
    in_node: Annotated[str, doc("its SwapIn node")]
    out_eo: Annotated[int, doc("the EO its memory is released")]
    in_eo: Annotated[int, doc("the EO its bytes come back")]
    last_use: Annotated[str, doc("node before the gap (\"\" for a step input fed before EO 0)")] = ""
    next_use: Annotated[str, doc("node after the gap")] = ""
    write: Annotated[bool, doc("false: the store already holds these bytes, the swap-out only frees memory")] = True
    wraps: Annotated[bool, doc("a persistent value whose home between steps is the swap store")] = False


@dataclass(frozen=True)
class PlannedSplit:
    """One node split in chunks (onnxplan.passes.split): `k` chunk nodes `NODE#j` over pieces
    of its tensors along `axis`."""

    node: Annotated[str, doc("the node split (its chunks are `NODE#0` .. `NODE#K-1`)")]
    op: Annotated[str, doc("its chunks' op (`domain.op` outside the default domain); `fold` for k 1")]
    axis: Annotated[int, doc("the axis of its output cut in pieces")]
    k: Annotated[int, doc("chunks (1: a transpose folded into its products, passes/split_fold.py: no chunk)")]


@dataclass(frozen=True)
class PlannedPiece:
    """One transfer of the split pass: node `node` moves `nbytes` between the arena and byte
    `offset` of host slot `slot` (`out`: to the slot; `in`: back)."""

    node: Annotated[str, doc("its PieceOut / PieceIn node")]
    kind: Annotated[str, doc("`out` (arena -> slot) or `in` (slot -> arena)")]
    slot: Annotated[str, doc("the slot: the value whose bytes it holds, whole")]
    offset: Annotated[int, doc("the range's first byte in the slot")]
    nbytes: Annotated[int, doc("the range's bytes")]


@dataclass(frozen=True)
class Plan:
    """A promise the executor keeps: order, where every transient byte lives, the peak."""

    model: Annotated[str, doc("the step graph's name")]
    order: Annotated[tuple[str, ...], doc("node names in execution order (swap nodes included)")]
    buffers: Annotated[tuple[PlannedBuffer, ...], doc("the arena buffers (PlannedBuffer)")]
    persistent_bytes: Annotated[int, doc("parameters, optimizer state, constants (the state region)")]
    arena_bytes: Annotated[int, doc("the arena of every transient buffer")]
    lower_bound_bytes: Annotated[int, doc("persistent + the most transient bytes live at any EO of this order")]
    planner: Annotated[str, doc("the offset planner whose placement this is")]
    order_policy: Annotated[str, doc("`given`, `nntrainer`, `greedy`, `ilp` or `window`")]
    solve_seconds: Annotated[float, doc("planning time")]
    passes: Annotated[tuple[str, ...], doc(
        "the pass pipeline, replayed on load: `realize`, [`interleave`], [`split-grad`], [`recompute:SCHEDULE`], "
        "`inplace` or `inplace-state`")] = ()
    settings: Annotated[PlanSettings, doc("what was asked of planning (PlanSettings)")] = field(default_factory=PlanSettings)
    solver: Annotated[SolverStats, doc("how the order was found (SolverStats)")] = field(default_factory=SolverStats)
    swap: Annotated[SwapRecord, doc("the swap policy's record (SwapRecord; policy `none`: no swap)")] = field(default_factory=SwapRecord)
    checkpoint: Annotated[CheckpointRecord | None, doc(
        "the recompute schedule a checkpoint policy chose (CheckpointRecord); null: no policy")] = None
    strategy: Annotated[StrategyRecord | None, doc(
        "the budget layer's choice under a budget with no policy named, or the strategy named (`--strategy`) "
        "(StrategyRecord); null otherwise")] = None
    joint: Annotated[JointRecord | None, doc(
        "the joint solver's schedule (strategy `joint`: JointRecord); null otherwise")] = None
    swaps: Annotated[tuple[PlannedSwap, ...], doc(
        "onnxplan.swap's evictions (PlannedSwap); the order holds their nodes")] = ()
    splits: Annotated[tuple[PlannedSplit, ...], doc(
        "the nodes split in chunks (PlannedSplit): must be the split pass's of `passes` (checked on load)")] = ()
    pieces: Annotated[tuple[PlannedPiece, ...], doc(
        "the split pass's transfers (PlannedPiece), each a byte range of a host slot: must be the pass's, no two "
        "writes of a slot overlapping and every read written before it (checked on load)")] = ()
    graph_fingerprint: Annotated[str, doc(
        "sha256 of the loaded step graph before passes (`StepGraph.fingerprint`: nodes, attributes, every "
        "value's class, dtype and shape, inputs, outputs, opsets, optimizer settings, loss, constants): a plan "
        "for another graph (model, batch, `--dim`, optimizer, loss) is refused, exit 2")] = ""
    onnxplan_version: Annotated[str, doc("the onnxplan that made the plan")] = ""
    source: Annotated[dict[str, Any], doc(
        "the model reference `run --plan` resolves without a MODEL: `model` (zoo name or absolute path), "
        "`batch`, `dims`, `optimizer`, `loss`, `train`, `freeze`, `content_hash`")] = field(default_factory=dict)

    @property
    def peak_bytes(self) -> int:
        return self.persistent_bytes + self.arena_bytes

    @property
    def fragmentation(self) -> float:
        transient_bound = self.lower_bound_bytes - self.persistent_bytes
        return self.arena_bytes / transient_bound - 1.0 if transient_bound > 0 else 0.0

    @property
    def options(self) -> dict[str, Any]:
        """The sections as schema 1's free-form `options` (written for readers of v1 files)."""
        return to_v1(self.settings, self.solver, self.swap, self.checkpoint, self.strategy, self.joint)

    def to_json(self) -> dict[str, Any]:
        """The plan file's object: its fields and the derived keys, in FILE_KEYS order."""
        fields = dumped(self)
        derived = {"schema_version": SCHEMA_VERSION, "options": self.options, "peak_bytes": self.peak_bytes,
                   "fragmentation": self.fragmentation}
        return {key: derived[key] if key in derived else fields[key] for key in FILE_KEYS}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"

    @classmethod
    def from_json(cls, d: Any) -> Plan:
        """A plan of schema 2, or of schema 1 migrated (from_v1); any other version, or a
        malformed plan, is a one-line ModelError (exit 2) naming the field path."""
        if not isinstance(d, dict):
            raise ModelError(f"not a plan: the JSON is {type(d).__name__}, not an object")
        version = d.get("schema_version")
        if version not in READABLE_VERSIONS:
            raise ModelError(f"plan schema_version {version!r} is not one this onnxplan reads "
                             f"({', '.join(map(str, READABLE_VERSIONS))}): make the plan again with `onnxplan plan -o`")
        if version == 1:  # the one place schema 1 is read: its `options` become the sections
            d = {**d, **from_v1(dict(d.get("options") or {}))}
        missing = next((k for k in REQUIRED_SECTIONS if k not in d), None)
        if missing is not None:
            raise ModelError(f"malformed plan: {missing}: field required")
        return validated(cls, d, ModelError, "malformed plan: ")

    @classmethod
    def load(cls, path: Path | str) -> Plan:
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


# The plan file's keys in the order they are written. Those that are not fields of Plan are
# derived when writing and ignored when reading (DERIVED_KEYS: their PLAN_SCHEMA.md rows).
FILE_KEYS = ("schema_version", "model", "onnxplan_version", "graph_fingerprint", "source", "order_policy", "planner",
             "passes", "settings", "solver", "swap", "checkpoint", "strategy", "joint", "options",
             "persistent_bytes", "arena_bytes", "peak_bytes", "lower_bound_bytes", "fragmentation", "solve_seconds",
             "order", "buffers", "swaps", "splits", "pieces")
DERIVED_KEYS = {
    "schema_version": ("int", str(SCHEMA_VERSION)),
    "options": ("object", ("schema 1's free-form view of `settings`, `solver`, `swap` (under `swap`), "
                           "`checkpoint`, `strategy` (as `memory_strategy`) and `joint`, written for readers of "
                           "schema-1 files; **never read**")),
    "peak_bytes": ("int", "persistent + arena"),
    "fragmentation": ("float", "arena / transient bound - 1"),
}
# A schema-2 file names these sections even when they hold their defaults.
REQUIRED_SECTIONS = ("settings", "solver", "swap")
