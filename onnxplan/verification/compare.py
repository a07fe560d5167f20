"""Compare a run with ONNX Runtime's.

Two measures: allclose-style per element (`compare_results`, for free-running runs: loss per
step and every parameter), and the per-tensor relative norm error ||got - want|| / ||want||
(`rel_norm_error`), which scales with the tensor and is what the per-step verification
(onnxplan.verification) uses for the loss, gradients, running statistics and intermediates."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["ATOL", "RTOL", "Comparison", "Offender", "compare_results", "rel_norm_error", "update_error"]

RTOL, ATOL = 1e-4, 1e-5  # float32, as the acceptance asks


@dataclass(frozen=True)
class Offender:
    """The worst element of one compared item (a step's loss or a parameter)."""

    item: str
    index: tuple[int, ...]
    got: float
    want: float
    abs_diff: float
    rel_diff: float  # |got - want| / max(|want|, atol / rtol)
    excess: float  # |got - want| / (atol + rtol |want|): > 1 fails

    def __str__(self) -> str:
        where = f"[{','.join(map(str, self.index))}]" if self.index else ""
        return (f"{self.item}{where}: got {self.got:.8g}, ONNX Runtime {self.want:.8g} "
                f"(abs {self.abs_diff:.3g}, rel {self.rel_diff:.3g}, {self.excess:.3g}x tolerance)")


@dataclass
class Comparison:
    ok: bool
    max_rel_diff: float
    max_abs_diff: float
    items: int
    worst: list[Offender] = field(default_factory=list)  # by excess, failing first
    problems: list[str] = field(default_factory=list)  # missing names, shape mismatches


def _worst(item: str, got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> Offender:
    """The element of `item` furthest outside the tolerance; rel_diff is the item's largest."""
    if not got.size:
        return Offender(item, (), 0.0, 0.0, 0.0, 0.0, 0.0)
    g, w = got.astype(np.float64), want.astype(np.float64)
    diff = np.abs(g - w)
    diff = np.where(np.isnan(g) != np.isnan(w), np.inf, np.nan_to_num(diff, nan=0.0))
    excess = diff / (atol + rtol * np.abs(w))
    idx = np.unravel_index(int(np.argmax(excess)), excess.shape)
    rel = diff / np.maximum(np.abs(w), atol / rtol)
    return Offender(item, tuple(int(i) for i in idx), float(g[idx]), float(w[idx]), float(diff[idx]),
                    float(rel.max()), float(excess[idx]))


def compare_results(losses: list[float], params: dict[str, np.ndarray], ref_losses: list[float],
                    ref_params: dict[str, np.ndarray], *, rtol: float = RTOL, atol: float = ATOL,
                    top: int = 5) -> Comparison:
    """Every step's loss and every parameter against ONNX Runtime's (|a-b| <= atol + rtol|b|)."""
    problems: list[str] = []
    offenders: list[Offender] = []
    if len(losses) != len(ref_losses):
        problems.append(f"{len(losses)} losses, ONNX Runtime has {len(ref_losses)}")
    for k, (loss, ref) in enumerate(zip(losses, ref_losses)):
        offenders.append(_worst(f"loss[step {k}]", np.asarray(loss), np.asarray(ref), rtol, atol))
    for name in sorted(set(params) | set(ref_params)):
        if name not in params or name not in ref_params:
            side = "ours" if name not in params else "ONNX Runtime's"
            problems.append(f"parameter {name!r} missing from {side}")
            continue
        a, b = np.asarray(params[name]), np.asarray(ref_params[name])
        if a.shape != b.shape:
            problems.append(f"parameter {name!r}: shape {a.shape} vs ONNX Runtime's {b.shape}")
            continue
        offenders.append(_worst(name, a, b, rtol, atol))
    offenders.sort(key=lambda o: -o.excess)
    ok = not problems and all(o.excess <= 1.0 for o in offenders)
    return Comparison(
        ok=ok,
        max_rel_diff=max((o.rel_diff for o in offenders), default=0.0),
        max_abs_diff=max((o.abs_diff for o in offenders), default=0.0),
        items=len(offenders),
        worst=offenders[:top],
        problems=problems,
    )


_BLOCK = 1 << 20  # elements per block of the per-tensor measures (float64 temporaries stay small)


def _flat_pairs(got, want):
    g, w = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
    for i in range(0, g.size, _BLOCK):
        yield g[i:i + _BLOCK].astype(np.float64), w[i:i + _BLOCK].astype(np.float64)


def rel_norm_error(got, want) -> float:
    """||got - want||_2 / ||want||_2, accumulated in float64 block by block; 0 for two equal
    tensors (all-zero ones included), inf for a NaN where the other has none, a shape mismatch,
    or an all-zero reference against a nonzero result (any nonzero is wrong there)."""
    if np.shape(got) != np.shape(want):
        return float("inf")
    diff2 = ref2 = 0.0
    for g, w in _flat_pairs(got, want):
        gn, wn = np.isnan(g), np.isnan(w)
        if gn.any() or wn.any():
            if (gn != wn).any():
                return float("inf")
            g, w = np.where(gn, 0.0, g), np.where(wn, 0.0, w)
        d = g - w
        diff2 += float(d @ d)
        ref2 += float(w @ w)
    if diff2 == 0.0:
        return 0.0
    return float(np.sqrt(diff2 / ref2)) if ref2 > 0.0 else float("inf")


def update_error(got, want, scale) -> float:
    """An optimizer's output against the reference on identical inputs, per element:
    max |got - want| / (max |scale| + tiny). `scale` is what the update is relative to (the
    parameter, or the moment itself): one float32 rounding of it is ~6e-8. NaN against a
    number, or a shape mismatch, is inf."""
    if np.shape(got) != np.shape(want):
        return float("inf")
    worst = 0.0
    for g, w in _flat_pairs(got, want):
        d = np.abs(g - w)
        nan = np.isnan(d)
        if nan.any():
            if (np.isnan(g) != np.isnan(w)).any():
                return float("inf")
            d = np.where(nan, 0.0, d)
        if d.size:
            worst = max(worst, float(d.max()))
    denom = max((float(np.abs(s).max()) for _, s in _flat_pairs(scale, scale) if s.size), default=0.0)
    return worst / (denom + 1e-30)
