"""Reduction kernels: ReduceSum/Mean/Max/Min/Prod (axes as input or attribute), ReduceSumTraining."""

from __future__ import annotations

from onnxplan.kernels import _xp
from onnxplan.kernels.registry import kernel

__all__ = ["reduction_axes"]

MS = "com.microsoft"


def reduction_axes(node, inputs, rank: int) -> tuple[int, ...] | None:
    """The axes to reduce: input 1 (ReduceSum 13+, all Reduce* 18+) or the `axes` attribute;
    None means all axes; () means none (noop_with_empty_axes with no axes given)."""
    if len(inputs) > 1 and inputs[1] is not None:
        axes = _xp.host_ints(inputs[1])
    else:
        axes = [int(a) for a in node.attrs.get("axes") or []]
    if not axes:
        return () if int(node.attrs.get("noop_with_empty_axes", 0)) else None
    return tuple(sorted({_xp.norm_axis(a, rank) for a in axes}))


def _reduce(func_name: str):
    def fn(ctx, inputs, outputs):
        xp, x, out = ctx.xp, inputs[0], outputs[0]
        axes = reduction_axes(ctx.node, inputs, x.ndim)
        if axes == ():
            xp.copyto(out, x)  # noop_with_empty_axes: the input, unchanged
            return
        keepdims = bool(int(ctx.attrs.get("keepdims", 1)))
        if x.ndim == 0:
            xp.copyto(out, x)
            return
        result_shape = tuple(1 if (axes is None or i in axes) else d for i, d in enumerate(x.shape))
        target = out.reshape(result_shape) if not keepdims else out
        if func_name in ("max", "min") and _xp.is_cupy(xp):  # CuPy's CUB min/max path rejects out=
            xp.copyto(target, getattr(xp, func_name)(x, axis=axes, keepdims=True))
            return
        getattr(xp, func_name)(x, axis=axes, keepdims=True, out=target)

    return fn


for _op, _func in {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
                   "ReduceProd": "prod"}.items():
    kernel(_op)(_reduce(_func))
kernel("ReduceSumTraining", MS)(_reduce("sum"))
