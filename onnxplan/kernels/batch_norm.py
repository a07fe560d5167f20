"""BatchNormalization and ONNX Runtime's training forms: BatchNormInternal (running statistics
updated in place) and BatchNormalizationGrad, each written once: prepared per call, or once when
the executor binds (registry.Prepare)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from math import prod
from typing import Any

import numpy as np

from onnxplan.kernels import batch_norm_loops, parallel
from onnxplan.kernels.norm import _ew_pass, _get, _run_all, _torch_passes, rows_per_chunk
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
    _ew_pass: the same bits). Training is cut by channels across the compute threads
    (_bn_channels): every statistic is its channel's own, the same bits.
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
    run_mean, run_var = _get(outputs, 1), _get(outputs, 2)
    fused = batch_norm_loops.batch_norm_training_loops(x, scale, b, mean_in, var_in, y, run_mean, run_var,
                                                       _get(outputs, 3), _get(outputs, 4), (n, c, s), float(eps),
                                                       float(momentum))
    if fused is not None:  # the fused loops (kernels/batch_norm_loops.py)
        return fused
    mean = _get(outputs, 3) if _get(outputs, 3) is not None else xp.empty(c, x.dtype)
    inv_std = _get(outputs, 4) if _get(outputs, 4) is not None else xp.empty(c, x.dtype)
    per_nc2 = ctx.scratch_array(0, (n * c,), x.dtype).reshape(n, c)
    vectors = _BnVectors(t(n * s), eps, momentum, t(1) - momentum, scale, b, mean_in, var_in, run_mean, run_var,
                         mean, inv_std, new_scale, new_bias, xp.empty(c, x.dtype))
    tasks = [partial(_run_all, _bn_channels(xp, use_torch, vectors, x3, y3, per_nc2, lo, hi))
             for lo, hi in parallel.row_parts(xp, c, n * s, passes=BN_PASSES, min_rows=BN_PART_MIN)]

    def run_training(ctx_: KernelContext, inputs_: list, outputs_: list) -> None:
        parallel.run(tasks)

    return run_training


# BatchNorm and its gradient cut by channels across the compute threads as kernels of this many
# passes per element (kernels.parallel.row_parts): every statistic is a channel's own, so each
# part computes its channels start to end, in the order one thread does: the same bits.
BN_PASSES = 4
# channels a part takes at least: numpy sums a one-channel slice's reductions (dbias over images
# and positions, dscale's dots over images) as one strided run, pairwise, where two or more
# channels are summed image by image as the whole kernel does: other bits
BN_PART_MIN = 2


@dataclass(frozen=True)
class _BnVectors:
    """BatchNorm's channel-sized arrays and scalars, sliced per part by _bn_channels."""

    count: Any
    eps: Any
    momentum: Any
    keep: Any
    scale: Any
    bias: Any
    mean_in: Any
    var_in: Any
    run_mean: Any
    run_var: Any
    mean: Any
    inv_std: Any  # the variance first, then 1 / sqrt(var + eps) in place
    new_scale: Any
    new_bias: Any
    batch_part: Any


def _bn_channels(xp: Any, use_torch: bool, v: _BnVectors, x3: Any, y3: Any, per_nc2: Any, lo: int,
                 hi: int) -> list[Callable[[], Any]]:
    """The training BatchNorm of channels lo:hi: per (image, channel) sums, the channel's mean,
    X centred into Y, per (image, channel) dot products, the variance, running statistics,
    inv_std, then Y = X * new_scale + new_bias."""
    k = hi - lo
    xc, yc, sums = x3[:, lo:hi], y3[:, lo:hi], per_nc2[:, lo:hi]
    mean, var, new_scale, new_bias = v.mean[lo:hi], v.inv_std[lo:hi], v.new_scale[lo:hi], v.new_bias[lo:hi]
    steps: list[Callable[[], Any]] = [
        partial(xp.sum, xc, axis=2, out=sums), partial(xp.sum, sums, axis=0, out=mean),
        partial(xp.divide, mean, v.count, out=mean), _ew_pass(xp, use_torch, "subtract", xc, mean.reshape(1, k, 1), yc),
        partial(xp.matmul, yc[:, :, None, :], yc[:, :, :, None], out=sums[:, :, None, None]),
        partial(xp.sum, sums, axis=0, out=var), partial(xp.divide, var, v.count, out=var)]
    batch_part = v.batch_part[lo:hi]
    for running, given, batch in ((v.run_mean, v.mean_in, mean), (v.run_var, v.var_in, var)):
        if running is not None:
            steps += [partial(xp.multiply, batch, v.keep, out=batch_part),
                      partial(xp.multiply, given[lo:hi], v.momentum, out=running[lo:hi]),
                      partial(xp.add, running[lo:hi], batch_part, out=running[lo:hi])]
    return steps + [partial(xp.add, var, v.eps, out=var), partial(xp.divide, var.dtype.type(1), var, out=var),
                    partial(xp.sqrt, var, out=var), partial(xp.multiply, var, v.scale[lo:hi], out=new_scale),
                    partial(xp.multiply, mean, new_scale, out=new_bias),
                    partial(xp.subtract, v.bias[lo:hi], new_bias, out=new_bias),
                    _ew_pass(xp, use_torch, "multiply", xc, new_scale.reshape(1, k, 1), yc),
                    _ew_pass(xp, use_torch, "add", yc, new_bias.reshape(1, k, 1), yc)]


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
    _ew_pass: the same bits). Cut by channels across the compute threads (BN_PASSES), each part
    its channels start to end in one thread's order: the same bits.
    """
    xp = ctx.xp
    dy, x, scale, mean, inv_std = inputs[:5]
    dx, dscale, dbias = _get(outputs, 0), _get(outputs, 1), _get(outputs, 2)
    n, c, s = _bn_dims(x.shape)
    t = x.dtype.type
    ns = t(n * s)
    x3, dy3 = x.reshape(n, c, s), dy.reshape(n, c, s)
    fused = batch_norm_loops.batch_norm_grad_loops(dy, x, scale, mean, inv_std, dx, dscale, dbias, (n, c, s))
    if fused is not None:  # the fused loops (kernels/batch_norm_loops.py)
        return fused
    dx3 = dx.reshape(n, c, s) if dx is not None else None
    dbias = xp.empty(c, x.dtype) if dbias is None else dbias  # per-channel vectors are small
    dscale = xp.empty(c, x.dtype) if dscale is None else dscale
    vectors = [xp.empty(c, x.dtype) for _ in range(5)]  # part_sum, factor, dy_coef, bias_term, centred_coef
    nb = rows_per_chunk(n, c * s * x.itemsize)
    dots_at = align(nb * c * s * x.itemsize)
    use_torch = bound and _torch_passes(x)
    chunks = []
    for n0 in range(0, n, nb):  # centred X (in dX when wanted), dots per (image, channel), dX's workspace
        k = min(nb, n - n0)
        centred = dx3[n0:n0 + k] if dx3 is not None else ctx.scratch_array(0, (k, c, s), x.dtype)
        grad = ctx.scratch_array(0, (k, c, s), x.dtype) if dx3 is not None else None
        chunks.append((n0, k, centred, ctx.scratch_array(dots_at, (k, c), x.dtype), grad))
    dx_chunks = [(n0, k, grad) for n0, k, _, _, grad in chunks if grad is not None]

    def channels(lo: int, hi: int) -> list[Callable[[], Any]]:
        """Channels lo:hi start to end: dbias, then per chunk X centred and dotted with dY into
        dscale, then the channel factors and dX = dY * a - b - (X - mean) * g."""
        def ew(op: str, a: Any, b: Any, out: Any) -> Callable[[], Any]:
            return _ew_pass(xp, use_torch, op, a, b, out)

        part_sum, factor, dy_coef, bias_term, centred_coef = (v[lo:hi] for v in vectors)
        ds, ds_inv = dscale[lo:hi], inv_std[lo:hi]
        steps: list[Callable[[], Any]] = [partial(xp.sum, dy3[:, lo:hi], axis=(0, 2), out=dbias[lo:hi])]
        for i, (n0, k, centred, dots, _) in enumerate(chunks):
            cen, dts, dyc = centred[:, lo:hi], dots[:, lo:hi], dy3[n0:n0 + k, lo:hi]
            steps += [ew("subtract", x3[n0:n0 + k, lo:hi], mean.reshape(1, c, 1)[:, lo:hi], cen),
                      partial(xp.matmul, cen[:, :, None, :], dyc[:, :, :, None], out=dts[:, :, None, None])]
            steps += [partial(xp.sum, dts, axis=0, out=ds)] if i == 0 else [
                partial(xp.sum, dts, axis=0, out=part_sum), partial(xp.add, ds, part_sum, out=ds)]
        steps.append(partial(xp.multiply, ds, ds_inv, out=ds))
        if dx3 is None:
            return steps
        steps += [partial(xp.multiply, scale[lo:hi], ds_inv, out=factor), partial(xp.divide, factor, ns, out=factor),
                  partial(xp.multiply, factor, ns, out=dy_coef), partial(xp.multiply, factor, dbias[lo:hi], out=bias_term),
                  partial(xp.multiply, ds, ds_inv, out=centred_coef),
                  partial(xp.multiply, centred_coef, factor, out=centred_coef)]
        k3 = (1, hi - lo, 1)
        for n0, k, grad in dx_chunks:
            dxc, dyc, g = dx3[n0:n0 + k, lo:hi], dy3[n0:n0 + k, lo:hi], grad[:, lo:hi]
            steps += [ew("multiply", dxc, centred_coef.reshape(k3), dxc), ew("multiply", dyc, dy_coef.reshape(k3), g),
                      ew("subtract", g, bias_term.reshape(k3), g), ew("subtract", g, dxc, dxc)]
        return steps

    tasks = [partial(_run_all, channels(lo, hi)) for lo, hi in parallel.row_parts(xp, c, n * s, passes=BN_PASSES, min_rows=BN_PART_MIN)]

    def run(ctx_: KernelContext, inputs_: list, outputs_: list) -> None:
        parallel.run(tasks)

    return run


@kernel("BatchNormalizationGrad", MS, scratch=_batch_norm_grad_scratch, bind=bind_prepared(_prepare_batch_norm_grad))
def batch_norm_grad(ctx: KernelContext, inputs, outputs) -> None:
    """(dY, X, scale, mean, inv_std) -> dX, dscale, dbias (each optional; _prepare_batch_norm_grad)."""
    prepared_call(_prepare_batch_norm_grad, ctx, inputs, outputs)
