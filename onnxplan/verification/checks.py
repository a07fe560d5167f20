"""What `run --verify` found: one Check per compared tensor, a StepReport per step (the worst
check of each kind, the failures, the first difference in execution order), the Verification."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["Check", "NodeChecks", "StepReport", "Verification", "check_dict"]


@dataclass
class Check:
    """One compared tensor."""

    kind: str  # loss, gradient, update, running, intermediate, node (verification/node_check.py)
    name: str
    error: float
    tolerance: float
    node: str = ""  # the node that computed our value (ours: EO order), where known

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance

    @property
    def ratio(self) -> float:
        """error / tolerance (an exact comparison, tolerance 0: 0 when equal, else inf)."""
        if self.tolerance > 0:
            return self.error / self.tolerance
        return 0.0 if self.error == 0 else float("inf")

    def __str__(self) -> str:
        at = f" (node {self.node!r})" if self.node else ""
        return f"{self.kind} {self.name}{at}: error {self.error:.3g}, {self.ratio:.3g}x tolerance"


@dataclass
class NodeChecks:
    """What the per-node check found in one step: nodes checked, skipped (reason -> count), the
    failures in execution order and the worst check."""

    checked: int = 0
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> nodes
    failures: list[Check] = field(default_factory=list)
    worst: Check | None = None

    def add(self, check: Check) -> None:
        if self.worst is None or check.ratio > self.worst.ratio:
            self.worst = check
        if not check.ok:
            self.failures.append(check)

    def as_dict(self) -> dict:
        return {"checked": self.checked, "skipped": dict(self.skipped),
                "worst": None if self.worst is None else check_dict(self.worst),
                "failures": [check_dict(c) for c in self.failures]}


@dataclass
class StepReport:
    step: int
    loss: float
    ort_loss: float
    checks: dict[str, Check]  # per kind: the worst
    failures: list[Check] = field(default_factory=list)
    first_difference: Check | None = None  # on a failure: the first value in EO beyond tolerance
    explanation: str = ""
    # parameters whose gradient is exactly 0 on both sides: their checks pass and say nothing (a
    # fresh EfficientNet-B0 at 224x224 underflows to 0 before its classifier: every weight's)
    zero_gradients: tuple[str, ...] = ()
    nodes: NodeChecks | None = None  # the per-node check (verification/node_check.py)

    @property
    def ok(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict:
        """JSON-able; an error that is not finite (NaN against a number, a missing value) is None."""
        return {"step": self.step, "ok": self.ok, "loss": self.loss, "ort_loss": self.ort_loss,
                "loss_error": _finite(self.checks["loss"].error),
                "worst": {k: check_dict(c) for k, c in self.checks.items()},
                "failures": [str(c) for c in self.failures],
                "first_difference": None if self.first_difference is None else check_dict(self.first_difference),
                "explanation": self.explanation, "zero_gradients": list(self.zero_gradients),
                "nodes": None if self.nodes is None else self.nodes.as_dict()}


def _finite(x: float) -> float | None:
    return x if np.isfinite(x) else None


def check_dict(c: Check) -> dict:
    """JSON-able (a non-finite error or ratio is None)."""
    return {**asdict(c), "error": _finite(c.error), "ratio": _finite(c.ratio), "ok": c.ok}


@dataclass
class Verification:
    ok: bool
    steps: list[StepReport]
    tolerances: dict[str, float]
    parameters: int = 0  # how many the step trains
    ort_peak_rss_bytes: int = 0  # the largest peak RSS of ONNX Runtime's processes (verification/ort_process.py; 0: it ran in this process, a small model)

    def as_dict(self) -> dict:
        return {"ok": self.ok, "tolerances": dict(self.tolerances), "parameters": self.parameters,
                "ort_peak_rss_bytes": self.ort_peak_rss_bytes, "steps": [s.as_dict() for s in self.steps]}

    def summary(self) -> str:
        bad = next((s for s in self.steps if not s.ok), None)
        if bad is None:
            return f"{len(self.steps)} step(s) match ONNX Runtime"
        where = bad.first_difference or bad.failures[0]
        return f"step {bad.step}: {where}" + (f"; {bad.explanation}" if bad.explanation else "")
