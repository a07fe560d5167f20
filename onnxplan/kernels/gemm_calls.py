"""A product's BLAS calls run on the fused library's GEMM pool (kernels/native_source_gemm.py).

kernels/parallel.py hands pieces to Python threads: a worker must take the interpreter lock
before it can call BLAS, which the caller holds until it enters its own piece, so on two vCPUs
its piece began 36-82 us late and mlp's 64 x 784 x 256 product lost when cut in two
(reports/threads.md, sessions 12 and 17). Here the calling thread describes every cblas_sgemm
call of the product (the calls numpy's matmul makes for each piece: the same arguments, so the
same bits as np.matmul on that piece) and hands the list to one C call, in which it and the
pool's workers claim calls one at a time without the interpreter lock: a worker the machine has
not run claims nothing, and the caller never waits for it.

`product_calls` makes a product's calls where numpy would make them (float32 matrices of at least two
rows, columns and inner length, BLAS-compatible strides: one of each operand's two axes of unit
stride, as numpy's is_blasable2d asks), and gives None where numpy does something else (a
vector product, A @ A.T through syrk, strides BLAS cannot take, an output overlapping an input):
the caller then keeps the Python pool.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from onnxplan import settings, threads
from onnxplan.kernels import native, parallel

__all__ = ["ADAMW", "CALL_FIELDS", "POOLED_MIN_ELEMS", "ROWS", "SGEMM", "TRANSPOSE32", "GemmPool", "PooledCalls", "pool",
           "pooled_parts", "product_calls", "rows_job"]

CALL_FIELDS = 12  # order, trans a, trans b, m, n, k, a, lda, b, ldb, c, ldc (as the C loop reads them)
SGEMM, ADAMW, TRANSPOSE32, ROWS = 0, 1, 2, 3  # the kinds of call a job holds (native_source_gemm.py's GC_*)
# A fused loop's work (AdamW's ranges, a transpose's matrices or columns) splits on the pool from
# this many elements a piece (the Python pool's pieces, kernels.parallel's MIN_ELEMS, are 1 M:
# a Python worker's wake-up and the interpreter lock cost ~0.1 ms). Smaller pieces lost: a
# parameter's update runs right after its gradient, whose lines sit in the caller's cache; cut in
# two, a transformer's 65K-element ff weights took 67-78 us against 45-52 whole (step medians, in
# one process, 2 threads), mlp b64's fc1.weight (200K) 55 against ~80 but its step no less (0.998).
# At 128K, resnet18 b8's updates took 7.4 ms a step against 8.1 (reports/threads.md, session 27).
POOLED_MIN_ELEMS = 1 << 17
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # CBLAS's enums
# How long a worker spins for the next job after one before it sleeps. A sleeping thread took
# ~40 us to wake on the 2-vCPU VM (more after a long sleep): mlp b64's two split products, ~1 ms
# apart, took their whole time in the step when the workers slept between them (node alone: 0.7-0.9x;
# the step: 1.0-1.1x), and the step 0.81-0.88x with 0.3-1 ms of spinning (reports/threads.md, session
# 21). Hushed (asleep at once) when the Python pool hands out pieces (kernels/parallel.py).
SPIN_NS = 1_000_000
_SGEMM_SYMBOLS = ("scipy_cblas_sgemm64_", "cblas_sgemm64_")  # numpy's OpenBLAS: 64-bit integers
_F32 = 4
_FLOAT32 = np.dtype(np.float32)


@functools.cache
def sgemm_address() -> int | None:
    """The address of cblas_sgemm (64-bit integers) in the BLAS numpy loaded, or None (another
    BLAS, or 32-bit integers: the Python pool then)."""
    import threadpoolctl

    for info in threadpoolctl.threadpool_info():
        if info.get("user_api") != "blas" or info.get("internal_api") != "openblas":
            continue
        try:
            lib = ctypes.CDLL(info["filepath"])
        except OSError:
            continue
        for name in _SGEMM_SYMBOLS:
            fn = getattr(lib, name, None)
            if fn is not None:
                return ctypes.cast(fn, ctypes.c_void_p).value
    return None


def _blasable(s_row: int, s_col: int, cols: int) -> bool:
    """numpy's is_blasable2d for float32 (strides in bytes): unit stride along a row, a row
    stride that is whole elements and at least a row long."""
    return s_col == _F32 and s_row % _F32 == 0 and s_row // _F32 >= cols


def _operand(x, rows: int, cols: int) -> tuple[int, int] | None:
    """(trans, ld) numpy's matmul passes BLAS for a [rows x cols] operand, or None."""
    s_row, s_col = x.strides[-2], x.strides[-1]
    if s_row < 0 or s_col < 0:
        return None
    if _blasable(s_row, s_col, cols):
        return NO_TRANS, s_row // _F32
    if _blasable(s_col, s_row, rows):
        return TRANS, s_col // _F32
    return None


def _address(x) -> int:
    return x.__array_interface__["data"][0]


def product_calls(a, b, out, cut: str, bounds: Sequence[tuple[int, int]], row_block: int) -> np.ndarray | None:
    """The cblas_sgemm calls np.matmul makes for each piece of out = a @ b (`cut` "batches",
    "columns" or "rows" of out at `bounds`; each piece's rows by blocks of at most `row_block`,
    as matmul.blas_matmul calls it), as the [calls x CALL_FIELDS] int64 array the pool reads;
    None where numpy would make other calls (the module's docstring). The addresses are the
    pieces' own (a piece's view starts where its slice does): no array is sliced here."""
    if not (a.dtype == b.dtype == out.dtype == _FLOAT32) or out.ndim < 2 or a.ndim < 2 or b.ndim < 2:
        return None
    m, k = a.shape[-2:]
    n = b.shape[-1]
    if max(a.ndim, b.ndim) > out.ndim or min(m, k) < 2:
        return None
    ta, tb = _operand(a, m, k), _operand(b, k, n)
    if ta is None or tb is None or not _blasable(out.strides[-2], out.strides[-1], n):
        return None
    pa, pb, pc = _address(a), _address(b), _address(out)
    if pa == pb or np.may_share_memory(out, a) or np.may_share_memory(out, b):
        return None  # A @ A.T may go to syrk in numpy (its bits, not sgemm's); an overlap is copied
    steps = [_batch_strides(x, out.ndim) for x in (a, b, out)]
    if min(min(s, default=0) for s in steps) < 0:
        return None
    lda, ldb, ldc = ta[1], tb[1], out.strides[-2] // _F32
    a_row = lda * _F32 if ta[0] == NO_TRANS else _F32  # bytes from one row of a to the next
    b_col = _F32 if tb[0] == NO_TRANS else ldb * _F32  # from one column of b to the next
    c_row = ldc * _F32
    calls: list[tuple[int, ...]] = []
    cols = bounds if cut == "columns" else [(0, n)]
    rows = bounds if cut == "rows" else [(0, m)]
    for index in _matrices(out.shape[:-2], bounds if cut == "batches" else None):
        ai, bi, ci = (p + sum(i * s for i, s in zip(index, st)) for p, st in zip((pa, pb, pc), steps))
        for c0, c1 in cols:
            for r0, r1 in rows:
                for q0, q1 in _blocks(r0, r1, row_block):
                    if q1 - q0 < 2 or c1 - c0 < 2:
                        return None  # a vector product: numpy calls gemv
                    calls.append((ROW_MAJOR, ta[0], tb[0], q1 - q0, c1 - c0, k, ai + q0 * a_row, lda,
                                  bi + c0 * b_col, ldb, ci + q0 * c_row + c0 * _F32, ldc))
    return np.array(calls, dtype=np.int64).reshape(len(calls), CALL_FIELDS)


def _batch_strides(x, out_ndim: int) -> list[int]:
    """x's stride in bytes along each of out's batch axes (0 where x broadcasts along it: an
    axis x lacks or has once), as numpy's matmul steps through them."""
    lead = out_ndim - x.ndim
    return [0 if i < lead or x.shape[i - lead] == 1 else x.strides[i - lead] for i in range(out_ndim - 2)]


def _matrices(batch_shape: tuple[int, ...], lead: Sequence[tuple[int, int]] | None) -> list[tuple[int, ...]]:
    """The batch index of every matrix of out, in the pieces' order: the leading batch axis by
    the cut's bounds (`lead`; None: whole), the other batch axes in full."""
    if not batch_shape:
        return [()]
    ranges = lead if lead is not None else [(0, batch_shape[0])]
    inner = list(np.ndindex(*batch_shape[1:]))
    return [(i, *rest) for lo, hi in ranges for i in range(lo, hi) for rest in inner]


def _blocks(lo: int, hi: int, size: int) -> list[tuple[int, int]]:
    """lo..hi in as few equal blocks of at most `size` as matmul.blas_matmul cuts its rows."""
    count = -(-(hi - lo) // size)
    return [(lo + (hi - lo) * j // count, lo + (hi - lo) * (j + 1) // count) for j in range(count)]


class GemmPool:
    """The fused library's gemm_calls and numpy's cblas_sgemm."""

    def __init__(self, fns: native.GemmPoolCalls, sgemm: int) -> None:
        self._fn = fns.run
        self.hush = fns.hush  # spinning workers sleep now (another pool needs the cores)
        self._sgemm = sgemm

    def run(self, table: np.ndarray, workers: int, kind: int = SGEMM, fn: int | None = None, *,
            address: int | None = None) -> tuple[float, float, int, int]:
        """Run every call of `table` (product_calls; or, of another kind, a fused loop's pieces
        to the loop at address `fn`: PooledCalls, e.g. AdamW ranges, transpose pieces, softmax
        rows) on this thread and up to `workers` pool threads; (seconds taken, seconds this
        thread spent on its calls, how many it ran, how many there were). `address`: the
        table's, where the caller keeps it (numpy's `.ctypes.data` takes ~1.7 us a look-up)."""
        out, out_at = _report()
        took = self._fn(self._sgemm if fn is None else fn, table.ctypes.data if address is None else address,
                        len(table), workers, SPIN_NS, out_at, kind)
        return took, float(out[0]), int(out[1]), len(table)


_reports = threading.local()


def _report() -> tuple[np.ndarray, int]:
    """This thread's two floats the pool's C call reports into, and their address: one per thread
    (two threads may run jobs at once: interop), made once."""
    made = getattr(_reports, "made", None)
    if made is None:
        out = np.zeros(2, np.float64)
        made = _reports.made = (out, out.ctypes.data)
    return made


class PooledCalls:
    """A kernel's pieces as one job of calls of `kind` to the fused loop `fn` (a ctypes
    function), one table row a piece (its arguments, as native_source_gemm.py's gp_call reads
    them): run by the calling thread and the pool's workers (kernels.parallel.run_elsewhere
    scores the split), by the calling thread alone at one compute thread. `table` may be updated
    between calls (a step's constants)."""

    def __init__(self, gemm: GemmPool, kind: int, fn: Any, rows: Sequence[Sequence[int]]) -> None:
        self.pool, self.kind = gemm, kind
        self.fn = ctypes.cast(cast(Any, fn), ctypes.c_void_p).value  # the loop's address
        self.table = np.zeros((len(rows), CALL_FIELDS), np.int64)
        for out, row in zip(self.table, rows):
            out[:len(row)] = row
        self.address = self.table.ctypes.data  # the table is updated in place, never replaced

    def __call__(self) -> None:
        gemm, table, kind, fn, at = self.pool, self.table, self.kind, self.fn, self.address
        if threads.current().compute > 1:
            parallel.run_elsewhere(lambda workers: gemm.run(table, workers, kind, fn, address=at))
        else:
            gemm.run(table, 0, kind, fn, address=at)


def rows_job(fn: Any, first: int, second: int, rows: int, last: int, numel: int) -> Callable[[], Any]:
    """A fused loop of kind ROWS, fn(first, second, r0, r1, last) over rows 0..rows (`numel`
    elements in all), as one call: on the GEMM pool as ranges of rows of POOLED_MIN_ELEMS elements
    and more (a PooledCalls), else whole on the calling thread (no pool, ONNXPLAN_SPLIT_KERNELS=0,
    or one part). The kernels' loops of this kind: softmax's rows, the GELU's and its gradient's
    elements."""
    gemm, parts = pooled_parts(numel) if settings.current().split_kernels else (None, 1)
    parts = min(parts, rows)
    if gemm is None or parts <= 1:
        return functools.partial(fn, first, second, 0, rows, last)
    return PooledCalls(gemm, ROWS, fn, [(first, second, lo, hi, last) for lo, hi in parallel.bounds(rows, parts)])


def pooled_parts(numel: int) -> tuple[GemmPool | None, int]:
    """(the pool, how many pieces) for a fused loop over `numel` elements on the GEMM pool:
    pieces of POOLED_MIN_ELEMS and more for the compute threads; (None, 1) where there is no
    pool (the Python pool's thresholds then)."""
    gemm = pool()
    if gemm is None:
        return None, 1
    return gemm, parallel.parts_for(numel, np, min_elems=POOLED_MIN_ELEMS)


def pool() -> GemmPool | None:
    """The GEMM pool, or None where the fused library or numpy's ILP64 cblas_sgemm cannot be had
    (or ONNXPLAN_NATIVE_KERNELS=0): kernels.parallel's Python pool then. Looked up once per
    settings (onnxplan.settings.reload makes new ones)."""
    global _cached
    now = settings.current()
    if _cached is None or _cached[0] is not now:
        fns = native.gemm_calls()
        address = sgemm_address() if fns is not None else None
        _cached = (now, GemmPool(fns, address) if fns is not None and address else None)
        threads.gemm_pool_found(_cached[1] is not None)
    return _cached[1]


_cached: tuple[object, GemmPool | None] | None = None
