"""Tensor specs: dtype, static shape and exact byte size."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np
from onnx import TensorProto, helper

from onnxplan.errors import ModelError

__all__ = ["TensorSpec", "onnx_to_numpy_dtype", "numpy_to_onnx_dtype"]


def onnx_to_numpy_dtype(elem_type: int) -> np.dtype:
    """The numpy dtype of an ONNX TensorProto element type; ModelError (exit 2) for one that
    has none or is not numeric (UNDEFINED, STRING, an unknown number)."""
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        dtype = None
    if dtype is None or dtype.kind == "O":
        name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
        raise ModelError(f"element type {name} is not a numeric tensor type onnxplan can hold")
    return dtype


def numpy_to_onnx_dtype(dtype: np.dtype | str | type) -> int:
    """The ONNX TensorProto element type of a numpy dtype."""
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


@dataclass(frozen=True)
class TensorSpec:
    """A statically known tensor type: numpy dtype name and a shape of ints."""

    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", np.dtype(self.dtype).name)
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if any(d < 0 for d in self.shape):
            raise ValueError(f"negative dimension in shape {self.shape}")

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def onnx_type(self) -> int:
        return numpy_to_onnx_dtype(self.dtype)

    def with_shape(self, shape) -> TensorSpec:
        return TensorSpec(self.dtype, tuple(shape))

    def with_dtype(self, dtype) -> TensorSpec:
        return TensorSpec(np.dtype(dtype).name, self.shape)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


_ = TensorProto  # re-exported for rules that need element type constants
