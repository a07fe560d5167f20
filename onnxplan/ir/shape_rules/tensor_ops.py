"""Shape rules for data-movement ops: shape, reshape, transpose, concat, split, slice, gather..."""

from __future__ import annotations

import numpy as np

from onnxplan.ir.graph import Node
from onnxplan.ir.shape_rules import shape_rule
from onnxplan.ir.shape_rules._common import (
    MS,
    attr,
    attr_ints,
    broadcast,
    const,
    const_ints,
    fail,
    has_input,
    need,
    need_const,
    norm_axes,
    norm_axis,
    outputs,
    prod,
    required_ints,
    tensor_value,
)
from onnxplan.ir.shape_rules.resize import resize_params
from onnxplan.ir.tensor import TensorSpec

__all__ = [
    "constant_node_value",
    "slice_dims",
    "slice_range",
    "slice_axes",
    "slice_params",
    "reshape_dims",
    "split_sizes",
    "squeeze_axes",
]


def constant_node_value(node: Node) -> np.ndarray:
    """The value of a Constant node, from whichever attribute carries it."""
    for name in ("value", "value_float", "value_int", "value_string"):
        if name in node.attrs:
            return tensor_value(node.attrs[name])
    if "value_floats" in node.attrs:
        return np.asarray(node.attrs["value_floats"], dtype=np.float32)
    if "value_ints" in node.attrs:
        return np.asarray(node.attrs["value_ints"], dtype=np.int64)
    raise fail("Constant without a supported value attribute (sparse_value?)")


@shape_rule("Constant")
def _constant(node, specs, consts):
    value = constant_node_value(node)
    if isinstance(node.attrs.get("value_float"), float):
        value = value.astype(np.float32)
    if isinstance(node.attrs.get("value_int"), int):
        value = value.astype(np.int64)
    return outputs(node, TensorSpec(value.dtype.name, value.shape))


@shape_rule("ConstantOfShape")
def _constant_of_shape(node, specs, consts):
    shape = const_ints(node, consts, 0, "shape")
    value = node.attrs.get("value")
    dtype = tensor_value(value).dtype.name if value is not None else "float32"
    return outputs(node, TensorSpec(dtype, tuple(shape)))


@shape_rule("Shape")
def _shape(node, specs, consts):
    rank = need(node, specs, 0).rank
    start, end = int(attr(node, "start", 0)), attr(node, "end", None)
    n = len(range(rank)[slice(start, None if end is None else int(end))])
    return outputs(node, TensorSpec("int64", (n,)))


@shape_rule("Size")
def _size(node, specs, consts):
    need(node, specs, 0)
    return outputs(node, TensorSpec("int64", ()))


@shape_rule("Gather")
@shape_rule("ShrunkenGather", MS)
def _gather(node, specs, consts):
    data, idx = need(node, specs, 0), need(node, specs, 1)
    axis = norm_axis(node, attr(node, "axis", 0), data.rank)
    return outputs(node, data.with_shape(data.shape[:axis] + idx.shape + data.shape[axis + 1 :]))


@shape_rule("GatherElements")
def _gather_elements(node, specs, consts):
    return outputs(node, need(node, specs, 0).with_shape(need(node, specs, 1).shape))


@shape_rule("GatherND")
def _gather_nd(node, specs, consts):
    data, idx = need(node, specs, 0), need(node, specs, 1)
    batch = int(attr(node, "batch_dims", 0))
    return outputs(node, data.with_shape(idx.shape[:-1] + data.shape[batch + idx.shape[-1] :]))


def _concat_shape(node, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    rank = len(shapes[0])
    axis = norm_axis(node, attr(node, "axis"), rank)
    for s in shapes:
        if len(s) != rank or s[:axis] + s[axis + 1 :] != shapes[0][:axis] + shapes[0][axis + 1 :]:
            raise fail(f"cannot concatenate shapes {shapes} on axis {axis}")
    return shapes[0][:axis] + (sum(s[axis] for s in shapes),) + shapes[0][axis + 1 :]


@shape_rule("Concat")
def _concat(node, specs, consts):
    present = [need(node, specs, i) for i in range(len(node.inputs)) if node.inputs[i]]
    return outputs(node, present[0].with_shape(_concat_shape(node, [s.shape for s in present])))


@shape_rule("ConcatTraining", MS)
def _concat_training(node, specs, consts):
    present = [need(node, specs, i) for i in range(len(node.inputs)) if node.inputs[i]]
    shape = _concat_shape(node, [s.shape for s in present])
    return outputs(node, present[0].with_shape(shape), TensorSpec("int64", (len(present),)))


def split_sizes(node: Node, dim: int, split: list[int] | None) -> list[int]:
    """Output lengths of a split of `dim` into len(node.outputs) parts."""
    n = len(node.outputs)
    if split:
        if len(split) != n or sum(split) != dim:
            raise fail(f"split {split} does not divide a dimension of {dim} into {n} outputs")
        return split
    n = int(attr(node, "num_outputs", n))
    chunk = -(-dim // n)
    return [chunk] * (n - 1) + [dim - chunk * (n - 1)]


@shape_rule("Split")
@shape_rule("SplitTraining", MS)
def _split(node, specs, consts):
    x = need(node, specs, 0)
    axis = norm_axis(node, attr(node, "axis", 0), x.rank)
    split = attr_ints(node, "split")
    if has_input(node, 1):
        split = const_ints(node, consts, 1, "split")
    sizes = split_sizes(node, x.shape[axis], split)
    return outputs(node, *(x.with_shape(x.shape[:axis] + (s,) + x.shape[axis + 1 :]) for s in sizes))


def slice_range(dim: int, start: int, end: int, step: int) -> range:
    """The indices Slice takes along one axis of size `dim` (ONNX clamping rules)."""
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return range(start, end, step)


def slice_axes(node: Node, rank: int, starts, ends, axes, steps):
    """(axis, start, end, step) per sliced axis, validated."""
    axes = list(range(len(starts))) if axes is None else norm_axes(node, axes, rank)
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise fail("starts, ends, axes and steps differ in length")
    if 0 in steps:
        raise fail("slice step 0")
    return list(zip(axes, starts, ends, steps))


def slice_dims(node: Node, shape, starts, ends, axes, steps) -> tuple[int, ...]:
    """Output shape of Slice with the given (already read) starts/ends/axes/steps."""
    out = list(shape)
    for axis, start, end, step in slice_axes(node, len(shape), starts, ends, axes, steps):
        out[axis] = len(slice_range(shape[axis], start, end, step))
    return tuple(out)


def slice_params(node: Node, consts):
    """(starts, ends, axes, steps) of a Slice node, from inputs (opset >= 10) or attributes."""
    if len(node.inputs) == 1:  # opset < 10: attributes
        return attr_ints(node, "starts"), attr_ints(node, "ends"), attr_ints(node, "axes"), None
    read = [const_ints(node, consts, i, n) if has_input(node, i) else None for i, n in
            ((1, "starts"), (2, "ends"), (3, "axes"), (4, "steps"))]
    return tuple(read)


@shape_rule("Slice")
def _slice(node, specs, consts):
    x = need(node, specs, 0)
    return outputs(node, x.with_shape(slice_dims(node, x.shape, *slice_params(node, consts))))


def reshape_dims(node: Node, in_shape, target, allowzero: bool) -> tuple[int, ...]:
    out = [in_shape[i] if (d == 0 and not allowzero and i < len(in_shape)) else d for i, d in enumerate(target)]
    if out.count(-1) > 1:
        raise fail(f"reshape target {target} has more than one -1")
    total = prod(in_shape)
    if -1 in out:
        known = prod(d for d in out if d != -1)
        if known == 0 or total % known:
            raise fail(f"cannot reshape {tuple(in_shape)} to {target}")
        out[out.index(-1)] = total // known
    if prod(out) != total:
        raise fail(f"cannot reshape {tuple(in_shape)} ({total} elements) to {target}")
    return tuple(out)


@shape_rule("Reshape")
def _reshape(node, specs, consts):
    x = need(node, specs, 0)
    if has_input(node, 1):
        target = const_ints(node, consts, 1, "shape")
    else:  # opset < 5
        target = required_ints(node, "shape")
    return outputs(node, x.with_shape(reshape_dims(node, x.shape, target, bool(attr(node, "allowzero", 0)))))


@shape_rule("Flatten")
def _flatten(node, specs, consts):
    x = need(node, specs, 0)
    axis = int(attr(node, "axis", 1))  # in [-r, r]; a negative axis counts from r
    if not -x.rank <= axis <= x.rank:
        raise fail(f"Flatten axis {axis} is out of range for rank {x.rank}")
    axis += x.rank if axis < 0 else 0
    return outputs(node, x.with_shape((prod(x.shape[:axis]), prod(x.shape[axis:]))))


def squeeze_axes(node: Node, consts) -> list[int] | None:
    if has_input(node, 1):
        return const_ints(node, consts, 1, "axes")
    return attr_ints(node, "axes")


@shape_rule("Squeeze")
def _squeeze(node, specs, consts):
    x = need(node, specs, 0)
    axes = squeeze_axes(node, consts)
    if axes is None:
        drop = {i for i, d in enumerate(x.shape) if d == 1}
    else:
        drop = set(norm_axes(node, axes, x.rank))
        if any(x.shape[a] != 1 for a in drop):
            raise fail(f"cannot squeeze axes {sorted(drop)} of shape {x.shape}")
    return outputs(node, x.with_shape(d for i, d in enumerate(x.shape) if i not in drop))


@shape_rule("Unsqueeze")
def _unsqueeze(node, specs, consts):
    x = need(node, specs, 0)
    axes = squeeze_axes(node, consts) or []
    rank = x.rank + len(axes)
    new = set(norm_axes(node, axes, rank))
    dims = iter(x.shape)
    return outputs(node, x.with_shape(1 if i in new else next(dims) for i in range(rank)))


@shape_rule("Transpose")
def _transpose(node, specs, consts):
    x = need(node, specs, 0)
    perm = attr_ints(node, "perm") or list(reversed(range(x.rank)))
    return outputs(node, x.with_shape(x.shape[p] for p in perm))


@shape_rule("Expand")
def _expand(node, specs, consts):
    x = need(node, specs, 0)
    return outputs(node, x.with_shape(broadcast(node, x.shape, const_ints(node, consts, 1, "shape"))))


@shape_rule("Tile")
def _tile(node, specs, consts):
    x = need(node, specs, 0)
    repeats = const_ints(node, consts, 1, "repeats")
    return outputs(node, x.with_shape(d * r for d, r in zip(x.shape, repeats)))


@shape_rule("Range")
def _range(node, specs, consts):
    start, limit, delta = (_scalar(node, consts, i, n) for i, n in enumerate(("start", "limit", "delta")))
    n = max(int(np.ceil((limit - start) / delta)), 0)
    return outputs(node, TensorSpec(need(node, specs, 0).dtype, (n,)))


def _scalar(node, consts, i, what) -> float:
    return float(need_const(node, consts, i, what).reshape(-1)[0])


@shape_rule("Trilu")
@shape_rule("Trilu", MS)
@shape_rule("ScatterElements")
@shape_rule("ScatterND")
def _same_as_data(node, specs, consts):
    return outputs(node, need(node, specs, 0))


@shape_rule("Pad")
def _pad(node, specs, consts):
    x = need(node, specs, 0)
    mode = attr(node, "mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise fail(f"Pad mode {mode!r} is not supported")
    pads = const_ints(node, consts, 1, "pads") if has_input(node, 1) else required_ints(node, "pads")
    axes = const_ints(node, consts, 3, "axes") if has_input(node, 3) else list(range(x.rank))
    axes = norm_axes(node, axes, x.rank)
    out = list(x.shape)
    for k, a in enumerate(axes):
        out[a] += pads[k] + pads[k + len(axes)]
    return outputs(node, x.with_shape(out))


@shape_rule("OneHot")
def _one_hot(node, specs, consts):
    idx, values = need(node, specs, 0), need(node, specs, 2)
    depth = int(_scalar(node, consts, 1, "depth"))
    axis = norm_axis(node, attr(node, "axis", -1), idx.rank + 1)
    return outputs(node, TensorSpec(values.dtype, idx.shape[:axis] + (depth,) + idx.shape[axis:]))


@shape_rule("PadAndUnflatten", MS)
def _pad_and_unflatten(node, specs, consts):
    """(input [d1, ...], indices [d1], unflatten_dims [M1, M2]) -> ([M1, M2, ...], its flat shape)."""
    x = need(node, specs, 0)
    m1, m2 = const_ints(node, consts, 2, "unflatten_dims")
    return outputs(node, x.with_shape((m1, m2) + x.shape[1:]), TensorSpec("int64", (x.rank,)))


@shape_rule("FlattenAndUnpad", MS)
def _flatten_and_unpad(node, specs, consts):
    """(input [M1, M2, ...], indices [d1]) -> ([d1, ...], unflatten_dims [2])."""
    x, idx = need(node, specs, 0), need(node, specs, 1)
    return outputs(node, x.with_shape(idx.shape[:1] + x.shape[2:]), TensorSpec("int64", (2,)))


@shape_rule("TopK")
def _top_k(node, specs, consts):
    x = need(node, specs, 0)
    k = const_ints(node, consts, 1, "K")[0] if has_input(node, 1) else int(attr(node, "k"))
    axis = norm_axis(node, attr(node, "axis", -1), x.rank)
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1 :]
    return outputs(node, x.with_shape(shape), TensorSpec("int64", shape))


@shape_rule("NonZero")
@shape_rule("Unique")
@shape_rule("Compress")
def _data_dependent(node, specs, consts):
    raise fail(f"{node.op_type}'s output shape depends on the input values: not supported (static shapes only)")


@shape_rule("Resize")
@shape_rule("Upsample")
def _resize(node, specs, consts):
    """Output dims from `sizes`, or floor(dim * scale); unsupported modes refused here, at plan time."""
    x = need(node, specs, 0)
    try:
        params = resize_params(node.op_type, node.attrs, x.shape, lambda i: const(node, consts, i))
    except ValueError as exc:
        raise fail(str(exc)) from None
    return outputs(node, x.with_shape(params.out_dims))
