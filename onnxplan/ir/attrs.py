"""Node attributes and axes, one reading for the shape rules and the kernels alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["attr", "attr_str", "norm_axis"]


def attr(attrs: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """Attribute `name`, or `default` when it is absent or None."""
    value = attrs.get(name)
    return default if value is None else value


def attr_str(value: Any, default: str = "") -> str:
    """A string attribute value (ONNX stores them as bytes), or `default` when absent."""
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def norm_axis(axis: int, rank: int) -> int:
    """Axis in [-r, r-1] made non-negative (ONNX's range); a scalar (rank 0) is treated as rank 1,
    so axis 0 and -1 both name its only position. ValueError when out of range."""
    axis, r = int(axis), max(int(rank), 1)
    if not -r <= axis < r:
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis + r if axis < 0 else axis
