"""Index kernels: GatherElements(Grad), GatherND(Grad), ScatterElements, ScatterND, OneHot, TopK."""

from __future__ import annotations

import numpy as np

from onnxplan.kernels import _xp
from onnxplan.kernels.registry import kernel

__all__: list[str] = []

MS = "com.microsoft"
_REDUCE_AT = {"add": "add", "mul": "multiply", "max": "maximum", "min": "minimum"}


def _wrapped(xp, indices, dim: int, where: str):
    """Indices in [-dim, dim) made non-negative (an indices-sized temporary); others raise."""
    if indices.size:
        lo, hi = int(indices.min()), int(indices.max())
        if lo < -dim or hi >= dim:
            raise IndexError(f"{where}: index {lo if lo < -dim else hi} out of range [-{dim}, {dim - 1}]")
    return xp.where(indices < 0, indices + dim, indices)


def _slabs(shape, axis: int, itemsize_elems: int):
    """Index tuples of slabs along the first axis other than `axis` (whole otherwise), each of
    about itemsize_elems elements, so take/put_along_axis temporaries stay block-sized."""
    lead = 0 if axis != 0 else 1
    if len(shape) <= lead:
        yield (slice(None),) * len(shape)
        return
    per_row = max(1, int(np.prod(shape, dtype=np.int64)) // max(1, shape[lead]))
    step = max(1, itemsize_elems // per_row)
    for s in range(0, shape[lead], step):
        yield (slice(None),) * lead + (slice(s, s + step),)


def _element_index(xp, indices, axis: int):
    """The full index tuple that ufunc.at needs for positions `indices` along axis (others: their own)."""
    grids = xp.ogrid[tuple(slice(0, d) for d in indices.shape)] if indices.ndim else ()
    return tuple(indices if a == axis else grids[a] for a in range(indices.ndim))


@kernel("GatherElements")
def gather_elements(ctx, inputs, outputs):
    xp, (data, indices), out = ctx.xp, inputs[:2], outputs[0]
    axis = _xp.norm_axis(int(ctx.attrs.get("axis", 0)), data.ndim)
    dim = int(data.shape[axis])
    # indices may be shorter than data on the other axes: data's corner of their extent
    data = data[tuple(slice(None) if a == axis else slice(0, n) for a, n in enumerate(indices.shape))]
    for s in _slabs(indices.shape, axis, _xp.block_elems(data.dtype, xp)):
        idx = _wrapped(xp, indices[s], dim, ctx.node.name)
        xp.copyto(out[s], xp.take_along_axis(data[s], idx, axis=axis))


@kernel("GatherElementsGrad", MS)
def gather_elements_grad(ctx, inputs, outputs):
    """(dY, shape, indices) -> dX: zeros with dY added at the gathered positions."""
    xp, dy, indices, out = ctx.xp, inputs[0], inputs[2], outputs[0]
    axis = _xp.norm_axis(int(ctx.attrs.get("axis", 0)), out.ndim)
    out.fill(0)
    idx = _wrapped(xp, indices, int(out.shape[axis]), ctx.node.name)
    xp.add.at(out, _element_index(xp, idx, axis), dy)


@kernel("ScatterElements", overwrites={0: (0,)})
def scatter_elements(ctx, inputs, outputs):
    """data with updates written (or combined: reduction add/mul/max/min) at indices along axis."""
    xp, (data, indices, updates), out = ctx.xp, inputs[:3], outputs[0]
    axis = _xp.norm_axis(int(ctx.attrs.get("axis", 0)), data.ndim)
    reduction = _xp.attr_str(ctx.attrs.get("reduction"), "none")
    if not _xp.same_buffer(data, out):
        xp.copyto(out, data)
    index = _element_index(xp, _wrapped(xp, indices, int(data.shape[axis]), ctx.node.name), axis)
    if reduction == "none":
        out[index] = updates
    else:
        getattr(xp, _REDUCE_AT[reduction]).at(out, index, updates)


def _nd_index(xp, data_shape, indices, batch_dims: int, where: str):
    """GatherND/ScatterND's index tuple into data viewed as [B, *data_shape[batch_dims:]]
    (B: the product of the batch dims) for indices viewed as [B, M, k]."""
    k = int(indices.shape[-1])
    lead = int(np.prod(data_shape[:batch_dims], dtype=np.int64))
    idx = indices.reshape(lead, -1, k)
    parts = [xp.arange(lead).reshape(lead, 1)]
    for j in range(k):
        parts.append(_wrapped(xp, idx[:, :, j], int(data_shape[batch_dims + j]), where))
    return tuple(parts), lead


@kernel("GatherND")
def gather_nd(ctx, inputs, outputs):
    xp, (data, indices), out = ctx.xp, inputs[:2], outputs[0]
    batch = int(ctx.attrs.get("batch_dims", 0))
    index, lead = _nd_index(xp, data.shape, indices, batch, ctx.node.name)
    flat = data.reshape((lead,) + data.shape[batch:])
    k = int(indices.shape[-1])
    xp.copyto(out.reshape((lead, -1) + data.shape[batch + k:]), flat[index])


@kernel("GatherNDGrad", MS)
def gather_nd_grad(ctx, inputs, outputs):
    """(shape, indices, dY) -> dX: zeros with dY added at the gathered slices."""
    xp, indices, dy, out = ctx.xp, inputs[1], inputs[2], outputs[0]
    batch = int(ctx.attrs.get("batch_dims", 0))
    index, lead = _nd_index(xp, out.shape, indices, batch, ctx.node.name)
    k = int(indices.shape[-1])
    out.fill(0)
    flat = out.reshape((lead,) + out.shape[batch:])
    xp.add.at(flat, index, dy.reshape((lead, -1) + out.shape[batch + k:]))


@kernel("ScatterND", overwrites={0: (0,)})
def scatter_nd(ctx, inputs, outputs):
    xp, (data, indices, updates), out = ctx.xp, inputs[:3], outputs[0]
    reduction = _xp.attr_str(ctx.attrs.get("reduction"), "none")
    if not _xp.same_buffer(data, out):
        xp.copyto(out, data)
    index, _ = _nd_index(xp, data.shape, indices, 0, ctx.node.name)
    k = int(indices.shape[-1])
    flat = out.reshape((1,) + out.shape)
    values = updates.reshape((1, -1) + data.shape[k:])
    if reduction == "none":
        flat[index] = values
    else:
        getattr(xp, _REDUCE_AT[reduction]).at(flat, index, values)


@kernel("OneHot")
def one_hot(ctx, inputs, outputs):
    """on_value where the (wrapped) index equals the position along axis, off_value elsewhere."""
    xp, (indices, depth, values), out = ctx.xp, inputs[:3], outputs[0]
    axis = _xp.norm_axis(int(ctx.attrs.get("axis", -1)), out.ndim)
    depth = int(_xp.host_scalar(depth))
    vals = _xp.host_ints(values) if np.dtype(values.dtype).kind in "iub" else \
        [v.item() for v in (values.get() if hasattr(values, "get") else np.asarray(values)).reshape(-1)]
    off, on = vals[0], vals[1]
    idx = indices.astype(np.int64)
    idx = xp.where(idx < 0, idx + depth, idx)
    idx = xp.expand_dims(idx, axis)
    positions = xp.arange(depth).reshape((depth,) + (1,) * (out.ndim - axis - 1))

    def block(o, i, p):
        xp.copyto(o, xp.where(i == p, o.dtype.type(on), o.dtype.type(off)))

    _xp.blockwise(xp, block, out, idx, positions)


@kernel("TopK")
def top_k(ctx, inputs, outputs):
    """The k largest (largest=1) or smallest along axis, sorted; ties keep the lower index first."""
    xp, x, values, indices = ctx.xp, inputs[0], outputs[0], outputs[1] if len(outputs) > 1 else None
    axis = _xp.norm_axis(int(ctx.attrs.get("axis", -1)), x.ndim)
    k = values.shape[axis]
    largest = int(ctx.attrs.get("largest", 1))
    # rows along the last axis, sorted a block of rows at a time: the sort's keys and indices are
    # block-sized temporaries (at least one row), never X-sized
    xs, vs = xp.moveaxis(x, axis, -1), xp.moveaxis(values, axis, -1)
    ins = xp.moveaxis(indices, axis, -1) if indices is not None else None
    rows = max(1, _xp.block_elems(np.float64, xp) // max(1, x.shape[axis]))
    for b in _xp.blocks(xs.shape[:-1], rows):
        xb = xs[b]
        key = -xb.astype(np.float64) if largest else xb
        order = xp.argsort(key, axis=-1, kind="stable")[..., :k]
        xp.copyto(vs[b], xp.take_along_axis(xb, order, axis=-1))
        if ins is not None:
            xp.copyto(ins[b], order)
