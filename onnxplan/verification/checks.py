"""What `run --verify` found: one Check per compared tensor, a StepReport per step (the worst
check of each kind, the failures, the first difference in execution order), the Verification."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["Check", "StepReport", "Verification"]


@dataclass
class Check:
    """One compared tensor."""

    kind: str  # loss, gradient, update, running, intermediate
    name: str
    error: float
    tolerance: float
    node: str = ""  # the node that computed our value (ours: EO order), where known

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance

    def __str__(self) -> str:
        at = f" (node {self.node!r})" if self.node else ""
        return f"{self.kind} {self.name}{at}: error {self.error:.3g}, {self.error / self.tolerance:.3g}x tolerance"


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

    @property
    def ok(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict:
        """JSON-able; an error that is not finite (NaN against a number, a missing value) is None."""
        return {"step": self.step, "ok": self.ok, "loss": self.loss, "ort_loss": self.ort_loss,
                "loss_error": _finite(self.checks["loss"].error),
                "worst": {k: _check_dict(c) for k, c in self.checks.items()},
                "failures": [str(c) for c in self.failures],
                "first_difference": None if self.first_difference is None else _check_dict(self.first_difference),
                "explanation": self.explanation, "zero_gradients": list(self.zero_gradients)}


def _finite(x: float) -> float | None:
    return x if np.isfinite(x) else None


def _check_dict(c: Check) -> dict:
    return {**asdict(c), "error": _finite(c.error), "ok": c.ok}


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
