"""BatchNormalization and ONNX Runtime's training forms: BatchNormInternal (running statistics
updated in place) and BatchNormalizationGrad, each written once: prepared per call, or once when
the executor binds (registry.Prepare)."""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np

from onnxplan.kernels.norm import _ew_pass, _get, _torch_passes, rows_per_chunk
from onnxplan.kernels.registry import KernelContext, KernelFn, bind_prepared, kernel, prepared_call
from onnxplan.kernels.scratch import align
from onnxplan.ort import MS

__all__ = ["batch_norm", "batch_norm_grad"]


def _bn_dims(shape) -> tuple[int, int, int]:
    return shape[0], shape[1] if len(shape) > 1 else 1, prod(shape[2:])


def _batch_norm_scratch(node, in_specs, out_specs) -> int:
    """In training: one partial sum per (image, channel)."""
    if len([o for o in out_specs if o is not None]) <= 1:
        return 0
    x = in_specs[0]
    n, c, _ = _bn_dims(x.shape)
    return align(n * c * x.itemsize)


def _prepare_batch_norm(ctx: KernelContext, inputs: list, outputs: list, bound: bool) -> KernelFn:
    """ORT's BatchNorm: Y = X * (scale * inv_std) + (B - mean * scale * inv_std).

    Inference (one output): mean/var are the inputs, inv_std = 1 / sqrt(var + eps). Training
    (more outputs): batch mean and biased variance over (N, spatial), inv_std = sqrt(1 / (var + eps));
    running = input * momentum + batch * (1 - momentum), written in place over inputs 3/4;
    BatchNormInternal also outputs saved_mean and saved_inv_std. Views, reshapes and the
    channel-sized vectors made once (`bound`: the tensor-sized elementwise passes by torch,
    _ew_pass: the same bits).
    """
    xp = ctx.xp
    x, scale, b, mean_in, var_in = inputs[:5]
    y = outputs[0]
    n, c, s = _bn_dims(x.shape)
    t = x.dtype.type
    eps = t(np.float32(ctx.attrs.get("epsilon", 1e-5)))
    x3, y3 = x.reshape(n, c, s), y.reshape(n, c, s)
    new_scale, new_bias = xp.empty(c, x.dtype), xp.empty(c, x.dtype)
    scale3, bias3 = new_scale.reshape(1, c, 1), new_bias.reshape(1, c, 1)
    training = len([o for o in outputs if o is not None]) > 1
    use_torch = bound and _torch_passes(x)
    scale_y = _ew_pass(xp, use_torch, "multiply", x3, scale3, y3)
    shift_y = _ew_pass(xp, use_torch, "add", y3, bias3, y3)

    def affine(inv_std: Any, mean: Any) -> None:
        xp.multiply(inv_std, scale, out=new_scale)
        xp.multiply(mean, new_scale, out=new_bias)
        xp.subtract(b, new_bias, out=new_bias)
        scale_y()
        shift_y()

    if not training:
        inv = xp.empty(c, x.dtype)

        def run_inference(ctx_: KernelContext, inputs_: list, outputs_: list) -> None:
            xp.add(var_in, eps, out=inv)
            xp.sqrt(inv, out=inv)
            xp.divide(t(1), inv, out=inv)
            affine(inv, mean_in)

        return run_inference
    momentum = t(np.float32(ctx.attrs.get("momentum", 0.9)))
    keep = t(1) - momentum
    run_mean, run_var = _get(outputs, 1), _get(outputs, 2)
    mean = _get(outputs, 3) if _get(outputs, 3) is not None else xp.empty(c, x.dtype)
    inv_std = _get(outputs, 4) if _get(outputs, 4) is not None else xp.empty(c, x.dtype)
    var = inv_std
    count = t(n * s)
    per_nc = ctx.scratch_array(0, (n * c,), x.dtype)
    per_nc2, dots = per_nc.reshape(n, c), per_nc.reshape(n * c, 1, 1)
    x_rows, mean3 = x3.reshape(n * c, s), mean.reshape(1, c, 1)
    centred = y3.reshape(n * c, s)  # Y as workspace: centred x
    left, right = centred[:, None, :], centred[:, :, None]
    batch_part = xp.empty(c, x.dtype)
    centre = _ew_pass(xp, use_torch, "subtract", x3, mean3, y3)

    def run_training(ctx_: KernelContext, inputs_: list, outputs_: list) -> None:
        xp.sum(x_rows, axis=1, out=per_nc)
        xp.sum(per_nc2, axis=0, out=mean)
        xp.divide(mean, count, out=mean)
        centre()
        xp.matmul(left, right, out=dots)
        xp.sum(per_nc2, axis=0, out=var)
        xp.divide(var, count, out=var)
        if run_mean is not None:
            xp.multiply(mean, keep, out=batch_part)
            xp.multiply(mean_in, momentum, out=run_mean)
            xp.add(run_mean, batch_part, out=run_mean)
        if run_var is not None:
            xp.multiply(var, keep, out=batch_part)
            xp.multiply(var_in, momentum, out=run_var)
            xp.add(run_var, batch_part, out=run_var)
        xp.add(var, eps, out=inv_std)
        xp.divide(t(1), inv_std, out=inv_std)
        xp.sqrt(inv_std, out=inv_std)
        affine(inv_std, mean)

    return run_training


@kernel("BatchNormalization", scratch=_batch_norm_scratch, bind=bind_prepared(_prepare_batch_norm))
@kernel("BatchNormInternal", MS, overwrites={1: (3,), 2: (4,)}, updates_state=True, scratch=_batch_norm_scratch,
        bind=bind_prepared(_prepare_batch_norm))
def batch_norm(ctx: KernelContext, inputs, outputs) -> None:
    """(X, scale, B, mean, var) -> Y, then in training the running and saved statistics
    (_prepare_batch_norm)."""
    prepared_call(_prepare_batch_norm, ctx, inputs, outputs)


def _batch_norm_grad_scratch(node, in_specs, out_specs) -> int:
    """A chunk of images (fitting 8 MiB, at least one) and one partial sum per (image, channel)."""
    x = in_specs[1]
    n, c, s = _bn_dims(x.shape)
    nb = rows_per_chunk(n, c * s * x.itemsize)
    return align(nb * c * s * x.itemsize) + align(nb * c * x.itemsize)


def _prepare_batch_norm_grad(ctx: KernelContext, inputs: list, outputs: list, bound: bool) -> KernelFn:
    """ORT's BatchNormalizationGrad: dbias = sum(dY), dscale = sum((X - mean) * inv_std * dY),
    dX = scale * inv_std / (N*S) * (dY * N * S - dbias - (X - mean) * dscale * inv_std).

    Four passes over the tensor for dX after centring X into it (the per-channel factors
    folded), and one dot product per (image, channel) for dscale; the chunks' views and the
    channel-sized vectors made once (`bound`: the tensor-sized elementwise passes by torch,
    _ew_pass: the same bits).
    """
    xp = ctx.xp
    dy, x, scale, mean, inv_std = inputs[:5]
    dx, dscale, dbias = _get(outputs, 0), _get(outputs, 1), _get(outputs, 2)
    n, c, s = _bn_dims(x.shape)
    t = x.dtype.type
    ns = t(n * s)
    x3, dy3 = x.reshape(n, c, s), dy.reshape(n, c, s)
    dx3 = dx.reshape(n, c, s) if dx is not None else None
    dbias = xp.empty(c, x.dtype) if dbias is None else dbias  # per-channel vectors are small
    dscale = xp.empty(c, x.dtype) if dscale is None else dscale
    part_sum, factor, dy_coef, bias_term, centred_coef = (xp.empty(c, x.dtype) for _ in range(5))
    dy_coef3, bias_term3 = dy_coef.reshape(1, c, 1), bias_term.reshape(1, c, 1)
    centred_coef3 = centred_coef.reshape(1, c, 1)
    nb = rows_per_chunk(n, c * s * x.itemsize)
    dots_at = align(nb * c * s * x.itemsize)
    mean3 = mean.reshape(1, c, 1)
    use_torch = bound and _torch_passes(x)
    pass1, pass2 = [], []
    for n0 in range(0, n, nb):  # pass 1: centre X (into dX when wanted), dot with dY
        k = min(nb, n - n0)
        centred = dx3[n0:n0 + k] if dx3 is not None else ctx.scratch_array(0, (k, c, s), x.dtype)
        dots = ctx.scratch_array(dots_at, (k, c), x.dtype)
        pass1.append((_ew_pass(xp, use_torch, "subtract", x3[n0:n0 + k], mean3, centred),
                      centred.reshape(k * c, 1, s),
                      dy3[n0:n0 + k].reshape(k * c, s, 1), dots, dots.reshape(k * c, 1, 1)))
        if dx3 is not None:  # pass 2: dX = dY * a - b - (X - mean) * g
            dxc, dyc, grad = dx3[n0:n0 + k], dy3[n0:n0 + k], ctx.scratch_array(0, (k, c, s), x.dtype)
            pass2.append((_ew_pass(xp, use_torch, "multiply", dxc, centred_coef3, dxc),
                          _ew_pass(xp, use_torch, "multiply", dyc, dy_coef3, grad),
                          _ew_pass(xp, use_torch, "subtract", grad, bias_term3, grad),
                          _ew_pass(xp, use_torch, "subtract", grad, dxc, dxc)))

    def run(ctx_: KernelContext, inputs_: list, outputs_: list) -> None:
        xp.sum(dy3, axis=(0, 2), out=dbias)
        for i, (centre, left, right, dots, dots3) in enumerate(pass1):
            centre()
            xp.matmul(left, right, out=dots3)
            if i == 0:
                xp.sum(dots, axis=0, out=dscale)
            else:
                xp.sum(dots, axis=0, out=part_sum)
                xp.add(dscale, part_sum, out=dscale)
        xp.multiply(dscale, inv_std, out=dscale)
        if dx3 is None:
            return
        xp.multiply(scale, inv_std, out=factor)
        xp.divide(factor, ns, out=factor)
        xp.multiply(factor, ns, out=dy_coef)
        xp.multiply(factor, dbias, out=bias_term)
        xp.multiply(dscale, inv_std, out=centred_coef)
        xp.multiply(centred_coef, factor, out=centred_coef)
        for scale_centred, scale_dy, shift, combine in pass2:
            scale_centred()
            scale_dy()
            shift()
            combine()

    return run


@kernel("BatchNormalizationGrad", MS, scratch=_batch_norm_grad_scratch, bind=bind_prepared(_prepare_batch_norm_grad))
def batch_norm_grad(ctx: KernelContext, inputs, outputs) -> None:
    """(dY, X, scale, mean, inv_std) -> dX, dscale, dbias (each optional; _prepare_batch_norm_grad)."""
    prepared_call(_prepare_batch_norm_grad, ctx, inputs, outputs)
