"""ConvTranspose and its gradient: the adjoint of a Conv from Y's space to X's, run by the Conv
and ConvGrad kernels on that Conv's node."""

from __future__ import annotations

from typing import Any

from onnxplan.ir.graph import Node
from onnxplan.ir.windows import transpose_pads
from onnxplan.kernels.conv import conv, conv_scratch
from onnxplan.kernels.conv_grad import conv_grad, conv_grad_scratch
from onnxplan.kernels.conv_layout import node_memo
from onnxplan.kernels.registry import KernelContext, kernel
from onnxplan.ort import MS

__all__ = ["conv_transpose", "conv_transpose_grad", "conv_transpose_grad_scratch", "conv_transpose_scratch"]

_AS_CONV: dict[tuple[Any, ...], tuple[dict[str, Any], Node]] = {}


def _as_conv(node, x_dims, kernel_shape) -> Node:
    """The node as the Conv from Y's space to X's that it is the adjoint of (explicit pads); the
    same Node for the same node and shapes, so the Conv's own memos (conv_window) hit on every
    later call instead of taking one entry per call."""

    def make() -> Node:
        begin, end = transpose_pads(node.attrs, x_dims, kernel_shape)
        attrs = {k: v for k, v in node.attrs.items() if k in ("strides", "dilations", "group")}
        return Node(node.name, "Conv", "", node.inputs, node.outputs, {**attrs, "pads": begin + end})

    return node_memo(_AS_CONV, node.attrs, (node.name, tuple(node.inputs), tuple(node.outputs),
                                            tuple(x_dims), tuple(kernel_shape)), make)


def conv_transpose_scratch(node, in_specs, out_specs) -> int:
    """A ConvGrad's dX alone (dY: X, the weight W, x: Y)."""
    x, w, y = in_specs[0], in_specs[1], out_specs[0]
    conv = _as_conv(node, x.shape[2:], w.shape[2:])
    return conv_grad_scratch(conv, [x, y, w], [y])


@kernel("ConvTranspose", scratch=conv_transpose_scratch)
def conv_transpose(ctx: KernelContext, inputs, outputs) -> None:
    """Y = ConvGrad's dX of the Conv from Y's space to X's (col2im of W^T @ X), plus the bias."""
    x, w, y = inputs[0], inputs[1], outputs[0]
    b = inputs[2] if len(inputs) > 2 else None
    conv = _as_conv(ctx.node, x.shape[2:], w.shape[2:])
    sub = KernelContext(ctx.xp, conv, [], [], ctx.scratch)
    conv_grad(sub, [x, y, w], [y])  # y stands for the Conv's input: only its shape is read
    if b is not None:
        y3 = y.reshape(y.shape[0], y.shape[1], -1)
        ctx.xp.add(y3, b.reshape(-1, 1), out=y3)


def conv_transpose_grad_scratch(node, in_specs, out_specs) -> int:
    """dX is a Conv of dY; dW a ConvGrad's dW (dy: X, x: dY); one after the other."""
    dy, x, w = in_specs[0], in_specs[1], in_specs[2]
    conv = _as_conv(node, x.shape[2:], w.shape[2:])
    need_dx = len(out_specs) > 0 and out_specs[0] is not None
    need_dw = len(out_specs) > 1 and out_specs[1] is not None
    dx_bytes = conv_scratch(conv, [dy, w], [x]) if need_dx else 0
    dw_bytes = conv_grad_scratch(conv, [x, dy, w], [None, w]) if need_dw else 0
    return max(dx_bytes, dw_bytes)


@kernel("ConvTransposeGrad", MS, scratch=conv_transpose_grad_scratch)
def conv_transpose_grad(ctx: KernelContext, inputs, outputs) -> None:
    """(dY, X, W) -> dX = Conv(dY, W), dW = ConvGrad's dW with X as the gradient, dB = sum of dY."""
    xp = ctx.xp
    dy, x, w = inputs[0], inputs[1], inputs[2]
    dx = outputs[0] if len(outputs) > 0 else None
    dw = outputs[1] if len(outputs) > 1 else None
    db = outputs[2] if len(outputs) > 2 else None
    conv_node = _as_conv(ctx.node, x.shape[2:], w.shape[2:])
    sub = KernelContext(xp, conv_node, [], [], ctx.scratch)
    if dx is not None:
        conv(sub, [dy, w], [dx])
    if dw is not None:
        conv_grad(sub, [x, dy, w], [None, dw])
    if db is not None:
        xp.sum(dy.reshape(dy.shape[0], dy.shape[1], -1), axis=(0, 2), out=db)
