"""The less common elementwise ops and activations (trigonometric and bitwise ops, BitShift, Mod,
IsInf, the parameterised activations, PRelu, LeakyReluGrad, ORT's BiasGelu family, Gelu-20): the
plain ufunc, activation and Gelu helpers of elementwise.py applied to more ops."""

from __future__ import annotations

import numpy as np

from onnxplan.kernels import _xp
from onnxplan.kernels.elementwise import (
    BINARY,
    UNARY,
    _binary,
    _fast_gelu_block,
    _fast_gelu_grad_block,
    _gelu_block,
    _gelu_grad_block,
    _step_ran,
    _unary,
    gelu_step,
)
from onnxplan.kernels.registry import declare, kernel
from onnxplan.ort import MS

__all__: list[str] = []

for _op, _name in {"Acos": "arccos", "Asin": "arcsin", "Atan": "arctan", "Acosh": "arccosh",
                   "Asinh": "arcsinh", "Atanh": "arctanh", "Cosh": "cosh", "Sinh": "sinh",
                   "Tan": "tan", "BitwiseNot": "invert"}.items():
    declare(_op, fn=_unary(_name), overwrites=UNARY)
for _op, _name in {"BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or",
                   "BitwiseXor": "bitwise_xor"}.items():
    declare(_op, fn=_binary(_name), overwrites=BINARY)


@kernel("BitShift", overwrites=BINARY)
def bit_shift(ctx, inputs, outputs):
    right = _xp.attr_str(ctx.attrs.get("direction"), "RIGHT") == "RIGHT"
    (ctx.xp.right_shift if right else ctx.xp.left_shift)(inputs[0], inputs[1], out=outputs[0])


@kernel("Mod", overwrites=BINARY)
def mod(ctx, inputs, outputs):
    """fmod=1: the sign of the dividend (C fmod); fmod=0 (integers): the sign of the divisor."""
    xp = ctx.xp
    (xp.fmod if int(ctx.attrs.get("fmod", 0)) else xp.mod)(inputs[0], inputs[1], out=outputs[0])


@kernel("IsInf")
def is_inf(ctx, inputs, outputs):
    xp, x, out = ctx.xp, inputs[0], outputs[0]
    pos, neg = int(ctx.attrs.get("detect_positive", 1)), int(ctx.attrs.get("detect_negative", 1))
    if pos and neg:
        xp.isinf(x, out=out)
    elif pos or neg:
        inf = np.inf if pos else -np.inf
        xp.equal(x, x.dtype.type(inf), out=out)
    else:
        out.fill(False)


def _act(block_of):
    """A blockwise activation: block_of(xp, attrs, x) returns the block's result (a temporary)."""
    def fn(ctx, inputs, outputs):
        xp, attrs = ctx.xp, ctx.attrs

        def block(o, x):
            with _xp.quiet(xp):
                xp.copyto(o, block_of(xp, attrs, x), casting="unsafe")

        _xp.blockwise(xp, block, outputs[0], inputs[0])

    return fn


def _f(attrs, name: str, default: float, x):
    return x.dtype.type(float(attrs.get(name, default)))


def _hard_sigmoid(xp, attrs, x):
    y = x * _f(attrs, "alpha", 0.2, x)
    y += _f(attrs, "beta", 0.5, x)
    return xp.clip(y, 0, 1, out=y)


def _hard_swish(xp, attrs, x):
    y = x * x.dtype.type(1.0 / 6.0)
    y += x.dtype.type(0.5)
    xp.clip(y, 0, 1, out=y)
    return xp.multiply(y, x, out=y)


def _softplus(xp, attrs, x):
    """log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|))."""
    y = xp.abs(x)
    xp.negative(y, out=y)
    xp.exp(y, out=y)
    xp.log1p(y, out=y)
    y += xp.maximum(x, 0)
    return y


def _softsign(xp, attrs, x):
    y = xp.abs(x)
    y += 1
    return xp.divide(x, y, out=y)


def _elu(xp, attrs, x):
    alpha = _f(attrs, "alpha", 1.0, x)
    return xp.where(x < 0, alpha * xp.expm1(x), x)


def _selu(xp, attrs, x):
    alpha = _f(attrs, "alpha", 1.67326319217681884765625, x)
    gamma = _f(attrs, "gamma", 1.05070102214813232421875, x)
    return gamma * xp.where(x <= 0, alpha * xp.expm1(x), x)


def _celu(xp, attrs, x):
    alpha = _f(attrs, "alpha", 1.0, x)
    return xp.maximum(x, 0) + xp.minimum(0, alpha * xp.expm1(x / alpha))


def _thresholded_relu(xp, attrs, x):
    return xp.where(x > _f(attrs, "alpha", 1.0, x), x, 0)


def _shrink(xp, attrs, x):
    lambd, bias = _f(attrs, "lambd", 0.5, x), _f(attrs, "bias", 0.0, x)
    return xp.where(x < -lambd, x + bias, xp.where(x > lambd, x - bias, 0))


def _mish(xp, attrs, x):
    y = _softplus(xp, attrs, x)
    xp.tanh(y, out=y)
    return xp.multiply(y, x, out=y)


for _op, _block in {"HardSigmoid": _hard_sigmoid, "HardSwish": _hard_swish, "Softplus": _softplus,
                    "Softsign": _softsign, "Elu": _elu, "Selu": _selu, "Celu": _celu,
                    "ThresholdedRelu": _thresholded_relu, "Shrink": _shrink, "Mish": _mish}.items():
    declare(_op, fn=_act(_block), overwrites=UNARY)


@kernel("PRelu", overwrites={0: (0,)})
def prelu(ctx, inputs, outputs):
    """Y = X where X >= 0 else slope X (slope broadcasts to X)."""
    xp = ctx.xp
    _xp.blockwise(xp, lambda o, x, s: xp.copyto(o, xp.where(x < 0, x * s, x)), outputs[0], *inputs[:2])


@kernel("LeakyReluGrad", MS, overwrites=BINARY)
def leaky_relu_grad(ctx, inputs, outputs):
    """dX = dY where Y > 0 else alpha dY (Y: the LeakyRelu output)."""
    xp, alpha = ctx.xp, float(ctx.attrs.get("alpha", 0.01))

    def block(o, dy, y):
        xp.copyto(o, xp.where(y > 0, dy, dy * dy.dtype.type(alpha)))

    _xp.blockwise(xp, block, outputs[0], *inputs[:2])


_GELU, _GELU_20 = gelu_step("none"), gelu_step(None)


@kernel("BiasGelu", MS, overwrites=UNARY, bind=_GELU)
def bias_gelu(ctx, inputs, outputs):
    """Y = Gelu(X + bias)."""
    xp = ctx.xp
    if _step_ran(_GELU, ctx, inputs, outputs):
        return
    _xp.blockwise(xp, lambda o, x, b: _gelu_block(xp, o, x + b), outputs[0], *inputs[:2])


@kernel("BiasGeluGrad_dX", MS, overwrites=BINARY)
def bias_gelu_grad(ctx, inputs, outputs):
    """dX = GeluGrad(dY, X + bias)."""
    xp = ctx.xp
    _xp.blockwise(xp, lambda o, dy, x, b: _gelu_grad_block(xp, o, dy, x + b), outputs[0], *inputs[:3])


@kernel("BiasFastGeluGrad_dX", MS, overwrites=BINARY)
def bias_fast_gelu_grad(ctx, inputs, outputs):
    """dX = FastGeluGrad(dY, X + bias)."""
    xp = ctx.xp
    _xp.blockwise(xp, lambda o, dy, x, b: _fast_gelu_grad_block(xp, o, dy, x + b), outputs[0], *inputs[:3])


@kernel("Gelu", since=20, overwrites=UNARY, bind=_GELU_20)
def gelu_onnx(ctx, inputs, outputs):
    """ONNX's Gelu (opset 20): exact (approximate="none") or the tanh approximation ("tanh")."""
    xp = ctx.xp
    approximate = _xp.attr_str(ctx.attrs.get("approximate"), "none")
    if _step_ran(_GELU_20, ctx, inputs, outputs):
        return
    if approximate == "tanh":
        _xp.blockwise(xp, lambda o, x: _fast_gelu_block(xp, o, x), outputs[0], inputs[0])
    elif approximate == "none":
        _xp.blockwise(xp, lambda o, x: _gelu_block(xp, o, x), outputs[0], inputs[0])
    else:
        raise ValueError(f"{ctx.node.name}: Gelu approximate={approximate!r} is neither 'none' nor 'tanh'")
