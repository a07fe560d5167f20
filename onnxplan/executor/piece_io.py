"""The split pass's transfers (onnxplan.passes.split): PieceOut / PieceIn nodes move a value's
bytes to and from a byte range of its host slot, in a swap store of their own (one unlinked file,
O_DIRECT where the file system allows it: onnxplan.swap.store).

Each transfer runs where its node stands in the order, synchronously (no I/O thread: a piece is
read right before its chunk needs it and written right after its chunk made it; the pricing
counts it as a transfer on the node's own time). A store of its own: swap's I/O worker moves
bytes through its store's bounce block on another thread.

A range off the store's page (a piece of at least split_ops.OFF_PAGE_MIN bytes whose rows are no
whole number of pages: GPT-2's 50257-wide logits) moves its page-aligned middle directly and each
partial end page through a page buffer: read, patched, written back (read-modify-write; the
transfers run one at a time, so a neighbouring piece's bytes on a shared page are kept)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from onnxplan.ir.graph import Node, StepGraph
from onnxplan.kernels.registry import KernelContext, KernelFn, kernel
from onnxplan.passes.split import homed_slots, slot_bytes
from onnxplan.swap.store import PAGE, SwapStore

__all__ = ["PieceRuntime", "piece_in", "piece_out"]


@kernel("PieceOut", "onnxplan")
def piece_out(ctx: KernelContext, inputs: list, outputs: list) -> None:
    """Save a value (or a piece) to a range of its host slot (bound by PieceRuntime)."""
    raise RuntimeError(f"{ctx.node.name}: piece nodes run through the executor's piece runtime")


@kernel("PieceIn", "onnxplan")
def piece_in(ctx: KernelContext, inputs: list, outputs: list) -> None:
    """Read a range of a host slot into a value (bound by PieceRuntime)."""
    raise RuntimeError(f"{ctx.node.name}: piece nodes run through the executor's piece runtime")


def _raw(arr: Any) -> np.ndarray:
    """The bytes of a C-contiguous host array, as a 1-D uint8 view (no copy)."""
    if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous:
        raise RuntimeError("piece transfers need C-contiguous host (numpy) arrays")
    return arr.reshape(-1).view(np.uint8)


class PieceRuntime:
    """The host slots of a split graph's pieces, and the kernels of its piece nodes."""

    def __init__(self, graph: StepGraph, folder: str | Path | None = None) -> None:
        self.store = SwapStore(slot_bytes(graph), folder)
        # homed state (a split optimizer update's parameter and moments): slot -> class, spec
        self.state = {slot: (graph.values[slot].vclass.value, graph.values[slot].known_spec)
                      for slot in sorted(homed_slots(graph))}
        self.bytes_in = 0
        self.bytes_out = 0

    def load_state(self, params: Mapping[str, np.ndarray], optimizer_state: Mapping[str, np.ndarray]) -> None:
        """The homed state's initial bytes into its slots: parameters from `params`, optimizer
        state from `optimizer_state` or zero."""
        self.store.write_state(self.state, params, optimizer_state)

    def parameters(self, vclass_wanted: str = "parameter", names: Collection[str] | None = None) -> dict[str, np.ndarray]:
        """Homed values of `vclass_wanted` (only those in `names` when given), read from their slots."""
        return self.store.read_state(self.state, vclass_wanted, names)

    def kernel(self, node: Node, inputs: list, outputs: list) -> KernelFn:
        """The call of piece node `node` on the executor's arrays for it."""
        slot, offset = str(node.attrs["slot"]), int(node.attrs["offset"])
        if node.op_type == "PieceOut":
            src = _raw(inputs[0])

            def save(ctx: KernelContext, ins: list, outs: list) -> None:
                self.move(slot, src, offset, write=True)
                self.bytes_out += src.nbytes
            return save
        dst = _raw(outputs[0])

        def load(ctx: KernelContext, ins: list, outs: list) -> None:
            self.move(slot, dst, offset, write=False)
            self.bytes_in += dst.nbytes
        return load

    def move(self, slot: str, data: np.ndarray, offset: int, write: bool) -> None:
        """`data` (1-D uint8) to (write) or from bytes `offset`.. of `slot`: the page-aligned
        middle directly, a partial page at either end through a page buffer (module docstring)."""
        size, end = self.store.sizes[slot], offset + data.nbytes
        lo = min(-(-offset // PAGE) * PAGE, end)
        hi = max(end if end == size else end // PAGE * PAGE, lo)
        for a, b in ((offset, lo), (hi, end)):  # the partial head and tail pages (empty when aligned)
            if a < b:
                self._partial(slot, data[a - offset:b - offset], a, write)
        if lo < hi:
            part = data[lo - offset:hi - offset]
            if write:
                self.store.write(slot, part, offset=lo)
            else:
                self.store.read(slot, part, offset=lo)

    def _partial(self, slot: str, data: np.ndarray, offset: int, write: bool) -> None:
        """Bytes inside one page of `slot`: the page read into a buffer, patched and written back
        (write), or copied out of it."""
        start = offset // PAGE * PAGE
        page = np.empty(min(PAGE, self.store.sizes[slot] - start), np.uint8)
        self.store.read(slot, page, offset=start)
        at = slice(offset - start, offset - start + data.nbytes)
        if write:
            page[at] = data
            self.store.write(slot, page, offset=start)
        else:
            data[:] = page[at]

    def close(self) -> None:
        self.store.close()
