"""The memory-regression gate: compare bench results with a baseline, row by row, on one metric."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from onnxplan.bench.result_models import BenchRow
from onnxplan.bench.results import row_key
from onnxplan.errors import ModelError, UsageError

__all__ = [
    "DEFAULT_TOLERANCE",
    "METRICS",
    "Change",
    "CheckResult",
    "baseline_document",
    "compare",
    "parse_tolerance",
]

METRICS = {"planned_peak": "planned_peak_bytes", "measured_peak": "measured_peak_bytes",
           "latency": "median_step_seconds"}
# The planned peak is deterministic; measured figures carry run-to-run noise.
DEFAULT_TOLERANCE = {"planned_peak": 0.01, "measured_peak": 0.10, "latency": 0.25}
_TOLERANCE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(%?)\s*$")


@dataclass(frozen=True)
class Change:
    """One row's metric before (baseline) and after (results); change = after / before - 1."""

    model: str
    batch: int | None
    strategy: str
    before: float
    after: float

    @property
    def change(self) -> float:
        if self.before == 0:
            return 0.0 if self.after == 0 else float("inf")
        return self.after / self.before - 1.0


@dataclass
class CheckResult:
    """What the gate found: rows worse than the tolerance allows, better ones, and the rest."""

    metric: str
    tolerance: float
    regressions: list[Change] = field(default_factory=list)
    improvements: list[Change] = field(default_factory=list)
    unchanged: list[Change] = field(default_factory=list)
    missing: list[tuple] = field(default_factory=list)  # in the baseline, not in the results
    new: list[tuple] = field(default_factory=list)  # in the results, not in the baseline
    not_comparable: list[tuple] = field(default_factory=list)  # the metric is null on a side

    @property
    def compared(self) -> int:
        return len(self.regressions) + len(self.improvements) + len(self.unchanged)


def parse_tolerance(text: str | float | None, metric: str) -> float:
    """'1%' -> 0.01, '0.01' -> 0.01, None -> the metric's default. Malformed -> UsageError."""
    if text is None:
        return DEFAULT_TOLERANCE[metric]
    m = _TOLERANCE.match(str(text))
    if not m:
        raise UsageError(f"invalid --tolerance '{text}': expected a percentage like 1% or a fraction like 0.01")
    value = float(m.group(1))
    return value / 100.0 if m.group(2) else value


def _metric_key(metric: str) -> str:
    try:
        return METRICS[metric]
    except KeyError:
        raise UsageError(f"unknown metric '{metric}'; known: {', '.join(METRICS)}") from None


def compare(results: dict[str, Any], baseline: dict[str, Any], metric: str = "planned_peak",
            tolerance: float | None = None) -> CheckResult:
    """Compare every row of `results` with the row of the same (model, batch, strategy) in
    `baseline`. A regression is after > before x (1 + tolerance). ModelError (exit 2) when
    the two share no row with the metric on both sides: nothing could be checked."""
    key = _metric_key(metric)
    tol = DEFAULT_TOLERANCE[metric] if tolerance is None else float(tolerance)
    if tol < 0:
        raise UsageError(f"invalid tolerance {tol}: must be >= 0")
    out = CheckResult(metric, tol)
    before = {row_key(r): r for r in map(BenchRow.of, baseline["rows"])}
    after = {row_key(r): r for r in map(BenchRow.of, results["rows"])}
    out.missing = sorted((k for k in before if k not in after), key=str)
    out.new = sorted((k for k in after if k not in before), key=str)
    for k in sorted((k for k in after if k in before), key=str):
        b, a = getattr(before[k], key), getattr(after[k], key)
        if b is None or a is None:
            out.not_comparable.append(k)
            continue
        change = Change(k[0], k[1], k[2], b, a)
        if a > b * (1.0 + tol):
            out.regressions.append(change)
        elif a < b:
            out.improvements.append(change)
        else:
            out.unchanged.append(change)
    if out.compared == 0:
        if not (set(before) & set(after)):
            raise ModelError("the results and the baseline share no row (model, batch, strategy): "
                             "nothing to compare")
        raise ModelError(f"no row has {key} on both sides: nothing to compare "
                         f"(was it measured? try --metric planned_peak)")
    return out


def baseline_document(results: dict[str, Any]) -> dict[str, Any]:
    """What --update-baseline stores: the results without the plans (rows, config, machine)."""
    doc = {k: v for k, v in results.items() if k != "plans"}
    doc["plans"] = {}
    return doc
