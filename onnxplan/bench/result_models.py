"""The bench results file as typed records: the file (ResultsFile), its rows (BenchRow), the
plans drawn in the report (PlanEntry), the peers' figures (PeerFigures) and each run's record
(RunRecord). pydantic validates a loaded file against them (onnxplan.bench.results
.validate_results); readers take rows as BenchRow attributes (BenchRow.of). Each field's
description is its line in onnxplan/bench/SCHEMA.md (generated: onnxplan.schema_doc)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Annotated, Any

from pydantic import Field

from onnxplan.json_models import doc, record_of

__all__ = ["BenchRow", "FailedRow", "MachineInfo", "PeerFigures", "PlanEntry", "ResultsFile", "RunRecord", "row_fields"]

# A figure every row has: a number (not a string, not a bool), null only where named optional.
Figure = Annotated[float, Field(strict=True)]


@dataclass(kw_only=True)
class BenchRow:
    """One (model, batch, strategy): what was planned, measured, and the peers' figures. Every
    row carries every key; a figure that was not measured is null."""

    model: Annotated[str, doc("what was planned (as given on the command line)")]
    batch: Annotated[int | None, doc("the batch")] = None
    optimizer: Annotated[str | None, doc("the optimizer")] = None
    loss: Annotated[str | None, doc("the loss")] = None
    strategy: Annotated[str, doc("the strategy name: `auto`, `ORDER+PLANNER`, optionally `/no-interleave`, "
                                 "`/no-inplace`; `no-interleave`, `no-inplace`")]
    order: Annotated[str | None, doc("the order policy the strategy chose")] = None
    planner: Annotated[str | None, doc("the offset planner the strategy chose")] = None
    interleave: Annotated[bool | None, doc("the interleave pass on or off")] = None
    inplace: Annotated[bool | None, doc("the in-place pass on or off")] = None
    nodes: Annotated[int | None, doc("scheduled nodes")] = None
    buffers: Annotated[int | None, doc("arena buffers")] = None
    planned_peak_bytes: Annotated[Figure, doc("persistent + arena: the plan's promise")]
    lower_bound_bytes: Annotated[Figure, doc("persistent + the most transient bytes live at any EO of the chosen "
                                             "order")]
    persistent_bytes: Annotated[int | None, doc("parameters, optimizer state, constants")] = None
    arena_bytes: Annotated[int | None, doc("the arena")] = None
    fragmentation: Annotated[float | None, doc("arena / transient bound - 1")] = None
    solve_seconds: Annotated[float | None, doc("the whole planning pipeline (passes, orders, every planner "
                                               "tried)")] = None
    budget_bytes: Annotated[int | None, doc("from `--budget`")] = None
    fits_budget: Annotated[bool | None, doc("the planned peak is within `budget_bytes`")] = None
    memory_strategy: Annotated[str | None, doc(
        "with `--budget` only: the strategy the budget layer chose (none, recompute, swap; "
        "onnxplan.budget.decide), as `plan --budget` chooses it")] = None
    measured: Annotated[bool | None, doc("true when onnxplan's executor ran the plan")] = None
    measured_peak_bytes: Annotated[Figure | None, doc(
        "peak RSS increase of the executor's fresh process from just before the arena (probe)")] = None
    median_step_seconds: Annotated[Figure | None, doc("onnxplan's median step latency over the timed steps")] = None
    min_step_seconds: Annotated[float | None, doc("the fastest timed step")] = None
    max_step_seconds: Annotated[float | None, doc("the slowest timed step")] = None
    steps_timed: Annotated[int | None, doc("timed steps")] = None
    warmup_steps: Annotated[int | None, doc(
        "untimed steps run first (the first round's): `--warmup`, on until `--warmup-seconds`")] = None
    first_loss: Annotated[float | None, doc("the run's first loss")] = None
    measure_error: Annotated[str | None, doc("why there is no measurement")] = None
    rounds: Annotated[int | None, doc(
        "fresh processes the figures combine (`bench --rounds`; ours and the peers alternate, round by round): "
        "median_step_seconds is the median over rounds of each round's median step, the measured peak the "
        "largest; null in files from before rounds (one)")] = None
    round_median_step_seconds: Annotated[list[float] | None, doc("each round's median step, in order")] = None
    measured_as: Annotated[str | None, doc(
        "null, or the strategy whose run these figures are: two strategies that chose the very same plan "
        "(passes, order, offsets) are run once")] = None
    ort_peak_bytes: Annotated[int | None, doc("ONNX Runtime training on the same artifacts and data: its "
                                              "peak")] = None
    ort_median_step_seconds: Annotated[float | None, doc("ONNX Runtime: median step")] = None
    ort_min_step_seconds: Annotated[float | None, doc("ONNX Runtime: fastest step")] = None
    ort_max_step_seconds: Annotated[float | None, doc("ONNX Runtime: slowest step")] = None
    ort_first_loss: Annotated[float | None, doc("ONNX Runtime: first loss")] = None
    ort_error: Annotated[str | None, doc("ONNX Runtime: why there is no figure")] = None
    torch_peak_bytes: Annotated[int | None, doc(
        "PyTorch eager (`onnxplan.torch_peer`: the same ONNX forward graph, same weights, same loss, "
        "equivalent optimizer): its peak")] = None
    torch_median_step_seconds: Annotated[float | None, doc("PyTorch: median step")] = None
    torch_min_step_seconds: Annotated[float | None, doc("PyTorch: fastest step")] = None
    torch_max_step_seconds: Annotated[float | None, doc("PyTorch: slowest step")] = None
    torch_first_loss: Annotated[float | None, doc("PyTorch: first loss")] = None
    torch_error: Annotated[str | None, doc("PyTorch: why there is no figure")] = None
    host: Annotated[str | None, doc("the machine (hostname) that planned and measured the row: this one, or a "
                                    "Dask worker's")] = None
    threads: Annotated[int | None, doc(
        "the thread count every measurement of the row ran at (`bench --threads`; default: every core the "
        "process may use). A resumed run re-measures rows and peers measured at another count")] = None
    pool_threads: Annotated[dict[str, Any] | None, doc(
        "what each thread pool of our run's process got (onnxplan.threads `ThreadSettings`: `threads`, "
        "`compute`, `blas`, `openmp`, `torch_intra`, `torch_interop`, `ort_intra`, `ort_inter`, `swap_io`, "
        "`omp_wait_policy`, `blas_library`, `note`, `gemm_pool`: the GEMM pool's C workers); null when not measured")] = None
    ort_threads: Annotated[dict[str, Any] | None, doc("the same for ONNX Runtime's process")] = None
    torch_threads: Annotated[dict[str, Any] | None, doc("the same for PyTorch's process")] = None

    @classmethod
    def of(cls, row: dict[str, Any]) -> BenchRow:
        """A row of a results document (validated on load, or made by this run) as a record."""
        return record_of(cls, row)


def row_fields() -> tuple[str, ...]:
    """The keys of a row, in file order."""
    return tuple(f.name for f in fields(BenchRow))


@dataclass(frozen=True)
class PlanEntry:
    """A row's chosen plan, as the report draws it."""

    model: Annotated[str, doc("the model")]
    strategy: Annotated[str, doc("the strategy")]
    batch: Annotated[int | None, doc("the batch")]
    order_policy: Annotated[str, doc("the order policy")]
    planner: Annotated[str, doc("the offset planner")]
    persistent_bytes: Annotated[int, doc("persistent bytes")]
    arena_bytes: Annotated[int, doc("the arena")]
    peak_bytes: Annotated[int, doc("persistent + arena")]
    lower_bound_bytes: Annotated[int, doc("the lower bound")]
    eo_count: Annotated[int, doc("EOs of the order")] = 0
    buffers: Annotated[tuple[tuple[Any, ...], ...], doc(
        "lists in `buffer_columns` order; offsets are arena offsets")] = ()


@dataclass(frozen=True)
class PeerFigures:
    """A peer's (ONNX Runtime's or PyTorch's) figures for one model and batch."""

    peak_bytes: Annotated[int | None, doc("peak RSS increase of its fresh process")] = None
    median_step_seconds: Annotated[float | None, doc("median step")] = None
    min_step_seconds: Annotated[float | None, doc("fastest step")] = None
    max_step_seconds: Annotated[float | None, doc("slowest step")] = None
    steps_timed: Annotated[int | None, doc("timed steps")] = None
    warmup_steps: Annotated[int | None, doc("untimed steps run first (the first round's), as a row's")] = None
    first_loss: Annotated[float | None, doc("first loss")] = None
    error: Annotated[str | None, doc("why there is no figure")] = None
    probe_method: Annotated[str | None, doc("how the peak was measured")] = None
    threads: Annotated[dict[str, Any] | None, doc("what its thread pools got")] = None
    rounds: Annotated[int | None, doc("fresh processes combined (as a row's `rounds`)")] = None
    round_median_step_seconds: Annotated[list[float] | None, doc("each round's median step")] = None


@dataclass(frozen=True)
class RunRecord:
    """One invocation that wrote the file (other work on the machine skews the timings)."""

    started: Annotated[str, doc("ISO 8601 UTC start")]
    wall_seconds: Annotated[float, doc("its wall time")] = 0.0
    rows_before: Annotated[int, doc("rows in the file before it")] = 0
    rows_after: Annotated[int, doc("rows after it")] = 0
    loadavg_start: Annotated[tuple[float, ...] | None, doc("1, 5, 15 min load at its start")] = None
    loadavg_end: Annotated[tuple[float, ...] | None, doc("and at its end")] = None


@dataclass(frozen=True)
class FailedRow:
    """A row (or peer) a Dask sweep could not finish; not in `rows`, tried again on resume."""

    model: Annotated[str, doc("the model")]
    batch: Annotated[int | None, doc("the batch")] = None
    strategy: Annotated[str | None, doc("the strategy (or null for a peer)")] = None
    peer: Annotated[str | None, doc("the peer (a peer's failure)")] = None
    host: Annotated[str | None, doc("the worker's host, or null")] = None
    error: Annotated[str, doc("the cause, one line: an exception, or the worker that died")] = ""


@dataclass(frozen=True)
class MachineInfo:
    """Where a run came from (onnxplan.bench.results.machine_info)."""

    loadavg: Annotated[tuple[float, ...] | None, doc("1, 5, 15 min load at the start")] = None
    hostname: Annotated[str | None, doc("the host")] = None
    system: Annotated[str | None, doc("OS and release")] = None
    machine: Annotated[str | None, doc("architecture")] = None
    cpu: Annotated[str | None, doc("CPU model")] = None
    cpus: Annotated[int | None, doc("cores")] = None
    memory_bytes: Annotated[int | None, doc("physical memory")] = None
    python: Annotated[str | None, doc("Python version")] = None
    onnxplan: Annotated[str | None, doc("onnxplan version")] = None
    onnxruntime: Annotated[str | None, doc("onnxruntime-training version")] = None
    torch: Annotated[str | None, doc("torch version")] = None
    numpy: Annotated[str | None, doc("numpy version")] = None


@dataclass(frozen=True, kw_only=True)
class ResultsFile:
    """`onnxplan bench`'s results file (keys in the order they are written)."""

    schema_version: Annotated[int, doc("1")]
    kind: Annotated[str, doc("`\"onnxplan-bench\"`")] = "onnxplan-bench"
    created: Annotated[str, doc("ISO 8601 UTC time the file was first written")] = ""
    machine: Annotated[MachineInfo, doc("where the run came from (MachineInfo)")] = field(default_factory=MachineInfo)
    config: Annotated[dict[str, Any], doc(
        "`models`, `strategies` (names, in sweep order), `batch` (null: each model's own), `peers`, `repeat` "
        "(timed steps), `warmup` (untimed steps), `warmup_seconds` (the warm-up's least length), `rounds` (fresh processes per figure), `measure`, `time_limit` (s per ILP), `budgets` (model or `\"*\"` "
        "-> bytes), `threads`; `train`, `freeze`, `model_options` when given")] = field(default_factory=dict)
    buffer_columns: Annotated[tuple[str, ...], doc(
        "`[\"name\", \"bytes\", \"class\", \"first_eo\", \"last_eo\", \"offset\"]`: the columns of a plan's "
        "`buffers`")] = ()
    rows: Annotated[list[BenchRow], doc("one object per (model, batch, strategy) (BenchRow)")]
    plans: Annotated[dict[str, PlanEntry], doc("`\"model|batch|strategy\"` -> the row's chosen plan "
                                               "(PlanEntry)")] = field(default_factory=dict)
    peers: Annotated[dict[str, dict[str, PeerFigures]], doc(
        "`\"model|batch\"` -> `{\"ort\": {...}, \"torch\": {...}}` (PeerFigures)")] = field(default_factory=dict)
    runs: Annotated[list[RunRecord], doc("one record per invocation that wrote this file "
                                         "(RunRecord)")] = field(default_factory=list)
    failed: Annotated[list[FailedRow] | None, doc(
        "rows that a Dask sweep (`bench --workers/--scheduler`) could not finish (FailedRow); absent when "
        "none")] = None
