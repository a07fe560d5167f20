"""Reduction kernels: ReduceSum/Mean/Max/Min/Prod (axes as input or attribute), ReduceSumTraining."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxplan.kernels import _xp
from onnxplan.kernels.registry import BindRule, KernelFn, kernel

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


def _extreme(dtype, low: bool):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return -np.inf if low else np.inf
    if dtype.kind == "b":
        return not low
    info = np.iinfo(dtype)
    return info.min if low else info.max


_EMPTY = {"sum": lambda d: 0, "prod": lambda d: 1, "mean": lambda d: np.nan,
          "max": lambda d: _extreme(d, True), "min": lambda d: _extreme(d, False)}


def _target(x: Any, out: Any, axes: tuple[int, ...] | None, keepdims: bool) -> Any:
    """`out` in the shape of x reduced over `axes` with keepdims (a view; None: every axis)."""
    if keepdims:
        return out
    return out.reshape(tuple(1 if (axes is None or i in axes) else d for i, d in enumerate(x.shape)))


def _reduce(func_name: str) -> tuple[KernelFn, BindRule]:
    """The kernel of a Reduce op and its bind rule."""

    def fn(ctx, inputs, outputs):
        xp, x, out = ctx.xp, inputs[0], outputs[0]
        axes = reduction_axes(ctx.node, inputs, x.ndim)
        if axes == ():
            xp.copyto(out, x)  # noop_with_empty_axes: the input, unchanged
            return
        keepdims = bool(int(ctx.attrs.get("keepdims", 1)))
        if x.size == 0:  # the reduction's identity (the mean of nothing: NaN)
            out.fill(_EMPTY[func_name](out.dtype))
            return
        if x.ndim == 0:
            xp.copyto(out, x)
            return
        target = _target(x, out, axes, keepdims)
        if func_name in ("max", "min") and _xp.is_cupy(xp):  # CuPy's CUB min/max path rejects out=
            xp.copyto(target, getattr(xp, func_name)(x, axis=axes, keepdims=True))
            return
        getattr(xp, func_name)(x, axis=axes, keepdims=True, out=target)

    def bind(ctx, inputs, outputs):
        """Axes, keepdims and the target view made once per axes value (an axes input is a
        constant, loaded after binding: read at the first call, its bytes checked each step);
        np.sum/max/min/prod's own ufunc reduce called directly (the same C path)."""
        x, out = inputs[0], outputs[0]
        if ctx.xp is not np or x.size == 0 or x.ndim == 0:
            return None
        reduce = _UFUNC_REDUCE.get(func_name) or getattr(np, func_name)
        keepdims = bool(int(ctx.attrs.get("keepdims", 1)))
        axes_input = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
        made: dict = {}

        def run(ctx, inputs, outputs):
            key = axes_input.tobytes() if axes_input is not None else None
            plan = made.get(key)
            if plan is None:
                axes = reduction_axes(ctx.node, inputs, x.ndim)
                plan = made[key] = (axes, _target(x, out, axes, keepdims))
            axes, target = plan
            if axes == ():
                np.copyto(out, x)
            else:
                reduce(x, axis=axes, keepdims=True, out=target)

        return run

    return fn, bind


_UFUNC_REDUCE = {"sum": np.add.reduce, "prod": np.multiply.reduce, "max": np.maximum.reduce,
                 "min": np.minimum.reduce}
for _op, _func in {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
                   "ReduceProd": "prod"}.items():
    _fn, _bind = _reduce(_func)
    kernel(_op, bind=_bind)(_fn)
_fn, _bind = _reduce("sum")
kernel("ReduceSumTraining", MS, bind=_bind)(_fn)


def _reduce_via(block_fn, func_name: str):
    """Reduce* ops that transform X before summing (ReduceSumSquare, ReduceL1...) and/or the sum after
    (ReduceL2, ReduceLogSum...): block_fn(xp, x) makes the summed terms blockwise, into the output."""

    def fn(ctx, inputs, outputs):
        xp, x, out = ctx.xp, inputs[0], outputs[0]
        axes = reduction_axes(ctx.node, inputs, x.ndim)
        if axes == ():
            _xp.blockwise(xp, lambda o, v: xp.copyto(o, _finish(xp, func_name, block_fn(xp, v))), out, x)
            return
        axes = tuple(range(x.ndim)) if axes is None else axes
        if x.size == 0:  # sums of nothing: 0, and their log or logsumexp: -inf
            out.fill(-np.inf if func_name in ("log", "logsumexp") else 0)
            return
        target = out.reshape(tuple(1 if i in axes else d for i, d in enumerate(x.shape)))
        if func_name == "logsumexp":
            with _xp.quiet(xp):
                xp.max(x, axis=axes, keepdims=True, out=target)
                peak = target.copy()  # output-sized
                peak[~xp.isfinite(peak)] = 0
                target[...] = 0
                _sum_blocks(xp, lambda v, p: xp.exp(v - p), x, peak, axes, target)
                xp.log(target, out=target)
                target += peak
            return
        target[...] = 0
        _sum_blocks(xp, lambda v, _: block_fn(xp, v), x, None, axes, target)
        with _xp.quiet(xp):
            xp.copyto(target, _finish(xp, func_name, target))

    return fn


def _sum_blocks(xp, terms, x, aux, axes, target) -> None:
    """target += sum over `axes` of terms(x, aux) (aux broadcast like target), one leading slice of
    x at a time so the temporaries stay small."""
    lead = next((i for i in range(x.ndim) if i not in axes), None)
    if lead is None or x.size <= _xp.block_elems(x.dtype, xp):
        target += terms(x, aux).sum(axis=axes, keepdims=True)
        return
    per = max(1, _xp.block_elems(x.dtype, xp) // max(1, x.size // x.shape[lead]))
    for s in range(0, x.shape[lead], per):
        index = (slice(None),) * lead + (slice(s, s + per),)
        part = target[index]
        part += terms(x[index], None if aux is None else aux[index]).sum(axis=axes, keepdims=True)


def _finish(xp, func_name: str, s):
    if func_name == "sqrt":
        return xp.sqrt(s)
    if func_name == "log":
        return xp.log(s)
    return s


for _op, (_terms, _after) in {"ReduceSumSquare": (lambda xp, v: v * v, ""),
                              "ReduceL1": (lambda xp, v: xp.abs(v), ""),
                              "ReduceL2": (lambda xp, v: v * v, "sqrt"),
                              "ReduceLogSum": (lambda xp, v: v, "log"),
                              "ReduceLogSumExp": (lambda xp, v: xp.exp(v), "logsumexp")}.items():
    kernel(_op)(_reduce_via(_terms, _after))


def _arg_reduce(func_name: str):
    def fn(ctx, inputs, outputs):
        """Index of the first (select_last_index: last) extreme value along axis, as int64."""
        xp, x, out = ctx.xp, inputs[0], outputs[0]
        axis = _xp.norm_axis(int(ctx.attrs.get("axis", 0)), x.ndim)
        last = bool(int(ctx.attrs.get("select_last_index", 0)))
        pre, dim, post = _xp.axis3(x.shape, axis)
        x3, out3 = x.reshape(pre, dim, post), out.reshape(pre, 1, post)
        if last:
            x3 = x3[:, ::-1]
        reduce = getattr(xp, func_name)
        # numpy copies a strided argument whole: one slab of rows and columns at a time
        rows = max(1, _xp.block_elems(x.dtype, xp) // max(1, dim * post))
        cols = post if rows > 1 else max(1, _xp.block_elems(x.dtype, xp) // max(1, dim))
        for p0 in range(0, pre, rows):
            for q0 in range(0, post, cols):
                dst = out3[p0:p0 + rows, :, q0:q0 + cols]
                reduce(x3[p0:p0 + rows, :, q0:q0 + cols], axis=1, keepdims=True, out=dst)
                if last:
                    xp.subtract(dim - 1, dst, out=dst)

    return fn


kernel("ArgMax")(_arg_reduce("argmax"))
kernel("ArgMin")(_arg_reduce("argmin"))


@kernel("CumSum")
def cum_sum(ctx, inputs, outputs):
    """Running sums along the axis input; exclusive leaves out the element itself, reverse runs
    from the end."""
    xp, x, out = ctx.xp, inputs[0], outputs[0]
    axis = _xp.norm_axis(int(_xp.host_scalar(inputs[1])), x.ndim)
    if x.shape[axis] == 0:
        return
    flip = (slice(None),) * axis + (slice(None, None, -1),)
    if int(ctx.attrs.get("reverse", 0)):
        x, out = x[flip], out[flip]
    if int(ctx.attrs.get("exclusive", 0)):
        head = (slice(None),) * axis
        out[head + (slice(0, 1),)] = 0
        x, out = x[head + (slice(0, -1),)], out[head + (slice(1, None),)]
    xp.cumsum(x, axis=axis, out=out)
