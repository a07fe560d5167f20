"""Elementwise kernels: arithmetic, comparison, activations and their gradients, Scale, Where."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from onnxplan.kernels import _torch, _xp, gemm_calls, native, parallel
from onnxplan.kernels.registry import BindRule, KernelContext, KernelFn, call_step, declare, kernel

__all__: list[str] = []

MS = "com.microsoft"
UNARY = {0: (0,)}
BINARY = {0: (0, 1)}

SQRT1_2 = math.sqrt(0.5)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)  # ORT's GeluGrad kAlpha: M_2_SQRTPI * M_SQRT1_2 * 0.5
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)  # FastGelu's kAlpha
GELU_GAMMA = 0.044715


# A kernel's torch branch, written once: a TorchStep(ctx, inputs, outputs) returns, when torch can
# take the node's arrays (output 0 and the inputs it names), the call with its zero-copy tensors
# and aten op resolved (the GELU's, ReLU's and their gradients': their fused loop first,
# native_activation), else None.
# It is the kernel's bind rule (made once), and the plain kernel makes it and calls it at once
# (_step_ran), falling back to numpy when it gives None.
TorchStep = Callable[[KernelContext, list, list], "KernelFn | None"]


def _torch_by_ranges(xp: Any, arrays: list, passes: int, call: Callable[..., Any]) -> KernelFn:
    """A node's step running call(*flat tensors of `arrays`' range) over ranges of their
    elements across the compute threads (_torch.flat_parts: cut where the operator's vector
    loop would be, every element computed as in one call: the same bits); arrays[0] is the
    output, all of its shape and C-contiguous (_torch.usable)."""
    flats = [_torch.tensor(a.reshape(-1)) for a in arrays]
    calls = [partial(call, *(t[lo:hi] for t in flats)) for lo, hi in _torch.flat_parts(xp, arrays[0].size, passes)]
    if len(calls) == 1:
        one = calls[0]
        return lambda ctx, inputs, outputs: one()
    return lambda ctx, inputs, outputs: parallel.run(calls)


# Passes per element (kernels.parallel.parts_for) of the torch operators cut by ranges: a GELU
# or its gradient (erf, exp) weighs as several ufunc passes, ReLU's gradient as one.
GELU_PASSES = 4
SILU_PASSES = 3  # SiLU and its gradient: an exp and a division


def _step_ran(step: TorchStep, ctx: KernelContext, inputs: list, outputs: list) -> bool:
    """Run `step`'s call (torch's operator or a fused loop) on these arrays; False (nothing done)
    when neither can take them."""
    call = step(ctx, inputs, outputs)
    if call is None:
        return False
    call(ctx, inputs, outputs)
    return True


# ---- plain ufuncs -----------------------------------------------------------------------------
def _unary(ufunc_name: str):
    def fn(ctx, inputs, outputs):
        parallel.ufunc(ctx.xp, ufunc_name, outputs[0], inputs[0])

    return fn


for _op, _name in {"Neg": "negative", "Sqrt": "sqrt", "Exp": "exp", "Log": "log", "Tanh": "tanh",
                   "Abs": "absolute", "Reciprocal": "reciprocal", "Floor": "floor", "Ceil": "ceil",
                   "Sin": "sin", "Cos": "cos", "Sign": "sign", "Round": "rint", "Not": "logical_not"}.items():
    declare(_op, fn=_unary(_name), overwrites=UNARY)
declare("IsNaN", fn=_unary("isnan"))  # bool output: never in the float input's place


def _binary(ufunc_name: str):
    def fn(ctx, inputs, outputs):
        parallel.ufunc(ctx.xp, ufunc_name, outputs[0], inputs[0], inputs[1])

    return fn


for _op, _name in {"Add": "add", "Sub": "subtract", "Mul": "multiply"}.items():
    declare(_op, fn=_binary(_name), overwrites=BINARY)
for _op, _name in {"Equal": "equal", "Less": "less", "Greater": "greater", "LessOrEqual": "less_equal",
                   "GreaterOrEqual": "greater_equal", "And": "logical_and", "Or": "logical_or",
                   "Xor": "logical_xor"}.items():
    declare(_op, fn=_binary(_name))


def _trunc_divide_block(xp, out, a, b) -> None:
    q = xp.floor_divide(a, b)
    r = a - q * b
    q += (r != 0) & ((a < 0) != (b < 0))  # floor -> toward zero, as C++ integer division
    xp.copyto(out, q, casting="unsafe")


@kernel("Div", overwrites=BINARY)
def div(ctx, inputs, outputs):
    xp, (a, b), out = ctx.xp, inputs, outputs[0]
    if np.dtype(out.dtype).kind in "iu":
        _xp.blockwise(xp, lambda o, x, y: _trunc_divide_block(xp, o, x, y), out, a, b)
    else:
        xp.divide(a, b, out=out)


@kernel("Pow", overwrites=BINARY)
def pow_(ctx, inputs, outputs):
    """Y = X ** E; an integer base with a float exponent truncates, as ORT's cast back to T."""
    parallel.ufunc(ctx.xp, "power", outputs[0], inputs[0], inputs[1], casting="unsafe")


def _variadic_order(xs: list, out, name: str) -> list:
    """The inputs in the order they are applied: any that shares the output's memory first (it
    must be read before anything is written)."""
    shared = [x for x in xs if x.shape == out.shape and _xp.same_buffer(x, out)]
    if len(shared) > 2:
        raise RuntimeError(f"{name}: output shares memory with {len(shared)} inputs")
    return shared + [x for x in xs if not any(x is s for s in shared)]


def _variadic_apply(xp, ufunc, xs: list, out, mean: bool) -> None:
    if len(xs) == 1:
        xp.copyto(out, xs[0])
        return
    ufunc(xs[0], xs[1], out=out)
    for x in xs[2:]:
        ufunc(out, x, out=out)
    if mean:
        xp.divide(out, len(xs), out=out, casting="unsafe")


def _variadic(ufunc_name: str, mean: bool = False) -> tuple[KernelFn, BindRule]:
    """The kernel of Sum/Max/Min/Mean and its bind rule."""

    def fn(ctx, inputs, outputs):
        xs = _variadic_order([x for x in inputs if x is not None], outputs[0], ctx.node.name)
        _variadic_apply(ctx.xp, getattr(ctx.xp, ufunc_name), xs, outputs[0], mean)

    def bind(ctx, inputs, outputs):
        """The order (the memory-sharing test) made once."""
        if ctx.xp is not np:
            return None
        out, ufunc = outputs[0], getattr(np, ufunc_name)
        try:
            xs = _variadic_order([x for x in inputs if x is not None], out, ctx.node.name)
        except RuntimeError:
            return None  # the plain kernel raises it when called
        return lambda ctx, inputs, outputs: _variadic_apply(np, ufunc, xs, out, mean)

    return fn, bind


for _op, (_fn, _bind) in {"Sum": _variadic("add"), "Max": _variadic("maximum"), "Min": _variadic("minimum"),
                          "Mean": _variadic("add", mean=True)}.items():
    declare(_op, fn=_fn, overwrites=BINARY, bind=_bind)


@kernel("Where")
def where(ctx, inputs, outputs):
    cond, x, y = inputs
    ctx.xp.copyto(outputs[0], y)
    ctx.xp.copyto(outputs[0], x, where=cond)


# ---- activations -------------------------------------------------------------------------------
def _native_relu(ctx: KernelContext, inputs: list, outputs: list) -> KernelFn | None:
    return call_step(native_activation(ctx.xp, "relu", outputs[0], inputs[0]))


@kernel("Relu", overwrites=UNARY, bind=_native_relu)
def relu(ctx, inputs, outputs):
    """max(X, 0): float32 by the fused loop (native_activation; X where X is NaN or -0, as ONNX
    Runtime's), else numpy's maximum cut into pieces of rows across the compute threads when
    large (NaN stays NaN)."""
    if _step_ran(_native_relu, ctx, inputs, outputs):
        return
    parallel.ufunc(ctx.xp, "maximum", outputs[0], inputs[0], inputs[0].dtype.type(0))


@kernel("Sigmoid", overwrites=UNARY)
def sigmoid(ctx, inputs, outputs):
    xp, out = ctx.xp, outputs[0]
    with _xp.quiet(xp):  # exp(-x) overflows to inf for x < -88: 1 / inf = 0, as it should
        xp.negative(inputs[0], out=out)
        xp.exp(out, out=out)
        xp.add(out, 1, out=out)
        xp.reciprocal(out, out=out)


def _torch_erf(ctx: KernelContext, inputs: list, outputs: list) -> KernelFn | None:
    if not _torch.usable(ctx.xp, outputs[0], inputs[0]):
        return None
    op, tx, to = _torch.aten().erf.out, _torch.tensor(inputs[0]), _torch.tensor(outputs[0])
    return lambda ctx, inputs, outputs: op(tx, out=to)


@kernel("Erf", overwrites=UNARY, bind=_torch_erf)
def erf(ctx, inputs, outputs):
    if _step_ran(_torch_erf, ctx, inputs, outputs):
        return
    _xp.erf(ctx.xp, inputs[0], outputs[0])


@kernel("LeakyRelu", overwrites=UNARY)
def leaky_relu(ctx, inputs, outputs):
    xp, alpha = ctx.xp, float(ctx.attrs.get("alpha", 0.01))

    def block(o, x):
        xp.copyto(o, xp.where(x < 0, x * x.dtype.type(alpha), x))

    _xp.blockwise(xp, block, outputs[0], inputs[0])


def _clip(xp: Any, x: Any, out: Any, lo: Any, hi: Any) -> None:
    if lo is None and hi is None:
        xp.copyto(out, x)
        return
    xp.clip(x, lo, hi, out=out)


def _bind_clip(ctx: KernelContext, inputs: list, outputs: list) -> KernelFn | None:
    """The bound inputs read through flat views made once, then _clip."""
    if ctx.xp is not np:
        return None
    x, out = inputs[0], outputs[0]
    lo_in, hi_in = _xp.flat_input(inputs, 1), _xp.flat_input(inputs, 2)
    lo_attr, hi_attr = ctx.attrs.get("min"), ctx.attrs.get("max")

    def run(ctx: KernelContext, inputs: list, outputs: list) -> None:
        lo = lo_in[0].item() if lo_in is not None else lo_attr
        hi = hi_in[0].item() if hi_in is not None else hi_attr
        _clip(np, x, out, lo, hi)

    return run


@kernel("Clip", overwrites=UNARY, bind=_bind_clip)
def clip(ctx, inputs, outputs):
    """Bounds from inputs 1 and 2 (opset 11+) or the min/max attributes (opset 6)."""
    lo = _xp.host_scalar(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else ctx.attrs.get("min")
    hi = _xp.host_scalar(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else ctx.attrs.get("max")
    _clip(ctx.xp, inputs[0], outputs[0], lo, hi)


def _gelu_block(xp, o, x) -> None:
    t = x * x.dtype.type(SQRT1_2)
    _xp.erf(xp, t, t)
    t += 1
    t *= x
    t *= 0.5
    xp.copyto(o, t)


def native_activation(xp: Any, name: str, out: Any, x: Any, dy: Any = None) -> Callable[[], Any] | None:
    """out = the activation `name` of x ("gelu": the exact GELU, erf as torch's vectorised erf
    computes it; "relu": ONNX Runtime's select), or with `dy` its gradient dY (the GELU's
    Phi(X) + X phi(X), ReLU's dY where X > 0), by the fused loop (native.activation) over ranges
    of the elements on the GEMM pool from gemm_calls.POOLED_MIN_ELEMS a piece (no interpreter
    lock, where torch's operators were cut across the Python workers; whole with
    ONNXPLAN_SPLIT_KERNELS=0); every element computed alone, so the same bits at any cut. None
    where it does not apply (not host float32 of one shape, not contiguous, out overlapping an
    input other than in place, no compiled library): torch's or numpy's path then."""
    arrays = [out, x] + ([dy] if dy is not None else [])
    if xp is not np or any(a.dtype != np.float32 or a.shape != out.shape or not a.flags.c_contiguous for a in arrays):
        return None
    py = out.ctypes.data
    if any(a.ctypes.data != py and np.may_share_memory(a, out) for a in arrays[1:]):
        return None
    fn = native.activation(name, grad=dy is not None)
    if fn is None:
        return None
    first, last = (x.ctypes.data, 0) if dy is None else (dy.ctypes.data, x.ctypes.data)  # NAME_f32's, NAME_grad_f32's
    return gemm_calls.rows_job(fn, first, py, out.size, last, out.size)


def gelu_step(approximate: str | None) -> TorchStep:
    """Y = gelu(X), or with a bias input gelu(X + bias) (X + bias written into Y first, Y may be
    X, then the GELU in place); approximate None: the node's attribute (ONNX Gelu-20). The exact
    GELU by the fused loop (native_activation) where it applies, else (and the tanh form) torch's gelu."""
    def step(ctx: KernelContext, inputs: list, outputs: list) -> KernelFn | None:
        appr = approximate or _xp.attr_str(ctx.attrs.get("approximate"), "none")
        x, out = inputs[0], outputs[0]
        bias = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
        fused = native_activation(ctx.xp, "gelu", out, x if bias is None else out) if appr == "none" else None
        if fused is None:
            if appr not in ("none", "tanh") or not _torch.usable(ctx.xp, out, x):
                return None
            op, to = _torch.aten().gelu.out, _torch.tensor(out)
            if bias is None:
                return _torch_by_ranges(ctx.xp, [out, x], GELU_PASSES,
                                        lambda to_, tx_: op(tx_, approximate=appr, out=to_))
            fused = partial(op, to, approximate=appr, out=to)
        if bias is None:
            return call_step(fused)
        gelu_in_place = fused

        def run(ctx: KernelContext, inputs: list, outputs: list) -> None:
            np.add(x, bias, out=out)
            gelu_in_place()

        return run

    return step


_GELU, _FAST_GELU = gelu_step("none"), gelu_step("tanh")


@kernel("Gelu", MS, overwrites=UNARY, bind=_GELU)
def gelu(ctx, inputs, outputs):
    """Y = 0.5 X (1 + erf(X / sqrt 2)), the exact GELU."""
    if _step_ran(_GELU, ctx, inputs, outputs):
        return
    _xp.blockwise(ctx.xp, lambda o, x: _gelu_block(ctx.xp, o, x), outputs[0], inputs[0])


def _fast_gelu_block(xp, o, x, bias=None) -> None:
    u = x + bias if bias is not None else x.copy()
    t = u * u
    t *= u.dtype.type(GELU_GAMMA * SQRT_2_OVER_PI)
    t += u.dtype.type(SQRT_2_OVER_PI)
    t *= u
    xp.tanh(t, out=t)
    t *= 0.5
    t += 0.5
    xp.multiply(u, t, out=o)


@kernel("FastGelu", MS, overwrites=UNARY, bind=_FAST_GELU)
def fast_gelu(ctx, inputs, outputs):
    """Y = 0.5 U (1 + tanh(sqrt(2/pi) (U + 0.044715 U^3))), U = X (+ bias)."""
    xp = ctx.xp
    ins = [inputs[0]] + ([inputs[1]] if len(inputs) > 1 and inputs[1] is not None else [])
    if _step_ran(_FAST_GELU, ctx, inputs, outputs):
        return
    _xp.blockwise(xp, lambda o, *v: _fast_gelu_block(xp, o, *v), outputs[0], *ins)


def _sigmoid_of(xp, z):
    with _xp.quiet(xp):
        s = xp.exp(-z)
        s += 1
        return xp.reciprocal(s, out=s)


def _silu_alpha(ctx) -> bool:
    """QuickGelu with alpha 1 is SiLU (what ORT fuses x * sigmoid(x) into): torch's silu serves."""
    return float(ctx.attrs.get("alpha", 1.702)) == 1.0


def _torch_quick_gelu(ctx: KernelContext, inputs: list, outputs: list) -> KernelFn | None:
    if not (_silu_alpha(ctx) and _torch.usable(ctx.xp, outputs[0], inputs[0])):
        return None
    op = _torch.aten().silu.out
    return _torch_by_ranges(ctx.xp, [outputs[0], inputs[0]], SILU_PASSES, lambda to, tx: op(tx, out=to))


@kernel("QuickGelu", MS, overwrites=UNARY, bind=_torch_quick_gelu)
def quick_gelu(ctx, inputs, outputs):
    """Y = X sigmoid(alpha X); alpha 1 (SiLU) by torch's silu when it can take the arrays."""
    xp, alpha = ctx.xp, float(ctx.attrs.get("alpha", 1.702))
    if _step_ran(_torch_quick_gelu, ctx, inputs, outputs):
        return

    def block(o, x):
        s = _sigmoid_of(xp, x * x.dtype.type(alpha))
        xp.multiply(x, s, out=o)

    _xp.blockwise(xp, block, outputs[0], inputs[0])


def _relu_grad_step(ctx: KernelContext, inputs: list, outputs: list) -> KernelFn | None:
    fused = native_activation(ctx.xp, "relu", outputs[0], inputs[1], inputs[0])
    if fused is not None:
        return call_step(fused)
    if not _torch.usable(ctx.xp, outputs[0], *inputs[:2]):
        return None
    op = _torch.aten().threshold_backward.grad_input
    return _torch_by_ranges(ctx.xp, [outputs[0], inputs[0], inputs[1]], 1,
                            lambda to, tdy, tx: op(tdy, tx, 0, grad_input=to))


@kernel("ReluGrad", MS, overwrites=BINARY, bind=_relu_grad_step)
def relu_grad(ctx, inputs, outputs):
    """dX = dY where X > 0 else 0 (X: the Relu input or output; both are > 0 at the same places):
    float32 by the fused loop (native_activation; 0 where X is NaN, as ONNX Runtime's), else
    torch's threshold_backward (dY where X is NaN) or numpy's."""
    xp = ctx.xp
    if _step_ran(_relu_grad_step, ctx, inputs, outputs):
        return
    _xp.blockwise(xp, lambda o, dy, x: xp.copyto(o, xp.where(x > 0, dy, 0)), outputs[0], *inputs[:2])


@kernel("SigmoidGrad", MS, overwrites=BINARY)
def sigmoid_grad(ctx, inputs, outputs):
    """dX = dY Y (1 - Y), Y the Sigmoid output."""
    xp = ctx.xp
    _xp.blockwise(xp, lambda o, dy, y: xp.multiply(dy * y, 1 - y, out=o), outputs[0], *inputs[:2])


@kernel("TanhGrad", MS, overwrites=BINARY)
def tanh_grad(ctx, inputs, outputs):
    """dX = dY (1 - Y^2), Y the Tanh output."""
    xp = ctx.xp
    _xp.blockwise(xp, lambda o, dy, y: xp.multiply(dy, 1 - y * y, out=o), outputs[0], *inputs[:2])


def _gelu_grad_block(xp, o, dy, x) -> None:
    cdf = x * x.dtype.type(SQRT1_2)
    _xp.erf(xp, cdf, cdf)
    cdf += 1
    cdf *= 0.5
    pdf = x * x
    pdf *= -0.5
    xp.exp(pdf, out=pdf)
    pdf *= x
    pdf *= x.dtype.type(INV_SQRT_2PI)
    cdf += pdf
    xp.multiply(dy, cdf, out=o)


def gelu_grad_step(approximate: str) -> TorchStep:
    """dX from (dY, X) (`approximate`: "none" or "tanh"): the exact form's fused loop
    (native_activation) where it applies, else torch's gelu_backward."""
    def step(ctx: KernelContext, inputs: list, outputs: list) -> KernelFn | None:
        fused = native_activation(ctx.xp, "gelu", outputs[0], inputs[1], inputs[0]) if approximate == "none" else None
        if fused is not None:
            return call_step(fused)
        if not _torch.usable(ctx.xp, outputs[0], inputs[0], inputs[1]):
            return None
        op = _torch.aten().gelu_backward.grad_input
        return _torch_by_ranges(ctx.xp, [outputs[0], inputs[0], inputs[1]], GELU_PASSES,
                                lambda to, tdy, tx: op(tdy, tx, approximate=approximate, grad_input=to))
    return step


_GELU_GRAD, _FAST_GELU_GRAD = gelu_grad_step("none"), gelu_grad_step("tanh")


@kernel("GeluGrad", MS, overwrites=BINARY, bind=_GELU_GRAD)
def gelu_grad(ctx, inputs, outputs):
    """dX = dY (Phi(X) + X phi(X)), Phi/phi the normal cdf/pdf (X: the Gelu input)."""
    xp = ctx.xp
    if _step_ran(_GELU_GRAD, ctx, inputs, outputs):
        return
    _xp.blockwise(xp, lambda o, dy, x: _gelu_grad_block(xp, o, dy, x), outputs[0], *inputs[:2])


def _fast_gelu_grad_block(xp, o, dy, x) -> None:
    # ORT's constants, each rounded to float32 as its C++ code does
    f = np.float32
    alpha, gamma = f(SQRT_2_OVER_PI), f(GELU_GAMMA)
    alpha_gamma, beta = alpha * gamma, gamma * alpha * f(3.0)
    x3 = x * x
    x3 *= x
    th = x * alpha
    th += alpha_gamma * x3
    xp.tanh(th, out=th)
    sech2 = 1 - th * th
    slope = x * alpha
    slope += beta * x3
    sech2 *= slope
    th += sech2
    th += 1
    th *= 0.5
    xp.multiply(dy, th, out=o)


@kernel("FastGeluGrad", MS, overwrites=BINARY, bind=_FAST_GELU_GRAD)
def fast_gelu_grad(ctx, inputs, outputs):
    """The derivative of the tanh-approximated GELU, times dY (ORT's formula; torch's
    gelu_backward(approximate="tanh"), the same formula, when it can take the arrays)."""
    xp = ctx.xp
    if _step_ran(_FAST_GELU_GRAD, ctx, inputs, outputs):
        return
    _xp.blockwise(xp, lambda o, dy, x: _fast_gelu_grad_block(xp, o, dy, x), outputs[0], *inputs[:2])


def _torch_quick_gelu_grad(ctx: KernelContext, inputs: list, outputs: list) -> KernelFn | None:
    if not (_silu_alpha(ctx) and _torch.usable(ctx.xp, outputs[0], inputs[0], inputs[1])):
        return None
    op = _torch.aten().silu_backward.grad_input
    return _torch_by_ranges(ctx.xp, [outputs[0], inputs[0], inputs[1]], SILU_PASSES,
                            lambda to, tdy, tx: op(tdy, tx, grad_input=to))


@kernel("QuickGeluGrad", MS, overwrites=BINARY, bind=_torch_quick_gelu_grad)
def quick_gelu_grad(ctx, inputs, outputs):
    """dX = dY s (1 + alpha X (1 - s)), s = sigmoid(alpha X); alpha 1 by torch's silu_backward
    (the same formula) when it can take the arrays."""
    xp, alpha = ctx.xp, float(ctx.attrs.get("alpha", 1.702))
    if _step_ran(_torch_quick_gelu_grad, ctx, inputs, outputs):
        return

    def block(o, dy, x):
        ax = x * x.dtype.type(alpha)
        s = _sigmoid_of(xp, ax)
        ax *= 1 - s
        ax += 1
        ax *= s
        xp.multiply(dy, ax, out=o)

    _xp.blockwise(xp, block, outputs[0], *inputs[:2])


def _scale(ctx: KernelContext, xp: Any, x: Any, out: Any, value: Any, down: bool) -> None:
    """out = x * s, or (down) x * (1/s), s = value in float32: ORT takes the reciprocal in float32."""
    s = np.float32(value)
    if s == 0:
        raise ValueError(f"{ctx.node.name}: Scale value must not be 0")
    xp.multiply(x, np.dtype(out.dtype).type(np.float32(1.0) / s if down else s), out=out)


def _bind_scale(ctx: KernelContext, inputs: list, outputs: list) -> KernelFn | None:
    """The scale input read through a flat view made once, then _scale."""
    if ctx.xp is not np:
        return None
    x, out, s_in = inputs[0], outputs[0], inputs[1].reshape(-1)
    down = bool(int(ctx.attrs.get("scale_down", 0)))

    def run(ctx: KernelContext, inputs: list, outputs: list) -> None:
        _scale(ctx, np, x, out, s_in[0].item(), down)

    return run


@kernel("Scale", MS, overwrites=UNARY, bind=_bind_scale)
def scale(ctx, inputs, outputs):
    """Y = X * s, or with scale_down X * (1/s): ORT takes the reciprocal in float32 and multiplies."""
    _scale(ctx, ctx.xp, inputs[0], outputs[0], _xp.host_scalar(inputs[1]), bool(int(ctx.attrs.get("scale_down", 0))))
