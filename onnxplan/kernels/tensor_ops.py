"""Tensor-shape kernels: views copied, Transpose, Expand, Concat, Split, Slice, Gather(Grad), Shape, Cast."""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from onnxplan.ir.cast import cast_attrs, cast_into
from onnxplan.kernels import _torch, _xp
from onnxplan.kernels.registry import KernelContext, KernelFn, kernel, prepared_call
from onnxplan.kernels.transpose import native_transpose

__all__ = ["slice_indices"]

MS = "com.microsoft"
# dtypes torch.from_numpy shares and copies exactly (bool, ints, floats)
_TORCH_DTYPES = tuple(np.dtype(t) for t in (np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64,
                                            np.float16, np.float32, np.float64))


# ---- views: the executor normally binds the output to the input's memory and skips these -----------
@kernel("Identity")
@kernel("Reshape")
@kernel("Flatten")
@kernel("Squeeze")
@kernel("Unsqueeze")
def view_copy(ctx, inputs, outputs):
    """The output is the input's data under the output's shape (a no-op when they share memory)."""
    x, out = inputs[0], outputs[0]
    if x.nbytes != out.nbytes:
        raise ValueError(f"{ctx.node.name}: input of {x.nbytes} bytes cannot fill an output of {out.nbytes}")
    if not _xp.same_buffer(x, out):
        ctx.xp.copyto(out, x.reshape(out.shape))


@kernel("Cast")
@kernel("CastLike")
def cast(ctx, inputs, outputs):
    """ONNX's Cast (onnxplan.ir.cast); CastLike casts to its second input's dtype the same way."""
    cast_into(ctx.xp, inputs[0], outputs[0], *cast_attrs(ctx.attrs), blockwise=_xp.blockwise)


def _perm(ctx, x) -> list[int]:
    perm = ctx.attrs.get("perm")
    return list(range(x.ndim))[::-1] if perm is None else [int(p) for p in perm]


def _torch_transpose(xp, x, out, perm):
    """out <- x permuted by torch's copy_ where it beats numpy's strided copy (measured, one
    thread): a matrix transpose (torch's blocked 2-D path: 2-13x on weight-sized matrices) or a
    permutation keeping the last axis last (contiguous runs: 1.1-1.3x); numpy elsewhere (a
    batched matrix transpose: numpy is up to 2x faster). Host numpy arrays of one numeric
    dtype, C-contiguous. None when numpy serves; else the step's call on views made now."""
    if not _torch.enabled() or xp is not np or x.dtype != out.dtype or x.dtype not in _TORCH_DTYPES \
            or not out.flags.c_contiguous or not x.flags.c_contiguous or out.size == 0:
        return None
    if not (x.ndim == 2 or (x.ndim > 2 and perm[-1] == x.ndim - 1)):
        return None
    src, dst = _torch.tensor(x).permute(perm), _torch.tensor(out)
    return lambda: dst.copy_(src)


def _prepare_transpose(ctx: KernelContext, inputs: list, outputs: list, bound: bool) -> KernelFn:
    """The transposed view of the input made once: a step is one copy (the C loop's for a matrix
    transpose, kernels/transpose.py; else torch's or xp's)."""
    x, out = inputs[0], outputs[0]
    perm = _perm(ctx, x)
    fast = native_transpose(ctx.xp, x, out, perm) or _torch_transpose(ctx.xp, x, out, perm)
    if fast is not None:
        return lambda ctx, inputs, outputs: fast()
    src = ctx.xp.transpose(x, perm)
    copyto = ctx.xp.copyto
    return lambda ctx, inputs, outputs: copyto(out, src)


@kernel("Transpose", bind=partial(_prepare_transpose, bound=True))
def transpose(ctx, inputs, outputs):
    prepared_call(_prepare_transpose, ctx, inputs, outputs)


@kernel("Expand")
def expand(ctx, inputs, outputs):
    """Broadcast X to the output's shape (the shape input is already folded into it)."""
    ctx.xp.copyto(outputs[0], inputs[0])


def _concat_parts(xs, out, axis: int) -> tuple[list, list[int]]:
    """([(out view, input)...] in order, each input's extent along axis)."""
    axis = _xp.norm_axis(axis, out.ndim)
    start, parts, lengths = 0, [], []
    for x in xs:
        n = int(x.shape[axis])
        parts.append((out[(slice(None),) * axis + (slice(start, start + n),)], x))
        start += n
        lengths.append(n)
    if start != out.shape[axis]:
        raise ValueError(f"inputs add up to {start} along axis {axis}, output has {out.shape[axis]}")
    return parts, lengths


def _prepare_concat(ctx: KernelContext, inputs: list, outputs: list, bound: bool) -> KernelFn:
    """The output's slices made once, each input copied into its own; ConcatTraining's optional
    int64 per_input_length too (each input's extent along axis: they follow from the shapes)."""
    xp = ctx.xp
    parts, lengths = _concat_parts([x for x in inputs if x is not None], outputs[0], int(ctx.attrs["axis"]))
    lengths_out = outputs[1] if len(outputs) > 1 and outputs[1] is not None else None
    lengths = xp.asarray(np.array(lengths, dtype=np.int64))

    def run(ctx: KernelContext, inputs: list, outputs: list) -> None:
        for dst, x in parts:
            xp.copyto(dst, x)
        if lengths_out is not None:
            xp.copyto(lengths_out, lengths)

    return run


@kernel("Concat", bind=partial(_prepare_concat, bound=True))
@kernel("ConcatTraining", MS, bind=partial(_prepare_concat, bound=True))
def concat(ctx, inputs, outputs):
    """The inputs one after the other along axis (ConcatTraining: and their extents)."""
    prepared_call(_prepare_concat, ctx, inputs, outputs)


def _split_parts(ctx, inputs, outputs) -> list:
    """[(output, input view)...]: consecutive pieces along axis, each output's shape its size."""
    x = inputs[0]
    axis = _xp.norm_axis(int(ctx.attrs.get("axis", 0)), x.ndim)
    start, parts = 0, []
    for out in outputs:
        if out is None:
            raise ValueError(f"{ctx.node.name}: every Split output is needed to place the next one")
        n = int(out.shape[axis])
        parts.append((out, x[(slice(None),) * axis + (slice(start, start + n),)]))
        start += n
    if start != x.shape[axis]:
        raise ValueError(f"{ctx.node.name}: outputs cover {start} of {x.shape[axis]} along axis {axis}")
    return parts


def _prepare_split(ctx: KernelContext, inputs: list, outputs: list, bound: bool) -> KernelFn:
    """The input's slices made once, each copied into its output."""
    parts, copyto = _split_parts(ctx, inputs, outputs), ctx.xp.copyto

    def run(ctx: KernelContext, inputs: list, outputs: list) -> None:
        for out, piece in parts:
            copyto(out, piece)

    return run


@kernel("Split", bind=partial(_prepare_split, bound=True))
@kernel("SplitTraining", MS, bind=partial(_prepare_split, bound=True))
def split(ctx, inputs, outputs):
    """Consecutive pieces along axis; each output's shape (folded from `split`) gives its size."""
    prepared_call(_prepare_split, ctx, inputs, outputs)


def slice_indices(shape, starts, ends, axes=None, steps=None) -> tuple[slice, ...]:
    """ONNX Slice's (starts, ends, axes, steps) as Python slices, with ONNX's clamping rules."""
    rank = len(shape)
    axes = list(range(len(starts))) if not axes else axes
    steps = [1] * len(starts) if not steps else steps
    index = [slice(None)] * rank
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = _xp.norm_axis(axis, rank)
        dim = int(shape[axis])
        if step == 0:
            raise ValueError("Slice step must not be 0")
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
            index[axis] = slice(start, end, step)
        else:  # start in [0, dim-1], end in [-1, dim-1]; -1 means "through index 0"
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
            index[axis] = slice(start, None if end < 0 else end, step)
    return tuple(index)


@kernel("Slice")
def slice_(ctx, inputs, outputs):
    x = inputs[0]
    starts, ends = _xp.host_ints(inputs[1]), _xp.host_ints(inputs[2])
    axes = _xp.host_ints(inputs[3]) if len(inputs) > 3 else []
    steps = _xp.host_ints(inputs[4]) if len(inputs) > 4 else []
    ctx.xp.copyto(outputs[0], x[slice_indices(x.shape, starts, ends, axes, steps)])


def _checked_indices(xp, indices, dim: int, where: str):
    if indices.size:
        lo, hi = int(indices.min()), int(indices.max())
        if lo < -dim or hi >= dim:
            raise IndexError(f"{where}: index {lo if lo < -dim else hi} out of range [-{dim}, {dim - 1}]")
    return indices


@kernel("Gather")
@kernel("ShrunkenGather", MS)
def gather(ctx, inputs, outputs):
    xp, (data, indices) = ctx.xp, inputs[:2]
    axis = _xp.norm_axis(int(ctx.attrs.get("axis", 0)), data.ndim)
    _checked_indices(xp, indices, int(data.shape[axis]), ctx.node.name)
    _xp.take(xp, data, indices, axis, outputs[0])


@kernel("GatherGrad", MS)
def gather_grad(ctx, inputs, outputs):
    """dX (zeros of the Gather input's shape) with dY scatter-added at the gathered indices."""
    xp, (_, indices, dy), out = ctx.xp, inputs[:3], outputs[0]
    axis = _xp.norm_axis(int(ctx.attrs.get("axis", 0)), out.ndim)
    pre, dim, post = _xp.axis3(out.shape, axis)
    _checked_indices(xp, indices, dim, ctx.node.name)
    flat = indices.reshape(-1)
    flat = flat + dim * (flat < 0)  # an indices-sized temporary
    out.fill(0)
    out3 = out.reshape(pre, dim, post)
    dy3 = dy.reshape(pre, flat.size, post)
    _xp.scatter_add(xp, out3, flat, dy3)


@kernel("Shape")
def shape(ctx, inputs, outputs):
    """The input's dims from `start` to `end` (opset 15 attributes), as int64."""
    dims = list(inputs[0].shape)
    rank = len(dims)
    start = int(ctx.attrs.get("start", 0))
    end = ctx.attrs.get("end")
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = rank if end is None else int(end)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    ctx.xp.copyto(outputs[0], ctx.xp.asarray(np.array(dims[start:end], dtype=np.int64)))


@kernel("Size")
def size(ctx, inputs, outputs):
    outputs[0].fill(math.prod(inputs[0].shape))


@kernel("ConstantOfShape")
def constant_of_shape(ctx, inputs, outputs):
    value = ctx.attrs.get("value")
    if value is None:
        outputs[0].fill(0)
        return
    if not isinstance(value, np.ndarray):
        from onnx import TensorProto, numpy_helper

        value = numpy_helper.to_array(value) if isinstance(value, TensorProto) else np.asarray(value)
    outputs[0].fill(value.reshape(-1)[0].item())


@kernel("SliceGrad", MS)
def slice_grad(ctx, inputs, outputs):
    """(dY, shape, starts, ends, axes, steps) -> dX: zeros with dY at the sliced positions."""
    dy, out = inputs[0], outputs[0]
    starts, ends = _xp.host_ints(inputs[2]), _xp.host_ints(inputs[3])
    axes = _xp.host_ints(inputs[4]) if len(inputs) > 4 else []
    steps = _xp.host_ints(inputs[5]) if len(inputs) > 5 else []
    out.fill(0)
    ctx.xp.copyto(out[slice_indices(out.shape, starts, ends, axes, steps)], dy)


@kernel("Constant")
def constant(ctx, inputs, outputs):
    from onnxplan.ir.shape_rules.tensor_ops import constant_node_value

    ctx.xp.copyto(outputs[0], ctx.xp.asarray(constant_node_value(ctx.node).reshape(outputs[0].shape)),
                  casting="unsafe")


@kernel("Trilu", overwrites={0: (0,)})
@kernel("Trilu", MS, overwrites={0: (0,)})
def trilu(ctx, inputs, outputs):
    """The upper (upper=1) or lower triangle of the last two axes from diagonal k (input 1), zeros elsewhere."""
    xp, x, out = ctx.xp, inputs[0], outputs[0]
    k = int(_xp.host_scalar(inputs[1])) if len(inputs) > 1 and inputs[1] is not None else 0
    rows, cols = x.shape[-2], x.shape[-1]
    offset = xp.arange(cols)[None, :] - xp.arange(rows)[:, None]  # j - i, [rows, cols]
    drop = offset < k if int(ctx.attrs.get("upper", 1)) else offset > k
    if not _xp.same_buffer(x, out):
        xp.copyto(out, x)
    xp.copyto(out, 0, where=drop)


@kernel("Range")
def range_(ctx, inputs, outputs):
    """start + i * delta for i < max(ceil((limit - start) / delta), 0) (the output's length)."""
    xp, out = ctx.xp, outputs[0]
    start, delta = _xp.host_scalar(inputs[0]), _xp.host_scalar(inputs[2])
    xp.multiply(xp.arange(out.shape[0], dtype=out.dtype), out.dtype.type(delta), out=out)
    out += out.dtype.type(start)


@kernel("Tile")
def tile(ctx, inputs, outputs):
    """Y viewed as [r0, d0, r1, d1, ...] gets X viewed as [1, d0, 1, d1, ...], broadcast."""
    x, out = inputs[0], outputs[0]
    repeats = _xp.host_ints(inputs[1])
    paired = [v for r, d in zip(repeats, x.shape) for v in (r, d)]
    ones = [v for d in x.shape for v in (1, d)]
    ctx.xp.copyto(out.reshape(paired), x.reshape(ones))


def _pad_sources(mode: str, before: int, n: int, size: int):
    """For output positions 0..size-1 of one axis (n inner values after `before` pads), the inner
    position each copies (edge, reflect, wrap)."""
    s = np.arange(size) - before
    if mode == "edge" or n == 1:
        return np.clip(s, 0, n - 1)
    if mode == "wrap":
        return np.mod(s, n)
    period = 2 * (n - 1)  # reflect: the edge is not repeated
    s = np.mod(s, period)
    return np.where(s > n - 1, period - s, s)


def _pad_plan(ctx, inputs, out):
    """What Pad does for these pads/axes: (mode, fill value or None, (out view, x view) of the
    inner part, per padded axis [(region, index, source)...] for the non-constant modes)."""
    xp, x = ctx.xp, inputs[0]
    mode = _xp.attr_str(ctx.attrs.get("mode"), "constant")
    rank = x.ndim
    pads = _xp.host_ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else \
        [int(p) for p in ctx.attrs["pads"]]
    axes = _xp.host_ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(range(rank))
    before, after = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        a = _xp.norm_axis(a, rank)
        before[a], after[a] = pads[i], pads[i + len(axes)]
    src = tuple(slice(max(0, -b), x.shape[a] - max(0, -e)) for a, (b, e) in enumerate(zip(before, after)))
    before, after = [max(0, b) for b in before], [max(0, e) for e in after]
    inner = [s.stop - s.start for s in src]
    dst = tuple(slice(b, b + n) for b, n in zip(before, inner))
    if mode == "constant":
        value = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
        return mode, (0 if value is None else _xp.host_scalar(value)), (out[dst], x[src]), []
    if any(n == 0 for n, b, e in zip(inner, before, after) if b or e):
        raise ValueError(f"{ctx.node.name}: Pad mode {mode!r} of an empty axis")
    fills = []
    for a in range(rank):
        if not (before[a] or after[a]):
            continue
        region = out[tuple(slice(None) if i <= a else dst[i] for i in range(rank))]
        source = xp.asarray(_pad_sources(mode, before[a], inner[a], out.shape[a]) + before[a])
        for part in (slice(0, before[a]), slice(before[a] + inner[a], out.shape[a])):
            if part.stop > part.start:
                fills.append((region, (slice(None),) * a + (part,), source[part], a))
    return mode, None, (out[dst], x[src]), fills


def _pad_run(xp, out, plan) -> None:
    _mode, value, (inner_out, inner_x), fills = plan
    if value is not None:
        out.fill(value)
    xp.copyto(inner_out, inner_x)
    for region, index, source, axis in fills:
        region[index] = xp.take(region, source, axis=axis)


def _bind_pad(ctx, inputs, outputs):
    """The plan made once per value of the pads/value/axes inputs (constants, loaded after
    binding: read at the first call, their bytes checked each step)."""
    out = outputs[0]
    made: dict = {}
    keyed = [a for a in inputs[1:] if a is not None]
    if ctx.xp is not np:
        return None

    def run(ctx, inputs, outputs):
        key = tuple(a.tobytes() for a in keyed)
        plan = made.get(key)
        if plan is None:
            plan = made[key] = _pad_plan(ctx, inputs, out)
        _pad_run(np, out, plan)

    return run


@kernel("Pad", bind=_bind_pad)
def pad(ctx, inputs, outputs):
    """Modes constant, reflect, edge, wrap; pads (and axes) as inputs (opset 11+) or attribute;
    negative pads crop. The inner part is copied once, then each axis's pads are filled in turn
    from what is already in the output."""
    _pad_run(ctx.xp, outputs[0], _pad_plan(ctx, inputs, outputs[0]))
