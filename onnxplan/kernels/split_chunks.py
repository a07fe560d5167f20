"""Kernels of the split pass's own chunk nodes (passes/split.py, passes/split_ops.py).

onnxplan.PieceRows: indices [start, stop) of `axis` of a value whole in the arena copied into a
chunk's piece (a small piece off the store's page; a dW ConvGrad's dY channels).

onnxplan.ConvGradWeight: a chunk of a dW ConvGrad split over dW's output channels (KIND_CHANNELS):
(dY's channels m0..m1, X) -> dW[m0:m1], with the piece's shape as the attribute `w_shape` and
ConvGrad's other attributes: dW's rows need dY's channels m0..m1 and all of X, not W's values.
Computed by ConvGrad's own kernel with only dW requested, on a zero-strided stand-in for W that is
never read (as ConvGradInput's for X).
"""

from __future__ import annotations

from onnxplan.ir.tensor import TensorSpec
from onnxplan.kernels.conv_grad import conv_grad, conv_grad_scratch
from onnxplan.kernels.registry import KernelContext, kernel

__all__ = ["conv_grad_weight", "piece_rows"]


def _scratch(node, in_specs, out_specs) -> int:
    dy, x = in_specs[0], in_specs[1]
    return conv_grad_scratch(node, [dy, x, TensorSpec(dy.dtype, tuple(int(d) for d in node.attrs["w_shape"]))],
                             [None, out_specs[0]])


@kernel("ConvGradWeight", "onnxplan", scratch=_scratch)
def conv_grad_weight(ctx: KernelContext, inputs, outputs) -> None:
    """dW of ConvGrad(dY, X, W) for W of shape w_shape."""
    xp, dy, x = ctx.xp, inputs[0], inputs[1]
    w = xp.broadcast_to(xp.zeros((), dtype=dy.dtype), tuple(int(d) for d in ctx.attrs["w_shape"]))
    conv_grad(ctx, [dy, x, w], [None, outputs[0]])


@kernel("PieceRows", "onnxplan")
def piece_rows(ctx: KernelContext, inputs, outputs) -> None:
    """outputs[0] = inputs[0][start:stop] along `axis` (0 unless given)."""
    axis = int(ctx.attrs.get("axis", 0))
    at = (slice(None),) * axis + (slice(int(ctx.attrs["start"]), int(ctx.attrs["stop"])),)
    ctx.xp.copyto(outputs[0], inputs[0][at])
