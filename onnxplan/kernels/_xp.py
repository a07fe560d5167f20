"""Helpers the kernels share across array modules (numpy, cupy): blocked loops, erf, scatter-add."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from onnxplan.ir.attrs import attr_str, norm_axis  # one reading, shared with the shape rules
from onnxplan.kernels import native, parallel

__all__ = [
    "BLOCK_BYTES",
    "attr_str",
    "axis3",
    "block_elems",
    "blocks",
    "blockwise",
    "flat_input",
    "erf",
    "host_ints",
    "host_scalar",
    "is_cupy",
    "norm_axis",
    "quiet",
    "one_object_per_buffer",
    "same_buffer",
    "scatter_add",
    "sum_along",
    "take",
]

# Temporaries a kernel may allocate itself: at most this many bytes each (larger ones are scratch).
# On a GPU a block is larger: each block is a kernel launch (~10 us), and device memory is not
# shared with the interpreter, so a few MiB of temporaries is the price of far fewer launches.
BLOCK_BYTES = 64 * 1024
GPU_BLOCK_BYTES = 1 << 20


def block_elems(dtype=np.float64, xp=np) -> int:
    """Elements per block, sized so a float64 temporary of a block stays within BLOCK_BYTES
    (GPU_BLOCK_BYTES on CuPy)."""
    return (GPU_BLOCK_BYTES if is_cupy(xp) else BLOCK_BYTES) // max(8, np.dtype(dtype).itemsize)


def blocks(shape: Sequence[int], max_elems: int) -> Iterator[tuple]:
    """Index tuples of one slice per axis (so blocks keep the rank) that cut an array of `shape`
    in C order into blocks of at most `max_elems` elements; a 0-d shape gives (Ellipsis,)."""
    shape = tuple(int(d) for d in shape)
    if not shape:
        yield (Ellipsis,)
        return
    if math.prod(shape) <= max_elems:
        yield (slice(None),) * len(shape)
        return
    inner, k = 1, len(shape)
    while k > 0 and inner * shape[k - 1] <= max_elems:
        inner *= shape[k - 1]
        k -= 1
    axis = k - 1  # cut this axis; everything after it is taken whole
    step = max(1, max_elems // inner)
    tail = (slice(None),) * (len(shape) - axis - 1)
    for lead in np.ndindex(*shape[:axis]):
        head = tuple(slice(i, i + 1) for i in lead)
        for start in range(0, shape[axis], step):
            yield head + (slice(start, min(start + step, shape[axis])),) + tail


def blockwise(xp, fn: Callable[..., None], out, *ins) -> None:
    """Run fn(out_block, *in_blocks) over blocks of `out`; inputs are broadcast to out's shape.

    Each block reads its inputs before writing the same positions of `out`, so `out` may be
    the very memory of any input of out's shape; temporaries that fn makes are block-sized (one
    block per compute thread at a time: runs of blocks are split across them, kernels.parallel).
    """
    shape = out.shape
    views = [x if not hasattr(x, "shape") or x.shape == shape else xp.broadcast_to(x, shape) for x in ins]
    if out.size <= block_elems(out.dtype, xp):  # one block: the arrays themselves
        fn(out, *views)
        return
    cuts = list(blocks(shape, block_elems(out.dtype, xp)))

    def run(part: list) -> Callable[[], None]:
        def task() -> None:
            for b in part:
                fn(out[b], *(v[b] if hasattr(v, "shape") else v for v in views))
        return task

    # large arrays: runs of blocks on the compute threads (each thread's temporaries block-sized)
    parts = parallel.parts_for(out.size, xp, passes=4)  # block functions take several passes
    parallel.run([run(cuts[lo:hi]) for lo, hi in parallel.bounds(len(cuts), parts)])


def sum_along(xp, fn: Callable[..., Any], arrays3: Sequence, acc) -> None:
    """acc[p, 0, q] += sum over d of fn(*blocks)[p, d, q] for arrays viewed as [pre, D, post].

    `acc` ([pre, 1, post]) must start at zero; fn gets blocks of the arrays (broadcast to the
    first's shape) and returns a block-sized temporary.
    """
    shape = arrays3[0].shape
    views = [xp.broadcast_to(a, shape) for a in arrays3]
    for b in blocks(shape, block_elems(arrays3[0].dtype, xp)):
        part = fn(*(v[b] for v in views))
        target = acc[(b[0], slice(None), b[2])]
        target += part.sum(axis=1, keepdims=True)


def axis3(shape: Sequence[int], axis: int) -> tuple[int, int, int]:
    """(pre, D, post): the shape viewed around one axis."""
    axis = norm_axis(axis, len(shape))
    return math.prod(shape[:axis]), int(shape[axis]), math.prod(shape[axis + 1:])


def is_cupy(xp) -> bool:
    return getattr(xp, "__name__", "").startswith("cupy")


def quiet(xp):
    """A context that silences floating-point warnings (overflow in exp...) where the module has them."""
    return xp.errstate(all="ignore") if hasattr(xp, "errstate") else _Null()


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def host_ints(x) -> list[int]:
    """A small integer tensor (axes, starts, a shape) as a host list of ints."""
    if x is None:
        return []
    if hasattr(x, "get"):  # cupy
        x = x.get()
    return [int(v) for v in np.asarray(x).reshape(-1)]


def flat_input(inputs: list, i: int) -> Any:
    """Input i (a scalar: a ratio, a bound) as a flat view a bound kernel reads at each call;
    None when absent."""
    return inputs[i].reshape(-1) if len(inputs) > i and inputs[i] is not None else None


def host_scalar(x) -> float | int:
    if hasattr(x, "get"):
        x = x.get()
    return np.asarray(x).reshape(-1)[0].item()


def one_object_per_buffer(arrays: list) -> list:
    """The arrays, where two are views of the same bytes with the same shape, strides and dtype
    the later replaced by the earlier object: CuPy copies an input that may overlap an `out=`
    argument unless the two are one object (a full-size temporary outside the plan)."""
    out: list = []
    for a in arrays:
        twin = next((b for b in out if b is not None and a is not None and b.shape == a.shape
                     and b.strides == a.strides and b.dtype == a.dtype and same_buffer(a, b)), None)
        out.append(a if twin is None else twin)
    return out


def same_buffer(a, b) -> bool:
    """True when two arrays start at the same address and span the same bytes."""
    def addr(x):
        return x.data.ptr if hasattr(x.data, "ptr") else x.__array_interface__["data"][0]

    return addr(a) == addr(b) and a.nbytes == b.nbytes


def take(xp, data, indices, axis: int, out) -> None:
    """Gather along axis into out; indices already checked to lie in [-n, n-1] (so wrap is exact)."""
    if is_cupy(xp):
        xp.take(data, indices, axis=axis, out=out)
    else:  # mode="raise" buffers a whole copy of the result
        xp.take(data, indices, axis=axis, out=out, mode="wrap")


def scatter_add(xp, target3, index, values3) -> None:
    """target3[:, index[k], :] += values3[:, k, :] for every k, in the order of k (repeated
    indices accumulate). target3 is [pre, R, post], index 1-D in [0, R), values3 [pre, K, post].

    numpy's add.at adds in that order. CuPy's add.at uses atomics, whose order varies from run
    to run (float sums that differ in the last bits), so on a GPU each output element sums its
    own entries sequentially, in the order of k, after a stable sort of the indices: the same
    additions in the same order as on the CPU, the same bits every run."""
    if not is_cupy(xp) or not target3.flags.c_contiguous or target3.dtype.kind != "f":
        if target3.shape[0] == 1 and xp is np and _scatter_add_loop(target3[0], index, values3[0]):
            return
        if target3.shape[0] == 1 and xp is np and target3.shape[2] >= SCATTER_ROWS_MIN_WIDTH:
            _scatter_add_rows(target3[0], index, values3[0])
        elif target3.shape[0] == 1:  # numpy's fast path takes a plain index
            xp.add.at(target3[0], index, values3[0])
        else:
            xp.add.at(target3, (slice(None), index), values3)
        return
    pre, rows, post = target3.shape
    order = xp.argsort(index, kind="stable")
    starts = xp.searchsorted(index[order], xp.arange(rows + 1, dtype=index.dtype))
    vals = xp.ascontiguousarray(values3, dtype=target3.dtype)
    _segment_sum_kernel(xp)(vals, order, starts, rows, index.size, post, target3)


def _scatter_add_loop(target, index, values) -> bool:
    """target[index[k]] += values[k] by the fused C loop (kernels/native.py: add.at's additions in
    its order, its bits) where it takes the call: float32 C-contiguous target and values, int64
    indices in range; False: the numpy paths below."""
    if not (target.dtype == np.float32 and values.dtype == np.float32 and index.dtype == np.int64
            and target.flags.c_contiguous and values.flags.c_contiguous and index.ndim == 1):
        return False
    loop = native.scatter_add_rows()
    if loop is None or (index.size and (int(index.min()) < 0 or int(index.max()) >= target.shape[0])):
        return False  # out of range: add.at raises IndexError
    index = np.ascontiguousarray(index)
    loop(target.ctypes.data, index.ctypes.data, values.ctypes.data, int(index.size), int(target.shape[1]))
    return True


# numpy's add.at adds rows of a 2-D target element by element (~7 ns each: 0.9 ms for a
# transformer's 1024 x 128 embedding gradient); rows of this many elements or more go through
# _scatter_add_rows instead (~5x faster there), by blocks of SCATTER_BLOCK elements.
SCATTER_ROWS_MIN_WIDTH = 16
SCATTER_BLOCK = 1 << 13  # two blocks of temporaries: a step's allocations stay small (test_executor_arena)
SCATTER_ROUND_MIN = 8  # a round of fewer rows than this: the entries left go to add.at at once


def _scatter_add_rows(target, index, values) -> None:
    """target[index[k]] += values[k] for every k in the order of k, as numpy's add.at computes
    it, in rounds: round j adds every row's j-th entry (in the order of k), so a row appears
    once in a round and one fancy-indexed add does the round, by blocks (two temporaries of
    SCATTER_BLOCK elements, made once). Each row gets the same additions in the same order: the same bits.
    When a round has few rows left (a row repeated many times, as a padding token's), the
    entries left go to add.at, still in the order of k."""
    k = index.size
    if k == 0:
        return
    order = np.argsort(index, kind="stable")
    by_row = index[order]
    starts = np.flatnonzero(np.r_[True, by_row[1:] != by_row[:-1]])
    rank = np.empty(k, np.intp)  # the entry's place among its row's entries
    rank[order] = np.arange(k) - np.repeat(starts, np.diff(np.r_[starts, k]))
    by_rank = np.argsort(rank, kind="stable")  # round by round, each in the order of k
    ends = np.cumsum(np.bincount(rank))
    per_block = max(1, SCATTER_BLOCK // max(1, target.shape[1]))
    acc = np.empty((min(per_block, k), target.shape[1]), target.dtype)
    add = np.empty_like(acc)
    lo = 0
    for hi in ends:
        if hi - lo < SCATTER_ROUND_MIN:
            _add_at_rows(target, index, values, None if lo == 0 else np.sort(by_rank[lo:]), per_block)
            return
        for b in range(lo, hi, per_block):
            entries = by_rank[b:min(b + per_block, hi)]
            rows = index[entries]
            n = entries.size
            np.take(target, rows, axis=0, out=acc[:n])
            np.take(values, entries, axis=0, out=add[:n])
            np.add(acc[:n], add[:n], out=acc[:n])
            target[rows] = acc[:n]
        lo = hi


def _add_at_rows(target, index, values, entries, per_block: int) -> None:
    """add.at(target, index[entries], values[entries]) in the order of `entries` (None: all),
    by blocks of `per_block` entries (block-sized copies of the values)."""
    if entries is None:
        np.add.at(target, index, values)
        return
    for b in range(0, entries.size, per_block):
        part = entries[b:b + per_block]
        np.add.at(target, index[part], values[part])


_SEGMENT_SUM = None


def _segment_sum_kernel(xp):
    global _SEGMENT_SUM
    if _SEGMENT_SUM is None:
        _SEGMENT_SUM = xp.ElementwiseKernel(
            "raw T vals, raw I order, raw I starts, int64 rows, int64 k, int64 post", "T tgt",
            """
            long long q = i % post, r = (i / post) % rows, p = i / (post * rows);
            T acc = tgt;
            for (long long j = starts[r]; j < starts[r + 1]; ++j) acc += vals[(p * k + order[j]) * post + q];
            tgt = acc;
            """, "onnxplan_segment_sum")
    return _SEGMENT_SUM


# erf: numpy has none. Below 0.5 a Taylor series; above, 1 - erfc with the Chebyshev-fitted
# erfc of Numerical Recipes (fractional error < 1.2e-7), both in float64.
_TAYLOR = [(-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(12)]
_ERFC = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
         -1.13520398, 1.48851587, -0.82215223, 0.17087277)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _erf_block(xp, out, x) -> None:
    z = x.astype(np.float64)
    z2 = z * z
    series = xp.full(z.shape, _TAYLOR[-1])  # for |z| < 0.5
    for c in reversed(_TAYLOR[:-1]):
        series *= z2
        series += c
    series *= z
    series *= _TWO_OVER_SQRT_PI
    t = xp.abs(z)  # for |z| >= 0.5: 1 - erfc(|z|), signed
    t *= 0.5
    t += 1.0
    xp.reciprocal(t, out=t)
    tail = xp.full(z.shape, _ERFC[-1])
    for c in reversed(_ERFC[:-1]):
        tail *= t
        tail += c
    tail -= z2
    xp.exp(tail, out=tail)
    tail *= t
    xp.subtract(1.0, tail, out=tail)
    xp.copysign(tail, z, out=tail)
    xp.copyto(series, tail, where=z2 >= 0.25)
    xp.copyto(out, series, casting="unsafe")


def erf(xp, x, out) -> None:
    """out = erf(x), elementwise; out may be x's memory."""
    if is_cupy(xp):
        import cupyx.scipy.special

        cupyx.scipy.special.erf(x, out=out)
        return
    blockwise(xp, lambda o, v: _erf_block(xp, o, v), out, x)
