"""The one independent checker every offset plan goes through before it is trusted."""

from __future__ import annotations

import bisect
import heapq
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from onnxplan.errors import EXIT_FAILURE, OnnxplanError
from onnxplan.offsets.buffers import ALIGNMENT, Buffer, OffsetPlan

__all__ = ["PieceRange", "PlanError", "RowChunk", "SplitRecord", "verify_chunks", "verify_offsets", "verify_pieces",
           "verify_row_chunks"]


class PieceRange(Protocol):
    """A transfer between the arena and a byte range of a host slot (onnxplan.passes.split.Piece)."""

    @property
    def node(self) -> str: ...
    @property
    def kind(self) -> str: ...  # "in" | "out"
    @property
    def slot(self) -> str: ...
    @property
    def offset(self) -> int: ...
    @property
    def nbytes(self) -> int: ...


class SplitRecord(Protocol):
    """A node split in chunks (onnxplan.plan.PlannedSplit)."""

    @property
    def node(self) -> str: ...
    @property
    def k(self) -> int: ...


@dataclass(frozen=True)
class RowChunk:
    """Chunk `index` of split node `node` over rows: a table's (onnxplan.GatherRows /
    GatherGradRows: its rows [start, stop) of the table's `rows`, and the rows its piece of the
    table holds), or a product's (MatMul, FusedMatMul, Gemm over the rows of its left operand:
    the rows [start, stop) of the output's `rows`, flattened over every axis but the last, that
    its output piece holds; `piece_start`, `piece_rows`: where the piece of the left operand it
    reads starts and how many rows it holds, in the output's rows; -1 where it is no whole number
    of them)."""

    node: str
    index: int
    start: int
    stop: int
    rows: int
    piece_rows: int
    piece_start: int | None = None  # None: a table chunk (its piece is the chunk's rows by construction)


class PlanError(OnnxplanError):
    """A plan breaks a memory invariant (overlap, bounds, alignment, missing offset)."""

    exit_code = EXIT_FAILURE


def _describe(b: Buffer, offset: int) -> str:
    return f"{b.name!r} (EO {b.first}..{b.last}, bytes {offset}..{offset + b.nbytes})"


def verify_offsets(buffers: Iterable[Buffer], plan: OffsetPlan) -> None:
    """Raise PlanError naming the first violation found; return None for a sound plan.

    Checks every buffer has an integer offset, a multiple of ALIGNMENT, inside [0, arena);
    that the plan names no unknown buffer; and that no two buffers live at a common EO share
    a byte (empty buffers share nothing). The overlap check sweeps the EOs keeping the live
    buffers sorted by address, so each new buffer is compared with its two neighbours only.
    """
    bufs = list(buffers)
    arena = plan.arena_bytes
    if not isinstance(arena, int) or arena < 0:
        raise PlanError(f"plan {plan.planner!r}: bad arena size {arena!r}")
    by_name: dict[str, Buffer] = {}
    for b in bufs:
        if b.name in by_name:
            raise PlanError(f"plan {plan.planner!r}: buffer {b.name!r} listed twice")
        by_name[b.name] = b
        if b.name not in plan.offsets:
            raise PlanError(f"plan {plan.planner!r}: no offset for buffer {b.name!r}")
        offset = plan.offsets[b.name]
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise PlanError(f"plan {plan.planner!r}: offset of {b.name!r} is not an integer")
        if offset % ALIGNMENT:
            raise PlanError(
                f"plan {plan.planner!r}: offset {offset} of {b.name!r} is not a multiple of "
                f"{ALIGNMENT}"
            )
        if offset < 0 or offset + b.nbytes > arena:
            raise PlanError(
                f"plan {plan.planner!r}: {_describe(b, offset)} lies outside the arena "
                f"[0, {arena})"
            )
    unknown = sorted(set(plan.offsets) - set(by_name))
    if unknown:
        raise PlanError(f"plan {plan.planner!r}: offset for unknown buffer {unknown[0]!r}")
    _check_no_overlap(plan, [b for b in bufs if b.nbytes])


def _check_no_overlap(plan: OffsetPlan, bufs: list[Buffer]) -> None:
    offsets = plan.offsets
    bufs.sort(key=lambda b: (b.first, offsets[b.name], b.name))
    live: list[tuple[int, int, str]] = []  # (low, high, name), sorted; pairwise disjoint
    expiry: list[tuple[int, int, int, str]] = []  # heap of (last EO, low, high, name)
    by_name = {b.name: b for b in bufs}
    for b in bufs:
        while expiry and expiry[0][0] < b.first:
            _, low, high, name = heapq.heappop(expiry)
            del live[bisect.bisect_left(live, (low, high, name))]
        low = offsets[b.name]
        entry = (low, low + b.nbytes, b.name)
        i = bisect.bisect_left(live, entry)
        for j in (i - 1, i):
            if 0 <= j < len(live):
                other_low, other_high, other = live[j]
                if other_low < entry[1] and entry[0] < other_high:
                    raise PlanError(
                        f"plan {plan.planner!r}: {_describe(by_name[other], other_low)} and "
                        f"{_describe(b, low)} are live at the same EO and overlap"
                    )
        live.insert(i, entry)
        heapq.heappush(expiry, (b.last, *entry))


def verify_pieces(pieces: Iterable[PieceRange], order: list[str] | tuple[str, ...], slot_bytes: dict[str, int],
                  align: int, homes: Iterable[str] = (), off_page_min: int | None = None) -> None:
    """Raise PlanError unless the split pass's transfers (onnxplan.passes.split) are sound along
    `order`: each range lies inside its slot (`slot_bytes`) at a multiple of `align`; no two
    writes of one slot in a step overlap; a range's length is a multiple of `align` unless it
    ends the slot (a store writes whole pages); a range of at least `off_page_min` bytes (None:
    none) may start and end off the page (the piece runtime moves its partial end pages by
    read-modify-write, one transfer at a time); every read finds its whole range written earlier
    in the step (none missing), except in `homes`, the slots of state (full at the step's start),
    each of which the step writes back whole and none of which is read after the write-back of
    any of the bytes read (the read would find the updated bytes). Each range names its node, which `order` must hold."""
    eo = {name: t for t, name in enumerate(order)}
    home = set(homes)
    rows = sorted(pieces, key=lambda p: eo.get(p.node, -1))
    written: dict[str, list[tuple[int, int]]] = {}
    for p in rows:
        where = f"piece {p.kind} {p.node!r} of slot {p.slot!r} (bytes {p.offset}..{p.offset + p.nbytes})"
        if p.node not in eo:
            raise PlanError(f"{where}: no such node in the order")
        if p.slot not in slot_bytes or p.offset < 0 or p.nbytes <= 0 or p.offset + p.nbytes > slot_bytes[p.slot]:
            raise PlanError(f"{where}: outside its slot ({slot_bytes.get(p.slot, 'no')} B)")
        large = off_page_min is not None and p.nbytes >= off_page_min
        if p.offset % align and not large:
            raise PlanError(f"{where}: offset not a multiple of {align}")
        if p.nbytes % align and p.offset + p.nbytes != slot_bytes[p.slot] and not large:
            raise PlanError(f"{where}: length not a multiple of {align} and the range does not end the slot")
        spans = written.setdefault(p.slot, [])
        other = next((s for s in spans if s[0] < p.offset + p.nbytes and p.offset < s[1]), None)
        if p.kind == "out":
            if other is not None:
                raise PlanError(f"{where} overlaps bytes {other[0]}..{other[1]} written earlier in the step")
            bisect.insort(spans, (p.offset, p.offset + p.nbytes))
        elif p.slot in home:
            if other is not None:
                raise PlanError(f"{where}: reads state bytes {other[0]}..{other[1]} already written back in the step")
        else:
            reach = _covered(spans, p.offset)
            if reach < p.offset + p.nbytes:
                raise PlanError(f"{where}: bytes {reach}..{p.offset + p.nbytes} are missing (not written before it)")
    for slot in sorted(home):
        reach = _covered(written.get(slot, []), 0)
        if reach < slot_bytes.get(slot, 0):
            raise PlanError(f"state slot {slot!r}: bytes {reach}..{slot_bytes[slot]} are not written back in the step")


def _covered(spans: list[tuple[int, int]], start: int) -> int:
    """The end of the run of `spans` (sorted, disjoint) that covers bytes from `start` on."""
    reach = start
    for low, high in spans:
        if low <= reach < high:
            reach = high
    return reach


_CHUNK = re.compile(r"^(.*)#(\d+)(?:\.add\d+)?$")


def verify_chunks(splits: Iterable[SplitRecord], order: list[str] | tuple[str, ...]) -> None:
    """Raise PlanError unless every split node's chunks are in `order` as its record says: the
    node itself gone, chunks `NODE#0` .. `NODE#K-1` each present (a sum's chunk may add its
    partial sum in `NODE#j.addI`), none beyond K (a chunk left out would leave rows uncomputed,
    or a term out of a sum over rows); K = 1 (a transpose folded into its products): gone, no chunk."""
    seen: dict[str, set[int]] = {}
    names = set(order)
    for name in order:
        m = _CHUNK.match(name)
        if m:
            seen.setdefault(m.group(1), set()).add(int(m.group(2)))
    for s in splits:
        if s.node in names:
            raise PlanError(f"split node {s.node!r} is still in the order whole")
        got = seen.get(s.node, set())
        if got != set(range(s.k if s.k > 1 else 0)):  # K = 1: folded into its products, no chunk
            missing, extra = sorted(set(range(s.k)) - got), sorted(got - set(range(s.k)))
            raise PlanError(f"split node {s.node!r} in {s.k} chunks: chunks {missing} missing, {extra} beyond K "
                            "in the order")


def verify_row_chunks(chunks: Iterable[RowChunk], splits: Iterable[SplitRecord]) -> None:
    """Raise PlanError unless the chunks of every node split over rows (a table's, a product's)
    partition its rows: chunks 0..K-1, chunk 0 from row 0, each from where the one before
    stopped, the last stopping at the rows, none empty, each reading (writing) a piece of exactly
    its rows (a product's chunk: the rows of its left operand's piece are the rows of its output
    piece). So every output position of a split Gather is written by exactly one chunk, every
    dW row of a split GatherGrad by exactly one chunk, and every output row of a split product
    by exactly one chunk, from the same row of its left operand."""
    by_node: dict[str, list[RowChunk]] = {}
    for c in chunks:
        by_node.setdefault(c.node, []).append(c)
    for s in splits:
        got = sorted(by_node.pop(s.node, []), key=lambda c: c.index)
        if not got:
            continue
        if [c.index for c in got] != list(range(s.k)):
            raise PlanError(f"split node {s.node!r} in {s.k}: its row chunks are {[c.index for c in got]}")
        reach = 0
        for c in got:
            if c.start != reach or c.stop <= c.start or c.rows != got[0].rows or c.stop - c.start != c.piece_rows:
                raise PlanError(f"chunk {c.index} of {s.node!r} covers rows {c.start}..{c.stop} with a piece of "
                                f"{c.piece_rows} rows; the chunks must partition the {c.rows} rows, this one from "
                                f"row {reach}")
            if c.piece_start is not None and c.piece_start != c.start:
                raise PlanError(f"chunk {c.index} of {s.node!r} writes output rows {c.start}..{c.stop} from the "
                                f"rows of its left operand's piece from row {c.piece_start}")
            reach = c.stop
        if reach != got[0].rows:
            raise PlanError(f"the chunks of {s.node!r} cover rows 0..{reach} of {got[0].rows}")
    if by_node:
        raise PlanError(f"row chunks of {sorted(by_node)[0]!r}, a node the plan does not split")
