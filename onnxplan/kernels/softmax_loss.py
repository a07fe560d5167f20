"""Softmax-family kernels: (Log)Softmax, their gradients, SoftmaxCrossEntropyLoss and its gradient,
NegativeLogLikelihoodLoss.

The split pass's loss chunks (passes/split_ops.py, KIND_ROWS over the loss's rows):
onnxplan.SoftmaxCrossEntropyLossRows and onnxplan.SoftmaxCrossEntropyLossGradRows are the two ops'
kernels on rows [start, stop) of the scores (log_prob) with the labels (and weights) whole: the
mean's denominator (the kept labels' summed weights) is the whole step's, computed as the unsplit
kernel does; a forward chunk writes its rows of log_prob and its share of the loss (its rows'
sum, over the whole denominator for mean), a gradient chunk its rows of dlogits (the same bits:
each row from the same factor).

On host float32 scores with int64 labels (weight absent or float32, all C-contiguous), both ops
and their row chunks run the fused C loops of kernels/native.py (native.sce: one call a node on
mlp's 64 x 10, ~4 us where the numpy path's ~15 calls took ~50-90): their log_prob and dlogits
are the loops' bits (their own exp; within the tests' tolerances of ONNX Runtime), the same for
a whole node and its row chunks and at any thread count. Everything else (float64, other label
types, ONNXPLAN_NATIVE_KERNELS=0, no compiler, the GPU) takes the numpy/torch path below.
Softmax along the last axis of float32 rows likewise runs a fused loop (native.softmax_rows, cut
by rows on the GEMM pool: _native_softmax), LogSoftmax and the gradients torch's row kernels."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from onnxplan.kernels import _torch, _xp, gemm_calls, native, parallel
from onnxplan.kernels.registry import (
    BindRule,
    KernelContext,
    KernelFn,
    bind_prepared,
    call_step,
    kernel,
    prepared_call,
)

__all__ = ["ORT_DEFAULT_IGNORE_INDEX"]

MS = "com.microsoft"
# ONNX Runtime's SoftmaxCrossEntropyLoss(Grad) ignore labels equal to -1 when the node has no
# ignore_index attribute (the ONNX spec ignores none); we match ONNX Runtime.
ORT_DEFAULT_IGNORE_INDEX = -1


def _views(shape, axis: int, coerce_2d: bool, *arrays):
    """The arrays as [pre, D, post] around `axis` (opset 13+), or [pre, D, 1] with D the product of
    the dims from `axis` on (opset < 13 and the legacy gradient ops)."""
    rank = len(shape)
    if rank == 0:
        raise ValueError("softmax of a scalar")
    axis = _xp.norm_axis(axis, rank)
    if coerce_2d:
        pre, d, post = math.prod(shape[:axis]), math.prod(shape[axis:]), 1
    else:
        pre, d, post = _xp.axis3(shape, axis)
    return _xp.one_object_per_buffer([a.reshape(pre, d, post) for a in arrays])


def _torch_softmax(xp: Any, x3: Any, out3: Any, log: bool) -> Callable[[], Any] | None:
    """Along the last axis, torch's _(log_)softmax.out on zero-copy tensors of these views (one
    pass per row); None when torch cannot take them."""
    if not (x3.shape[2] == 1 and _torch.usable(xp, out3, x3)):
        return None
    op = (_torch.aten()._log_softmax if log else _torch.aten()._softmax).out
    tx, to = _torch.tensor(x3[:, :, 0]), _torch.tensor(out3[:, :, 0])
    return _by_rows([partial(op, tx[lo:hi], 1, False, out=to[lo:hi])
                     for lo, hi in _row_parts(xp, x3.shape[0], x3.shape[1])])


def _native_softmax(xp: Any, x3: Any, out3: Any) -> Callable[[], Any] | None:
    """Softmax along the last axis of contiguous float32 rows by the fused loop
    (native.softmax_rows), cut by rows on the GEMM pool from gemm_calls.POOLED_MIN_ELEMS
    elements a piece (no interpreter lock: torch's row kernel is cut across the Python workers;
    whole with ONNXPLAN_SPLIT_KERNELS=0); None where it does not apply (the torch and numpy paths
    then)."""
    if xp is not np or x3.shape[2] != 1 or x3.dtype != np.float32 or out3.dtype != np.float32:
        return None
    x2, y2 = x3[:, :, 0], out3[:, :, 0]
    fn = native.softmax_rows()
    if fn is None or not (x2.flags.c_contiguous and y2.flags.c_contiguous):
        return None
    rows, c = x2.shape
    return gemm_calls.rows_job(fn, x2.ctypes.data, y2.ctypes.data, rows, c, x2.size)


# torch's row kernels ((log-)softmax and its gradient: a max, an exponential, a sum and a scale
# per element) cut by rows across the compute threads as a kernel of this many passes would
# (kernels.parallel.row_parts); every row computed as on one thread.
SOFTMAX_PASSES = 4


def _row_parts(xp: Any, rows: int, width: int) -> list[tuple[int, int]]:
    return parallel.row_parts(xp, rows, width, passes=SOFTMAX_PASSES)


def _by_rows(calls: list[Callable[[], Any]]) -> Callable[[], Any]:
    """One call running `calls` (one per part of the rows) across the compute threads."""
    if len(calls) == 1:
        return calls[0]
    return partial(parallel.run, calls)


def _softmax(xp, x3, out3, log: bool) -> None:
    """out3 = (log)softmax of x3 along axis 1 (out3 may be x3's memory); as ORT/MLAS: subtract the
    max, exponentiate, and scale by 1/sum (softmax) or subtract log(sum) (log-softmax). Along the
    last axis, the fused loop (_native_softmax; softmax of float32) or torch's _(log_)softmax.out
    (_torch_softmax) does the same."""
    step = _row_softmax(xp, x3, out3, log)
    if step is not None:
        step()
        return
    m = x3.max(axis=1, keepdims=True)
    xp.subtract(x3, m, out=out3)
    if log:
        s = xp.zeros_like(m)
        _xp.sum_along(xp, xp.exp, [out3], s)
        xp.log(s, out=s)
        xp.subtract(out3, s, out=out3)
    else:
        xp.exp(out3, out=out3)
        s = out3.sum(axis=1, keepdims=True)
        xp.reciprocal(s, out=s)
        xp.multiply(out3, s, out=out3)


def _row_softmax(xp: Any, x3: Any, out3: Any, log: bool) -> Callable[[], Any] | None:
    """Along the last axis: the fused loop for a softmax (_native_softmax: at 2 threads GPT b16's
    4096 x 64 scores took 216 us against torch's 409, 278 against 417 at 1), else torch's row
    kernel; None where neither applies (the numpy path)."""
    return (None if log else _native_softmax(xp, x3, out3)) or _torch_softmax(xp, x3, out3, log)


def _bind_softmax(log: bool) -> BindRule:
    def bind(ctx: KernelContext, inputs: list, outputs: list) -> KernelFn | None:
        """The plain kernel's row branch (_row_softmax) made once."""
        x3, out3 = _views(inputs[0].shape, int(ctx.attrs.get("axis", -1)), False, inputs[0], outputs[0])
        return call_step(_row_softmax(ctx.xp, x3, out3, log))

    return bind


@kernel("Softmax", overwrites={0: (0,)}, bind=_bind_softmax(log=False))
def softmax(ctx, inputs, outputs):
    """Opset 13+ semantics: along one axis (default -1)."""
    x3, out3 = _views(inputs[0].shape, int(ctx.attrs.get("axis", -1)), False, inputs[0], outputs[0])
    _softmax(ctx.xp, x3, out3, log=False)


@kernel("LogSoftmax", overwrites={0: (0,)}, bind=_bind_softmax(log=True))
def log_softmax(ctx, inputs, outputs):
    x3, out3 = _views(inputs[0].shape, int(ctx.attrs.get("axis", -1)), False, inputs[0], outputs[0])
    _softmax(ctx.xp, x3, out3, log=True)


def _torch_softmax_grad(xp: Any, dy3: Any, y3: Any, out3: Any) -> Callable[[], Any] | None:
    """Along the last axis, torch's _softmax_backward_data.out (its row kernel) on zero-copy
    tensors of these views; None when torch cannot take them."""
    if not (y3.shape[2] == 1 and _torch.usable(xp, out3, dy3, y3)):
        return None
    op, t = _torch.aten()._softmax_backward_data.out, _torch.tensor
    tdy, ty, tout, dtype = t(dy3[:, :, 0]), t(y3[:, :, 0]), t(out3[:, :, 0]), t(y3).dtype
    rows, width = y3.shape[0], y3.shape[1]
    return _by_rows([partial(op, tdy[lo:hi], ty[lo:hi], 1, dtype, grad_input=tout[lo:hi])
                                      for lo, hi in _row_parts(xp, rows, width)])


def _softmax_grad(ctx, inputs, outputs, coerce_2d: bool, default_axis: int) -> None:
    """dX = Y (dY - sum(Y dY)) along the axis."""
    xp, (dy, y), out = ctx.xp, inputs[:2], outputs[0]
    axis = int(ctx.attrs.get("axis", default_axis))
    dy3, y3, out3 = _views(y.shape, axis, coerce_2d, dy, y, out)
    step = _torch_softmax_grad(xp, dy3, y3, out3)
    if step is not None:
        step()
        return
    s = xp.zeros((y3.shape[0], 1, y3.shape[2]), dtype=out.dtype)
    _xp.sum_along(xp, lambda a, b: a * b, [y3, dy3], s)

    def block(o, g, p, s_b):
        xp.multiply(g - s_b, p, out=o)

    _xp.blockwise(xp, block, out3, dy3, y3, s)


def _log_softmax_grad(ctx, inputs, outputs, coerce_2d: bool, default_axis: int) -> None:
    """dX = dY - exp(Y) sum(dY) along the axis (Y: the LogSoftmax output)."""
    xp, (dy, y), out = ctx.xp, inputs[:2], outputs[0]
    axis = int(ctx.attrs.get("axis", default_axis))
    dy3, y3, out3 = _views(y.shape, axis, coerce_2d, dy, y, out)
    s = dy3.sum(axis=1, keepdims=True)

    def block(o, g, p, s_b):
        e = xp.exp(p)
        e *= -s_b
        xp.add(e, g, out=o)

    _xp.blockwise(xp, block, out3, dy3, y3, s)


def _bind_softmax_grad(coerce_2d: bool, default_axis: int) -> BindRule:
    def bind(ctx: KernelContext, inputs: list, outputs: list) -> KernelFn | None:
        """The plain kernel's torch branch (_torch_softmax_grad) made once."""
        (dy, y), out = inputs[:2], outputs[0]
        dy3, y3, out3 = _views(y.shape, int(ctx.attrs.get("axis", default_axis)), coerce_2d, dy, y, out)
        return call_step(_torch_softmax_grad(ctx.xp, dy3, y3, out3))

    return bind


@kernel("SoftmaxGrad_13", MS, overwrites={0: (0, 1)}, bind=_bind_softmax_grad(False, -1))
def softmax_grad_13(ctx, inputs, outputs):
    _softmax_grad(ctx, inputs, outputs, coerce_2d=False, default_axis=-1)


@kernel("SoftmaxGrad", MS, overwrites={0: (0, 1)}, bind=_bind_softmax_grad(True, 1))
def softmax_grad(ctx, inputs, outputs):
    """The pre-13 form: the input coerced to 2-D at `axis` (default 1)."""
    _softmax_grad(ctx, inputs, outputs, coerce_2d=True, default_axis=1)


@kernel("LogSoftmaxGrad_13", MS, overwrites={0: (0, 1)})
def log_softmax_grad_13(ctx, inputs, outputs):
    _log_softmax_grad(ctx, inputs, outputs, coerce_2d=False, default_axis=-1)


@kernel("LogSoftmaxGrad", MS, overwrites={0: (0, 1)})
def log_softmax_grad(ctx, inputs, outputs):
    _log_softmax_grad(ctx, inputs, outputs, coerce_2d=True, default_axis=1)


# ---- cross entropy ------------------------------------------------------------------------------
def _optional(inputs, i):
    return inputs[i] if len(inputs) > i else None


def _label_weights(ctx, labels, weight, ignore_input, ncd: tuple[int, int, int], dtype):
    """(labels with ignored ones set to 0 [N, D], 1.0 where kept / 0.0 where ignored [N, D],
    per-sample weights [N, D]: weight[label], or 1, and 0 where ignored)."""
    xp = ctx.xp
    ignore = ctx.attrs.get("ignore_index", ORT_DEFAULT_IGNORE_INDEX)
    if ignore_input is not None:  # the Internal ops take it as an optional input
        ignore = _xp.host_scalar(ignore_input)
    n, classes, d = ncd
    labels2 = labels.reshape(n, d)
    kept = labels2 != int(ignore)
    safe = xp.where(kept, labels2, 0)
    if labels2.size and bool(((safe < 0) | (safe >= classes)).any()):
        raise _label_error(ctx.node.name, classes, ignore)
    kept = kept.astype(dtype)
    w = xp.take(weight, safe).astype(dtype, copy=False) * kept if weight is not None else kept
    return safe, kept, w


def _label_error(node_name: str, classes: int, ignore) -> IndexError:
    return IndexError(f"{node_name}: a label is out of range [0, {classes}) and not ignore_index {ignore}")


def _ncd(logits_shape) -> tuple[int, int, int]:
    n = int(logits_shape[0])
    c = int(logits_shape[1]) if len(logits_shape) > 1 else 1
    return n, c, math.prod(logits_shape[2:])


def _sce_scratch(node, in_specs, out_specs) -> int:
    """A log_prob workspace, only when the node does not output log_prob itself."""
    has_log_prob = len(node.outputs) > 1 and bool(node.outputs[1])
    return 0 if has_log_prob or in_specs[0] is None else in_specs[0].nbytes


def _prepare_sce(ctx: KernelContext, inputs: list, outputs: list, bound: bool) -> KernelFn:
    """SoftmaxCrossEntropyLoss's step made once (bound: once a node): the fused C loops where
    they take the node (_native_sce_loss), else its views and its log-softmax step (torch's row
    kernel where it takes them), the step computing the loss from them (bound: a 0.7 ms mlp
    step's ~20 us of views and torch tensors saved)."""
    xp, logits = ctx.xp, inputs[0]
    n, c, d = _ncd(logits.shape)
    log_prob = outputs[1] if len(outputs) > 1 else None
    if log_prob is None:
        log_prob = ctx.scratch_array(0, logits.shape, logits.dtype)
    reduction = _xp.attr_str(ctx.attrs.get("reduction"), "mean")
    rows = _row_range(ctx.attrs, n)
    fused = _native_sce_loss(ctx, inputs, outputs[0], log_prob, reduction, rows)
    if fused is not None:
        return fused
    lp3, x3 = log_prob.reshape(n, c, d), logits.reshape(n, c, d)
    log_softmax = _torch_softmax(xp, x3, lp3, log=True) or partial(_softmax, xp, x3, lp3, True)

    def step(ctx_: KernelContext, inputs_: list, outputs_: list) -> None:
        log_softmax()
        _sce_loss(ctx_, lp3, inputs_[1], _optional(inputs_, 2), _optional(inputs_, 3), outputs_[0], reduction, rows)

    return step


def _row_range(attrs: dict, n: int) -> tuple[int, int]:
    """The rows [start, stop) of the labels a loss chunk covers (its scores' n rows); the whole
    node: [0, n)."""
    start = int(attrs.get("start", 0))
    return start, int(attrs.get("stop", start + n))


def _labels_rows(labels, rows: tuple[int, int]) -> int:
    """The labels' rows (N of the whole step; a loss chunk's scores hold rows[1] - rows[0])."""
    return int(labels.shape[0]) if labels.ndim else rows[1] - rows[0]


def _sce_loss(ctx, lp3, labels, weight, ignore_input, loss, reduction: str, rows: tuple[int, int]) -> None:
    """loss from log_prob ([N, C, D]; a chunk's rows `rows` of the labels) and the labels:
    -log_prob[label] * weight[label] per sample, reduced (mean: over the whole labels' weights)."""
    xp = ctx.xp
    n, c, d = lp3.shape
    safe, _, w = _label_weights(ctx, labels, weight, ignore_input, (_labels_rows(labels, rows), c, d), lp3.dtype)
    lo, hi = rows
    picked = xp.take_along_axis(lp3, safe[lo:hi].reshape(n, 1, d), axis=1).reshape(n, d)
    per_sample = -picked * w[lo:hi]
    if reduction == "none":
        xp.copyto(loss, per_sample.reshape(loss.shape))
        return
    total = per_sample.sum()
    if reduction == "mean":
        denom = w.sum()
        if bool(denom != 0):
            total = total / denom
    xp.copyto(loss, total, casting="unsafe")


@kernel("SoftmaxCrossEntropyLoss", scratch=_sce_scratch, bind=bind_prepared(_prepare_sce))
@kernel("SoftmaxCrossEntropyLossRows", "onnxplan", scratch=_sce_scratch, bind=bind_prepared(_prepare_sce))
@kernel("SoftmaxCrossEntropyLossInternal", MS, scratch=_sce_scratch, bind=bind_prepared(_prepare_sce))
def softmax_cross_entropy_loss(ctx, inputs, outputs):
    """(loss, log_prob) from scores [N, C, d...] and labels [N, d...]: log_prob = logsoftmax over C;
    loss = -log_prob[label] * weight[label] per sample (0 where label == ignore_index), summed
    (sum), divided by the summed weights or the count of kept samples (mean), or kept (none)."""
    prepared_call(_prepare_sce, ctx, inputs, outputs)


def _prepare_sce_grad(ctx: KernelContext, inputs: list, outputs: list, bound: bool) -> KernelFn:
    """SoftmaxCrossEntropyLossGrad's step: the fused C loop where it takes the node
    (_native_sce_grad, its addresses made once), else the numpy kernel (_sce_grad)."""
    return _native_sce_grad(ctx, inputs, outputs) or _sce_grad


@kernel("SoftmaxCrossEntropyLossGrad", MS, overwrites={0: (1,)}, bind=bind_prepared(_prepare_sce_grad))
@kernel("SoftmaxCrossEntropyLossGradRows", "onnxplan", overwrites={0: (1,)}, bind=bind_prepared(_prepare_sce_grad))
@kernel("SoftmaxCrossEntropyLossInternalGrad", MS, overwrites={0: (1,)}, bind=bind_prepared(_prepare_sce_grad))
def softmax_cross_entropy_loss_grad(ctx, inputs, outputs):
    """dlogits = (exp(log_prob) - onehot(label)) * weight[label] * dY', where dY' is dY per sample
    (none), dY (sum) or dY over the summed weights / kept count (mean); 0 where ignored.
    The Internal form takes ignore_index as input 4 and adds an optional bias (input 5)."""
    prepared_call(_prepare_sce_grad, ctx, inputs, outputs)


def _sce_grad(ctx, inputs, outputs):
    """The numpy kernel of softmax_cross_entropy_loss_grad."""
    xp, (dy, log_prob, labels), out = ctx.xp, inputs[:3], outputs[0]
    weight, ignore_input, bias = _optional(inputs, 3), _optional(inputs, 4), _optional(inputs, 5)
    n, c, d = _ncd(log_prob.shape)
    rows = _row_range(ctx.attrs, n)
    n_all = _labels_rows(labels, rows)
    safe, kept, w = _label_weights(ctx, labels, weight, ignore_input, (n_all, c, d), out.dtype)
    lp3, out3 = _xp.one_object_per_buffer([log_prob.reshape(n, c, d), out.reshape(n, c, d)])
    reduction = _xp.attr_str(ctx.attrs.get("reduction"), "mean")
    if reduction == "none":
        factor = w * dy.reshape(n_all, d)
    else:
        scaled = dy.reshape(())
        if reduction == "mean":
            denom = w.sum()
            if bool(denom != 0):
                scaled = scaled / denom
        factor = w * scaled
    lo, hi = rows  # a chunk's rows of the whole labels' factors (the whole node: all of them)
    factor3, safe2, kept2 = factor[lo:hi].reshape(n, 1, d), safe[lo:hi].reshape(n, d), kept[lo:hi].reshape(n, d)
    parts = parallel.row_parts(xp, n, c * d, passes=SCE_GRAD_PASSES)
    if len(parts) == 1:  # whole (mlp's 64 x 10): no views, no hand-off
        _sce_grad_rows(xp, lp3, out3, safe2, kept2, factor3)
    else:
        parallel.run([partial(_sce_grad_rows, xp, lp3[lo:hi], out3[lo:hi], safe2[lo:hi], kept2[lo:hi],
                              factor3[lo:hi]) for lo, hi in parts])
    if bias is not None:
        xp.add(out, bias, out=out)


# SoftmaxCrossEntropyLossGrad's rows (an exponential, the label's subtraction, the scale) cut
# across the compute threads as a kernel of this many passes would (kernels.parallel.row_parts):
# GPT b16's 1024 x 1000 (0.55 ms on one thread) in two; every row computed as on one thread.
SCE_GRAD_PASSES = 4


def _sce_grad_rows(xp: Any, lp3: Any, out3: Any, safe: Any, kept: Any, factor3: Any) -> None:
    """Rows of dlogits = (exp(log_prob) - onehot(label)) * factor ([n, c, d] views and their
    [n, d] labels, kept flags and [n, 1, d] factors)."""
    xp.exp(lp3, out=out3)  # elementwise: out may be log_prob's memory
    rows = xp.arange(out3.shape[0]).reshape(-1, 1)
    cols = xp.arange(out3.shape[2]).reshape(1, -1)
    out3[rows, safe, cols] -= kept
    xp.multiply(out3, factor3, out=out3)


# ---- the fused C loops (kernels/native.py) ------------------------------------------------------
@dataclass(frozen=True)
class _Fused:
    """A node's arguments to the SCE loops: the loops, the geometry (native.Sce) and the
    ignore_index they read (the Internal form's input, else an array of the attribute); held by
    the step, which calls the loops with these arrays' addresses."""

    fns: native.Sce
    geometry: np.ndarray
    ignore: np.ndarray
    node_name: str
    classes: int

    def check(self, bad: int) -> None:
        """Raise the numpy path's IndexError for a loop's result that is a label's index."""
        if bad >= 0:
            raise _label_error(self.node_name, self.classes, int(self.ignore.reshape(-1)[0]))


def _f32(a: Any, size: int) -> bool:
    """A host float32 C-contiguous array of `size` elements."""
    return isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous and a.size == size


def _fused(ctx: KernelContext, scores: Any, labels: Any, weight: Any, ignore_input: Any, rows: tuple[int, int],
           reduction: str) -> _Fused | None:
    """The SCE loops' arguments where they take the node exactly: numpy, float32 scores
    (log_prob) [n, c, d...], int64 labels [n_all, d...] of which rows `rows` are the scores' (the
    whole node: all), weight absent or float32 [c], ignore_index an attribute or an int64 scalar,
    reduction none, sum or mean, all C-contiguous; None: the numpy path."""
    code = native.SCE_REDUCTIONS.get(reduction)
    if ctx.xp is not np or code is None or not isinstance(scores, np.ndarray) or scores.ndim < 2:
        return None
    n, c, d = _ncd(scores.shape)
    lo, hi = rows
    if not (_f32(scores, n * c * d) and isinstance(labels, np.ndarray) and labels.dtype == np.int64
            and labels.flags.c_contiguous and labels.ndim >= 1):
        return None
    n_all = int(labels.shape[0])
    if labels.size != n_all * d or hi - lo != n or lo < 0 or hi > n_all or (weight is not None and not _f32(weight, c)):
        return None
    if ignore_input is None:
        ignore = np.array([int(ctx.attrs.get("ignore_index", ORT_DEFAULT_IGNORE_INDEX))], np.int64)
    elif isinstance(ignore_input, np.ndarray) and ignore_input.dtype == np.int64 and ignore_input.size == 1:
        ignore = ignore_input  # read at each call (its memory is the node's)
    else:
        return None
    fns = native.sce()
    if fns is None:
        return None
    return _Fused(fns, np.array([n, c, d, lo, n_all, code], np.int64), ignore, ctx.node.name, c)


def _addr(a: Any) -> int | None:
    return None if a is None else int(a.ctypes.data)


def _native_sce_loss(ctx: KernelContext, inputs: list, loss: Any, log_prob: Any, reduction: str,
                     rows: tuple[int, int]) -> KernelFn | None:
    """SoftmaxCrossEntropyLoss by the fused loops (_fused): log_prob's rows cut across the
    compute threads as torch's log-softmax is (SOFTMAX_PASSES) and the loss after them in one
    call, or both in one call where the rows are not cut; None: the numpy path."""
    logits, labels, weight = inputs[0], inputs[1], _optional(inputs, 2)
    at = _fused(ctx, logits, labels, weight, _optional(inputs, 3), rows, reduction)
    if at is None:
        return None
    n, c, d = _ncd(logits.shape)
    if not (_f32(log_prob, n * c * d) and _f32(loss, n * d if reduction == "none" else 1)):
        return None
    head = (_addr(at.geometry), _addr(logits), _addr(log_prob), _addr(labels), _addr(weight), _addr(at.ignore))
    parts = _row_parts(ctx.xp, n, c * d)
    if len(parts) == 1:
        call = partial(at.fns.loss, *head, _addr(loss), 0, n)
    else:
        pieces = [partial(_checked, at, partial(at.fns.loss, *head, None, lo, hi)) for lo, hi in parts]
        reduce = partial(at.fns.loss, head[0], None, *head[2:], _addr(loss), 0, 0)
        call = partial(_after, partial(parallel.run, pieces), reduce)

    def step(ctx_: KernelContext, inputs_: list, outputs_: list) -> None:
        at.check(call())

    return step


def _after(first: Callable[[], Any], then: Callable[[], int]) -> int:
    first()
    return then()


def _native_sce_grad(ctx: KernelContext, inputs: list, outputs: list) -> KernelFn | None:
    """SoftmaxCrossEntropyLossGrad by the fused loop (_fused), its rows cut across the compute
    threads as the numpy kernel's are (SCE_GRAD_PASSES), the Internal form's bias added after;
    None: the numpy path."""
    (dy, log_prob, labels), out = inputs[:3], outputs[0]
    weight, bias = _optional(inputs, 3), _optional(inputs, 5)
    n, c, d = _ncd(log_prob.shape)
    reduction = _xp.attr_str(ctx.attrs.get("reduction"), "mean")
    rows = _row_range(ctx.attrs, n)
    at = _fused(ctx, log_prob, labels, weight, _optional(inputs, 4), rows, reduction)
    if at is None or not _f32(out, n * c * d):
        return None
    if not _f32(dy, int(at.geometry[4]) * d if reduction == "none" else 1):
        return None
    head = (_addr(at.geometry), _addr(dy), _addr(log_prob), _addr(labels), _addr(weight), _addr(at.ignore), _addr(out))
    calls = [partial(at.fns.grad, *head, lo, hi) for lo, hi in parallel.row_parts(ctx.xp, n, c * d, passes=SCE_GRAD_PASSES)]
    pieces = [partial(_checked, at, call) for call in calls]

    def step(ctx_: KernelContext, inputs_: list, outputs_: list) -> None:
        if len(calls) == 1:
            at.check(calls[0]())
        else:
            parallel.run(pieces)
        if bias is not None:
            np.add(out, bias, out=out)

    return step


def _checked(at: _Fused, call: Callable[[], int]) -> None:
    at.check(call())


@kernel("NegativeLogLikelihoodLoss")
def negative_log_likelihood_loss(ctx, inputs, outputs):
    """loss[n, d] = -input[n, target[n, d], d] * weight[target] (0 at ignore_index); reduction none,
    sum, or mean (divided by the sum of the weights taken)."""
    xp, x, target, out = ctx.xp, inputs[0], inputs[1], outputs[0]
    weight = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
    reduction = ctx.attrs.get("reduction", "mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else str(reduction)
    ignore = ctx.attrs.get("ignore_index")
    t = target.astype(np.int64)
    keep = t != int(ignore) if ignore is not None else None
    if keep is not None:
        t = xp.where(keep, t, 0)
    picked = xp.take_along_axis(x, xp.expand_dims(t, 1), axis=1)[:, 0]  # target-sized
    w = xp.take(weight, t) if weight is not None else xp.ones(t.shape, x.dtype)
    if keep is not None:
        w = w * keep
    loss = -(picked * w)
    if reduction == "none":
        xp.copyto(out, loss)
    elif reduction == "sum":
        xp.copyto(out, loss.sum())
    else:
        xp.copyto(out, loss.sum() / w.sum())


@kernel("Hardmax", since=13)
def hardmax(ctx, inputs, outputs):
    """1 at the first largest value along axis (default -1), 0 elsewhere."""
    xp, x, out = ctx.xp, inputs[0], outputs[0]
    axis = _xp.norm_axis(int(ctx.attrs.get("axis", -1)), x.ndim)
    first = xp.expand_dims(xp.argmax(x, axis=axis), axis)  # the input without the axis
    positions = xp.arange(x.shape[axis]).reshape((-1,) + (1,) * (x.ndim - axis - 1))
    _xp.blockwise(xp, lambda o, f, p: xp.copyto(o, f == p, casting="unsafe"), out, first, positions)
