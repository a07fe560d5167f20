"""Structural check of an onnxruntime-training checkpoint (a FlatBuffer, identifier "ODTC")
without onnxruntime: every offset inside the file, every parameter tensor's bytes matching
its shape and type. Loading the checkpoint with ONNX Runtime takes seconds (it imports
torch); this reads a few bytes per tensor, so `inspect` and `plan` check it when a folder is
loaded and a corrupt or truncated checkpoint is refused at once."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import helper

from onnxplan.errors import ModelError

__all__ = ["CheckpointIndex", "checkpoint_parameters", "read_checkpoint", "require_values"]

_IDENTIFIER = b"ODTC"


class _Buf:
    """Bounds-checked FlatBuffer reads (ValueError on anything outside the file)."""

    def __init__(self, data) -> None:
        self.data = data
        self.n = len(data)

    def read(self, fmt: str, pos: int):
        size = struct.calcsize(fmt)
        if pos < 0 or pos + size > self.n:
            raise ValueError(f"offset {pos} outside the file ({self.n} B)")
        return struct.unpack_from(fmt, self.data, pos)[0]

    def field(self, table: int, index: int) -> int:
        """Absolute position of field `index` of the table at `table`, or 0 when absent."""
        vtable = table - self.read("<i", table)
        vsize = self.read("<H", vtable)
        slot = 4 + 2 * index
        if slot + 2 > vsize:
            return 0
        rel = self.read("<H", vtable + slot)
        return table + rel if rel else 0

    def deref(self, pos: int) -> int:
        return pos + self.read("<I", pos)

    def vector(self, pos: int, itemsize: int) -> tuple[int, int]:
        """(start, length) of the vector that the offset at `pos` points to."""
        start = self.deref(pos)
        length = self.read("<I", start)
        if start + 4 + length * itemsize > self.n:
            raise ValueError(f"a vector of {length} items at {start} runs past the end of the file")
        return start + 4, length

    def tables(self, table: int, index: int) -> list[int]:
        pos = self.field(table, index)
        if not pos:
            return []
        start, length = self.vector(pos, 4)
        return [self.deref(start + 4 * k) for k in range(length)]


@dataclass(frozen=True)
class CheckpointIndex:
    """What a checkpoint holds: every parameter's shape, or, for a nominal checkpoint (names
    only: ONNX Runtime's nominal state, written for a model built with its weights left on disk,
    loading.by_reference), every parameter's name with no shape and no value."""

    shapes: dict[str, tuple[int, ...] | None]
    nominal: bool


def _tensor(buf: _Buf, t: int, external: bool) -> tuple[str, tuple[int, ...], int]:
    pos = buf.field(t, 0)
    if not pos:
        raise ValueError("a tensor without a name")
    start, length = buf.vector(pos, 1)
    name = bytes(buf.data[start:start + length]).decode("utf-8")
    dims: tuple[int, ...] = ()
    pos = buf.field(t, 2)
    if pos:
        start, length = buf.vector(pos, 8)
        dims = tuple(buf.read("<q", start + 8 * k) for k in range(length))
    if any(d < 0 for d in dims):
        raise ValueError(f"tensor {name!r} has a negative dimension {dims}")
    pos = buf.field(t, 3)
    dtype = buf.read("<i", pos) if pos else 0
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(dtype)).itemsize
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"tensor {name!r} has an unknown data type {dtype}") from None
    pos = buf.field(t, 4)
    raw = buf.vector(pos, 1)[1] if pos else 0
    want = int(np.prod(dims, dtype=object)) * itemsize
    if not external and raw != want:  # a nominal state's tensors (no data) are read as external
        raise ValueError(f"tensor {name!r} {list(dims)} holds {raw} B of data, its shape needs {want} B")
    return name, dims, dtype


def read_checkpoint(path: Path | str) -> CheckpointIndex:
    """The parameters of the checkpoint at `path`; ModelError when the file is not a readable
    checkpoint (wrong identifier, an offset outside the file, a tensor whose bytes do not match
    its shape)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 8:
                raise ValueError(f"{size} B is too short")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _index(_Buf(data))
    except OSError as exc:
        raise ModelError(f"{path}: unreadable checkpoint ({exc.strerror or exc})") from None
    except (ValueError, UnicodeDecodeError, struct.error) as exc:
        raise ModelError(f"{path}: corrupt checkpoint ({exc})") from None


def _flag(buf: _Buf, table: int, index: int) -> bool:
    pos = buf.field(table, index)
    return bool(pos and buf.read("<B", pos))


def _index(buf: _Buf) -> CheckpointIndex:
    if bytes(buf.data[4:8]) != _IDENTIFIER:
        raise ValueError(f"not an ONNX Runtime checkpoint (identifier {bytes(buf.data[4:8])!r})")
    root = buf.deref(0)
    module = buf.field(root, 1)
    if not module:
        raise ValueError("no module state")
    module = buf.deref(module)
    nominal = _flag(buf, module, 2)  # ModuleState.is_nominal_state
    external = _flag(buf, module, 3)  # ModuleState.has_external_data
    shapes: dict[str, tuple[int, ...] | None] = {}
    for index in (0, 1):  # requires_grad_params, frozen_params
        for t in buf.tables(module, index):
            name, dims, _ = _tensor(buf, t, external or nominal)
            shapes[name] = None if nominal else dims
    return CheckpointIndex(shapes, nominal)


def checkpoint_parameters(path: Path | str) -> dict[str, tuple[int, ...] | None]:
    """Every parameter of the checkpoint at `path` with its shape (None: a nominal checkpoint
    records none); ModelError as read_checkpoint."""
    return read_checkpoint(path).shapes


def require_values(path: Path | str) -> None:
    """Refuse (ModelError, exit 2) a nominal checkpoint where the parameters' values are needed
    (a run, a verification): it holds their names only."""
    if read_checkpoint(path).nominal:
        raise ModelError(f"{path}: the checkpoint holds the parameters' names only (the artifacts of a model "
                         "over 2 GiB are built with its weights left on disk): it plans, but a run needs "
                         "the weights' values")
