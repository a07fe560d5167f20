"""onnxplan.ConvGradInput: the dX half of a split ConvGrad (passes/split_grad.py).

(dY, W) -> dX, with X's shape as the attribute `x_shape` and ConvGrad's other attributes: X's
values are not needed for dX = col2im(W^T @ dY), so the split node does not read X and X can die
before it runs. Computed by ConvGrad's own kernel with only dX requested, on a zero-strided
stand-in for X that is never read, so the result is ConvGrad's dX to the bit.
"""

from __future__ import annotations

from onnxplan.ir.tensor import TensorSpec
from onnxplan.kernels.conv_grad import conv_grad, conv_grad_scratch
from onnxplan.kernels.registry import KernelContext, kernel

__all__ = ["conv_grad_input"]

ONNXPLAN = "onnxplan"


def _x_spec(node, dy: TensorSpec) -> TensorSpec:
    return TensorSpec(dy.dtype, tuple(int(d) for d in node.attrs["x_shape"]))


def _scratch(node, in_specs, out_specs) -> int:
    dy, w = in_specs[0], in_specs[1]
    return conv_grad_scratch(node, [dy, _x_spec(node, dy), w], [out_specs[0]])


@kernel("ConvGradInput", ONNXPLAN, scratch=_scratch)
def conv_grad_input(ctx: KernelContext, inputs, outputs) -> None:
    """dX of ConvGrad(dY, X, W) for X of shape x_shape."""
    xp, dy, w = ctx.xp, inputs[0], inputs[1]
    x = xp.broadcast_to(xp.zeros((), dtype=dy.dtype), tuple(int(d) for d in ctx.attrs["x_shape"]))
    conv_grad(ctx, [dy, x, w], [outputs[0]])
