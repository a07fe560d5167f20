"""Shape rules for neural-network layers: convolutions, pooling, normalizations, softmax, dropout."""

from __future__ import annotations

from onnxplan.ir.graph import Node
from onnxplan.ir.shape_rules import shape_rule
from onnxplan.ir.shape_rules._common import (
    MS,
    attr,
    attr_ints,
    attr_str,
    dtype_of_onnx,
    fail,
    need,
    norm_axis,
    outputs,
    register_same_as_input,
    window_dims,
)
from onnxplan.ir.tensor import TensorSpec
from onnxplan.ir.windows import (
    ceil_window_past_input,
    conv_out_dims,
    conv_transpose_out_dims,
    pool_out_dims,
)

__all__ = ["layer_norm_stat_spec"]

register_same_as_input(("Softmax", "LogSoftmax", "LRN", "InstanceNormalization",
                        "MeanVarianceNormalization", "LpNormalization"))


@shape_rule("Hardmax", since=13)
def _hardmax(node, specs, consts):
    return outputs(node, need(node, specs, 0))


@shape_rule("Hardmax", until=12)
def _hardmax_2d(node, specs, consts):
    raise fail("Hardmax before opset 13 (on the input coerced to 2-D) is not supported")
register_same_as_input(("BiasSoftmax",), MS)


def _kernel(node: Node, w: TensorSpec | None) -> list[int]:
    kernel = attr_ints(node, "kernel_shape")
    if kernel:
        return kernel
    if w is None:
        raise fail("no kernel_shape attribute and no weight input")
    return list(w.shape[2:])


@shape_rule("Conv")
def _conv(node, specs, consts):
    x, w = need(node, specs, 0), need(node, specs, 1)
    if x.rank < 3 or w.rank != x.rank:
        raise fail(f"input of rank {x.rank} and weight of rank {w.rank}: need N x C x spatial, both of one rank")
    if x.shape[1] != w.shape[1] * int(attr(node, "group", 1)):
        raise fail(f"input has {x.shape[1]} channels, weight expects {w.shape[1]} x group {attr(node, 'group', 1)}")
    dims = window_dims(conv_out_dims, node, x.shape[2:], _kernel(node, w))
    return outputs(node, x.with_shape((x.shape[0], w.shape[0], *dims)))


@shape_rule("ConvTranspose")
def _conv_transpose(node, specs, consts):
    x, w = need(node, specs, 0), need(node, specs, 1)
    dims = window_dims(conv_transpose_out_dims, node, x.shape[2:], _kernel(node, w))
    return outputs(node, x.with_shape((x.shape[0], w.shape[1] * int(attr(node, "group", 1)), *dims)))


@shape_rule("MaxPool")
@shape_rule("AveragePool")
@shape_rule("LpPool")
def _pool(node, specs, consts):
    x = need(node, specs, 0)
    kernel = _kernel(node, None)
    dims = window_dims(pool_out_dims, node, x.shape[2:], kernel, bool(attr(node, "ceil_mode", 0)))
    if attr(node, "ceil_mode", 0) and attr_str(node, "auto_pad", "NOTSET") == "NOTSET":
        i = ceil_window_past_input(node.attrs, x.shape[2:], dims)
        if i is not None:
            # ONNX drops such a window; ONNX Runtime 1.19 keeps it and reads outside the input
            raise fail(f"{node.op_type} with ceil_mode=1 whose last window (axis {i + 2}) starts past "
                       f"the input and its padding is not supported")
    y = x.with_shape(x.shape[:2] + tuple(dims))
    return outputs(node, y, TensorSpec("int64", y.shape))  # MaxPool's second output: Indices


@shape_rule("GlobalAveragePool")
@shape_rule("GlobalMaxPool")
@shape_rule("GlobalLpPool")
def _global_pool(node, specs, consts):
    x = need(node, specs, 0)
    return outputs(node, x.with_shape(x.shape[:2] + (1,) * (x.rank - 2)))


def _channels(x: TensorSpec) -> int:
    return x.shape[1] if x.rank > 1 else 1


@shape_rule("GroupNormalization")
def _group_norm(node, specs, consts):
    x = need(node, specs, 0)
    groups = int(attr(node, "num_groups", 0))
    if groups <= 0 or _channels(x) % groups:
        raise fail(f"num_groups {groups} does not divide {_channels(x)} channels")
    if int(attr(node, "stash_type", 1)) != 1:
        raise fail("GroupNormalization stash_type other than float32 is not supported")
    return outputs(node, x)


@shape_rule("BatchNormalization")
def _batch_norm(node, specs, consts):
    """Y, then (training) running_mean, running_var — or opset < 14's mean, var, saved_mean, saved_var."""
    x, mean = need(node, specs, 0), need(node, specs, 3)
    stat = mean.with_shape((_channels(x),))
    return outputs(node, x, stat, stat, stat, stat)


@shape_rule("BatchNormInternal", MS)
def _batch_norm_internal(node, specs, consts):
    """Y, running_mean, running_var, saved_mean, saved_inv_std; the last four are [C]."""
    x, mean, var = need(node, specs, 0), need(node, specs, 3), need(node, specs, 4)
    c = (_channels(x),)
    return outputs(node, x, mean.with_shape(c), var.with_shape(c), mean.with_shape(c), var.with_shape(c))


def layer_norm_stat_spec(node: Node, x: TensorSpec, default_axis: int = -1) -> TensorSpec:
    """Mean / InvStdDev of a layer norm: X's shape with the normalized axes set to 1, stash type."""
    axis = norm_axis(node, attr(node, "axis", default_axis), x.rank)
    stash = attr(node, "stash_type", 1)
    return TensorSpec(dtype_of_onnx(stash), x.shape[:axis] + (1,) * (x.rank - axis))


@shape_rule("LayerNormalization")
@shape_rule("LayerNormalization", MS)
def _layer_norm(node, specs, consts):
    x = need(node, specs, 0)
    stat = layer_norm_stat_spec(node, x)
    return outputs(node, x, stat, stat)


@shape_rule("SimplifiedLayerNormalization")
@shape_rule("SimplifiedLayerNormalization", MS)
def _simplified_layer_norm(node, specs, consts):
    x = need(node, specs, 0)
    return outputs(node, x, layer_norm_stat_spec(node, x))


@shape_rule("Dropout")
@shape_rule("BiasDropout", MS)
@shape_rule("TrainableDropout")
def _dropout(node, specs, consts):
    x = need(node, specs, 0)
    return outputs(node, x, x.with_dtype("bool"))


@shape_rule("RandomUniformLike")
@shape_rule("RandomNormalLike")
def _random_like(node, specs, consts):
    """The input's shape; dtype from the `dtype` attribute, else the input's."""
    x = need(node, specs, 0)
    dtype = attr(node, "dtype")
    return outputs(node, x if dtype is None else x.with_dtype(dtype_of_onnx(dtype)))


@shape_rule("BitmaskDropout", MS)
@shape_rule("BitmaskBiasDropout", MS)
def _bitmask_dropout(node, specs, consts):
    x = need(node, specs, 0)
    return outputs(node, x, TensorSpec("uint32", (-(-x.numel // 32),)))


@shape_rule("BiasSoftmaxDropout", MS)
def _bias_softmax_dropout(node, specs, consts):
    x = need(node, specs, 0)
    return outputs(node, x, x.with_dtype("bool"), x)
