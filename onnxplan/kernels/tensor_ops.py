"""Tensor-shape kernels: views copied, Transpose, Expand, Concat, Split, Slice, Gather(Grad), Shape, Cast."""

from __future__ import annotations

import math

import numpy as np

from onnxplan.kernels import _xp
from onnxplan.kernels.registry import kernel

__all__ = ["slice_indices"]

MS = "com.microsoft"


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
def cast(ctx, inputs, outputs):
    """Float to integer truncates toward zero; anything to bool is `!= 0` (numpy's casts)."""
    ctx.xp.copyto(outputs[0], inputs[0], casting="unsafe")


@kernel("Transpose")
def transpose(ctx, inputs, outputs):
    x = inputs[0]
    perm = ctx.attrs.get("perm")
    perm = list(range(x.ndim))[::-1] if perm is None else [int(p) for p in perm]
    ctx.xp.copyto(outputs[0], ctx.xp.transpose(x, perm))


@kernel("Expand")
def expand(ctx, inputs, outputs):
    """Broadcast X to the output's shape (the shape input is already folded into it)."""
    ctx.xp.copyto(outputs[0], inputs[0])


def _concat_into(xp, xs, out, axis: int) -> list[int]:
    axis = _xp.norm_axis(axis, out.ndim)
    start, lengths = 0, []
    for x in xs:
        n = int(x.shape[axis])
        index = (slice(None),) * axis + (slice(start, start + n),)
        xp.copyto(out[index], x)
        start += n
        lengths.append(n)
    if start != out.shape[axis]:
        raise ValueError(f"inputs add up to {start} along axis {axis}, output has {out.shape[axis]}")
    return lengths


@kernel("Concat")
def concat(ctx, inputs, outputs):
    _concat_into(ctx.xp, [x for x in inputs if x is not None], outputs[0], int(ctx.attrs["axis"]))


@kernel("ConcatTraining", MS)
def concat_training(ctx, inputs, outputs):
    """Concat, plus the optional int64 per_input_length: each input's extent along axis."""
    lengths = _concat_into(ctx.xp, [x for x in inputs if x is not None], outputs[0],
                           int(ctx.attrs["axis"]))
    if len(outputs) > 1 and outputs[1] is not None:
        ctx.xp.copyto(outputs[1], ctx.xp.asarray(np.array(lengths, dtype=np.int64)))


@kernel("Split")
@kernel("SplitTraining", MS)
def split(ctx, inputs, outputs):
    """Consecutive pieces along axis; each output's shape (folded from `split`) gives its size."""
    xp, x = ctx.xp, inputs[0]
    axis = _xp.norm_axis(int(ctx.attrs.get("axis", 0)), x.ndim)
    start = 0
    for out in outputs:
        if out is None:
            raise ValueError(f"{ctx.node.name}: every Split output is needed to place the next one")
        n = int(out.shape[axis])
        xp.copyto(out, x[(slice(None),) * axis + (slice(start, start + n),)])
        start += n
    if start != x.shape[axis]:
        raise ValueError(f"{ctx.node.name}: outputs cover {start} of {x.shape[axis]} along axis {axis}")


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
