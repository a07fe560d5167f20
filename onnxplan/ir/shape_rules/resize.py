"""Resize / Upsample: what a node's attributes and inputs mean (output dims, per-axis source
coordinates), shared by the shape rule and the kernel. Modes nearest and linear; cubic,
antialias, tf_crop_and_resize and keep_aspect_ratio_policy other than stretch are refused."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ResizeParams", "resize_params", "source_coordinate", "source_index"]

TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
              "tf_half_pixel_for_nn")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")


def _s(attrs, name: str, default: str) -> str:
    value = attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class ResizeParams:
    mode: str  # nearest | linear
    transform: str  # a coordinate_transformation_mode
    nearest: str  # a nearest_mode ("simple": Upsample's and Resize-10's)
    scales: tuple[float, ...]  # per axis (1 where not resized)
    out_dims: tuple[int, ...]


def resize_params(op_type: str, attrs: dict[str, Any], in_dims: Sequence[int],
                  value: Callable[[int], np.ndarray | None]) -> ResizeParams:
    """The node's resize; value(i) gives constant input i (None when absent or not constant).
    Raises ValueError (one line) for what is not supported or not static."""
    rank = len(in_dims)
    mode = _s(attrs, "mode", "nearest")
    mode = "linear" if mode == "bilinear" else mode
    if mode not in ("nearest", "linear"):
        raise ValueError(f"{op_type} mode {mode!r} is not supported (nearest and linear are)")
    legacy = op_type == "Upsample" or value(2) is None and value(3) is None and value(1) is not None \
        and np.asarray(value(1)).dtype.kind == "f" and np.asarray(value(1)).size == rank
    if op_type == "Upsample" and attrs.get("scales") is not None:  # opset 7: an attribute
        scales = [float(v) for v in attrs["scales"]]
    elif legacy:  # Upsample-9 and Resize-10: (X, scales)
        scales = [float(v) for v in np.asarray(value(1)).reshape(-1)]
    else:
        scales = None
    if legacy:
        if scales is None or len(scales) != rank:
            raise ValueError(f"{op_type} needs constant scales, one per axis")
        return ResizeParams(mode, "asymmetric", "simple", tuple(scales),
                            tuple(int(np.floor(d * s)) for d, s in zip(in_dims, scales)))
    transform = _s(attrs, "coordinate_transformation_mode", "half_pixel")
    nearest = _s(attrs, "nearest_mode", "round_prefer_floor")
    if transform not in TRANSFORMS:
        raise ValueError(f"Resize coordinate_transformation_mode {transform!r} is not supported")
    if nearest not in NEAREST_MODES[:4]:
        raise ValueError(f"Resize nearest_mode {nearest!r} is not supported")
    if int(attrs.get("antialias", 0)):
        raise ValueError("Resize antialias=1 is not supported")
    if _s(attrs, "keep_aspect_ratio_policy", "stretch") != "stretch":
        raise ValueError("Resize keep_aspect_ratio_policy other than 'stretch' is not supported")
    axes = [int(a) + rank if int(a) < 0 else int(a) for a in attrs.get("axes") or range(rank)]
    sizes, given = value(3), value(2)
    scale = [1.0] * rank
    out = list(in_dims)
    if sizes is not None and np.asarray(sizes).size:
        for a, n in zip(axes, np.asarray(sizes).reshape(-1)):
            out[a], scale[a] = int(n), float(np.float32(n) / np.float32(in_dims[a]))
    elif given is not None and np.asarray(given).size:
        for a, f in zip(axes, np.asarray(given).reshape(-1)):
            scale[a] = float(np.float32(f))
            out[a] = int(np.floor(in_dims[a] * np.float32(f)))
    else:
        raise ValueError("Resize needs constant 'scales' or 'sizes'")
    return ResizeParams(mode, transform, nearest, tuple(scale), tuple(out))


def source_coordinate(transform: str, n_in: int, n_out: int, scale: float) -> np.ndarray:
    """Per output position along one axis, the input coordinate it maps to (float32, as ORT)."""
    f = np.float32
    x = np.arange(n_out, dtype=f)
    s = f(scale)
    if transform == "asymmetric":
        return x / s
    if transform == "align_corners":
        return np.zeros(n_out, f) if n_out == 1 else x * f(n_in - 1) / f(n_out - 1)
    if transform == "tf_half_pixel_for_nn":
        return (x + f(0.5)) / s
    if transform == "pytorch_half_pixel":
        return (x + f(0.5)) / s - f(0.5) if n_out > 1 else np.zeros(n_out, f)
    if transform == "half_pixel_symmetric":
        adjustment = f(n_out) / (s * f(n_in))
        center = f(n_in) / f(2)
        offset = center * (f(1) - adjustment)
        return offset + (x + f(0.5)) / s - f(0.5)
    return (x + f(0.5)) / s - f(0.5)  # half_pixel


def source_index(nearest: str, coord: np.ndarray, n_in: int, scale: float) -> np.ndarray:
    """The input index a nearest-mode output position takes, clamped to the input."""
    if nearest == "simple":  # Upsample / Resize-10: truncate, or ceil when downsampling
        idx = np.ceil(coord) if scale < 1 else np.trunc(coord)
    elif nearest == "floor":
        idx = np.floor(coord)
    elif nearest == "ceil":
        idx = np.ceil(coord)
    else:
        frac = coord - np.floor(coord)
        tie_up = nearest == "round_prefer_ceil"
        idx = np.where(frac == 0.5, np.ceil(coord) if tie_up else np.floor(coord), np.round(coord))
    return np.clip(idx, 0, n_in - 1).astype(np.int64)
