"""ONNX's Cast rules as array arithmetic (float8 saturation, E8M0 rounding): one definition read
by the Cast kernel (onnxplan.kernels.tensor_ops) and by shape folding (ir/shape_rules/folding.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["E8M0", "ROUND_MODES", "SATURATING_FLOAT8", "cast_attrs", "cast_into", "one_block"]

Blockwise = Callable[..., None]


def one_block(xp, fn: Callable[..., None], out, *ins) -> None:
    """fn(out, *ins) over the whole arrays: one block (inputs broadcast to out's shape)."""
    fn(out, *(x if not hasattr(x, "shape") or x.shape == out.shape else xp.broadcast_to(x, out.shape) for x in ins))


# float8 types whose out-of-range values Cast's `saturate` clamps to the largest finite value
SATURATING_FLOAT8 = frozenset({"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"})
E8M0 = "float8_e8m0fnu"
ROUND_MODES = ("up", "down", "nearest")


def cast_into(xp, x, out, saturate: bool = True, round_mode: str = "up",
              blockwise: Blockwise = one_block) -> None:
    """out = x cast to out's dtype by ONNX's Cast rules (block by block: temporaries stay block-sized).

    Numbers: numpy's casts (float to integer truncates toward zero; anything to bool is `!= 0`).
    To E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ with saturate (ONNX's default): clamped to the type's
    largest finite value first (+-inf too), then rounded to nearest even; without it ml_dtypes'
    cast: out of range is NaN, or +-inf for E5M2 (the spec's tables). To E8M0: the exponent of
    the float32 value, rounded by round_mode ("up", "down", "nearest"), as
    onnx.numpy_helper.to_float8e8m0 computes it (saturate keeps the largest exponent from
    rounding up into NaN; inf and NaN give NaN; the sign is ignored).

    `blockwise(xp, fn, out, *ins)` runs fn over blocks of out (the kernels pass theirs, which
    keeps temporaries block-sized; shape folding runs its small values as one block).
    """
    name = out.dtype.name
    if name == E8M0:
        if round_mode not in ROUND_MODES:
            raise ValueError(f"Cast round_mode {round_mode!r} is not one of {ROUND_MODES}")
        blockwise(xp, lambda o, b: _e8m0_block(xp, o, b, saturate, round_mode), out.view(np.uint8), x)
        return
    if name in SATURATING_FLOAT8 and saturate and x.dtype != np.bool_:
        import ml_dtypes

        top = float(ml_dtypes.finfo(out.dtype).max)
        native = x.dtype.isbuiltin == 1  # numpy's own types hold the bound exactly; ml_dtypes'
        # float8 and bfloat16 may not (240 has no E5M2 value): those are clamped in float32

        def clamp(o, b):
            xp.copyto(o, xp.clip(b if native else b.astype(np.float32), -top, top), casting="unsafe")

        blockwise(xp, clamp, out, x)
        return
    xp.copyto(out, x, casting="unsafe")


def _e8m0_block(xp, out_u8, x, saturate: bool, round_mode: str) -> None:
    """One block of the float32 -> E8M0 cast: out_u8 gets the (rounded) biased exponent."""
    bits = xp.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(np.uint16)
    special = exponent == 0xFF  # inf and NaN
    if round_mode == "up":
        step = (bits & 0x7FFFFF) > 0
    elif round_mode == "nearest":  # ties (and above) round up: guard bit and (round or sticky or exponent > 0)
        step = ((bits & 0x400000) > 0) & (((bits & 0x3FFFFF) > 0) | (exponent > 0))
    else:
        step = None
    if step is not None:
        step &= ~special
        if saturate:
            step &= exponent != 0xFE
        exponent += step
    exponent[special] = 0xFF
    xp.copyto(out_u8, exponent, casting="unsafe")


def cast_attrs(attrs) -> tuple[bool, str]:
    """(saturate, round_mode) of a Cast/CastLike node (ONNX's defaults: 1 and "up")."""
    mode = attrs.get("round_mode", "up")
    return bool(attrs.get("saturate", 1)), mode.decode() if isinstance(mode, bytes) else str(mode)
