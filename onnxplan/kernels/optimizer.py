"""Gradient accumulation and optimizer kernels: ONNX Runtime's math, chunked through planned scratch."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxplan.ir.graph import Node
from onnxplan.kernels import _xp, gemm_calls, native, parallel
from onnxplan.kernels.registry import KernelContext, kernel

__all__ = ["CHUNK", "adamw_constants", "optimizer_overwrites"]

MS = "com.microsoft"
OURS = "onnxplan"
CHUNK = 1 << 16  # elements per pass: the optimizer's temporaries live in 2 x CHUNK scratch
# AdamW splits across the compute threads as a kernel of this many passes per element would
# (kernels.parallel.parts_for: pieces of MIN_ELEMS / ADAMW_SPLIT_PASSES elements and more). It
# takes ~12 ufunc passes, but its pieces are chunked through the scratch and each starts cold:
# mlp's fc1 (200K elements) in two pieces took 0.26-0.39 ms against 0.21-0.23 whole (session 9,
# load 1-1.5), 0.25 against 0.22 least of 160 (session 10, load 5); reports/threads.md.
ADAMW_SPLIT_PASSES = 4


def optimizer_overwrites(first_param: int):
    """Output index -> the state input it updates, for a flattened optimizer node whose
    inputs are [head..., params, grads, (moments...)] and outputs [flag, params, (moments...)]."""

    def overwrites(node: Node) -> dict[int, tuple[int, ...]]:
        n = int(node.attrs.get("num_params", 0))
        blocks = [first_param + k * n for k in range(len(node.inputs[first_param:]) // max(n, 1))]
        state_blocks = [b for i, b in enumerate(blocks) if i != 1]  # every block but the grads
        return {1 + b * n + k: (start + k,) for b, start in enumerate(state_blocks) for k in range(n)}

    return overwrites


def _chunk_scratch(copies: int, param_inputs: slice):
    """Scratch rule: `copies` temporaries of min(largest parameter, CHUNK) elements."""

    def rule(node: Node, in_specs: list, out_specs: list) -> int:
        specs = [s for s in in_specs[param_inputs] if s is not None]
        if not specs:
            return 0
        numel = max(s.numel for s in specs)
        return copies * min(numel, CHUNK) * max(s.itemsize for s in specs)

    return rule


def _flat(a):
    return a.reshape(-1)


# ---- gradient accumulation ---------------------------------------------------------------

def _bind_accumulator_v2(ctx: KernelContext, inputs: list, outputs: list):
    """The plain kernel's branches with the views and the alias test made once."""
    if ctx.xp is not np:
        return None
    buf, value = inputs[0], inputs[1]
    flag = outputs[0]
    out = outputs[1] if len(outputs) > 1 and outputs[1] is not None else buf
    overwrite = _flat(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
    copy = out is not None and not _same(out, value)  # the overwrite branch has work to do
    src = value.reshape(out.shape) if copy else None

    def run(ctx, inputs, outputs):
        if buf is None or (overwrite is not None and overwrite[0]):
            if src is not None:  # (copy)
                np.copyto(out, src)
        else:
            np.add(buf, value, out=out)
        if flag is not None:
            flag.fill(True)

    return run


@kernel("InPlaceAccumulatorV2", MS, overwrites={1: (1, 0)}, bind=_bind_accumulator_v2)
def in_place_accumulator_v2(ctx: KernelContext, inputs: list, outputs: list) -> None:
    """(buffer, value, overwrite?) -> (updated flag, buffer'): buffer' = value when the flag is
    set or the buffer was dropped (a reset accumulation), else buffer + value."""
    xp = ctx.xp
    buf, value = inputs[0], inputs[1]
    overwrite = len(inputs) > 2 and inputs[2] is not None and bool(inputs[2].reshape(-1)[0])
    flag = outputs[0]
    out = outputs[1] if len(outputs) > 1 and outputs[1] is not None else buf
    if buf is None or overwrite:
        if out is not None and not _same(out, value):
            xp.copyto(out, value.reshape(out.shape))
    else:
        xp.add(buf, value, out=out)
    if flag is not None:
        flag.fill(True)


def _same(a, b) -> bool:
    """Do two arrays start at the same byte (an in-place alias)?"""
    ia = a.__array_interface__["data"][0] if isinstance(a, np.ndarray) else a.data.ptr
    ib = b.__array_interface__["data"][0] if isinstance(b, np.ndarray) else b.data.ptr
    return ia == ib


# ---- AdamW -------------------------------------------------------------------------------

_ADAMW_ATTRS = (("alpha", 0.9), ("beta", 0.999), ("epsilon", 1e-8), ("weight_decay", 0.0), ("adam_mode", 0),
                ("correct_bias", 1))


def _adamw_key(attrs: dict) -> tuple:
    return tuple(float(attrs.get(name, default)) for name, default in _ADAMW_ATTRS)


def adamw_constants(attrs: dict, lr: float, step: int) -> dict:
    """ORT's float32 scalars: the bias corrections use pow in double, cast to float. Memoized:
    every parameter's node of a step asks for the same ones (~10 us of numpy scalars each)."""
    return _adamw_constants(_adamw_key(attrs), float(lr), int(step))


@functools.lru_cache(maxsize=64)
def _adamw_fixed(key: tuple, lr: float) -> dict:
    """The constants that do not change from step to step (all but the bias corrections)."""
    attrs = {name: value for (name, _default), value in zip(_ADAMW_ATTRS, key)}
    f = np.float32
    alpha, beta = f(attrs.get("alpha", 0.9)), f(attrs.get("beta", 0.999))
    lr32, wd = f(lr), f(attrs.get("weight_decay", 0.0))
    c: dict[str, Any] = {
        "lr": lr32, "alpha": alpha, "beta": beta, "one_minus_alpha": f(1) - alpha,
        "one_minus_beta": f(1) - beta, "eps": f(attrs.get("epsilon", 1e-8)),
        "wd": wd, "mode": int(attrs.get("adam_mode", 0)),
        "lr_wd": lr32 * wd,  # float32, as the numpy chunk's decay multiplies by it
        "correct_bias": int(attrs.get("correct_bias", 1)) == 1,
    }
    c["vector"] = _loop_constants(c)  # the fused loop's: it makes the step's bias corrections itself
    c["vector_address"] = int(c["vector"].ctypes.data)  # 1.4-3 us a read: once, not once a call
    return c


_CORRECTIONS = ("alpha_corr", "beta_corr", "lr_corr")


@functools.lru_cache(maxsize=64)
def _adamw_constants(key: tuple, lr: float, step: int) -> dict:
    """Every constant of a step: the fixed ones (cached apart: a step's first node makes only
    the bias corrections, ~10 us instead of ~50) and the corrections for `step`."""
    c: dict[str, Any] = dict(_adamw_fixed(key, lr))
    f = np.float32
    alpha_corr, beta_corr, lr_corr = f(1), f(1), f(lr)
    if c["correct_bias"]:
        alpha_corr = f(1) - f(math.pow(float(c["alpha"]), step))
        beta_corr = f(1) - f(math.pow(float(c["beta"]), step))
        lr_corr = f(f(lr) * f(np.sqrt(beta_corr))) / alpha_corr
    c.update(alpha_corr=alpha_corr, beta_corr=beta_corr, lr_corr=f(lr_corr), step=step)
    return c


def _loop_constants(fixed: dict) -> np.ndarray:
    """The fused loop's constants (native.ADAMW_CONSTANTS; it makes the step's bias corrections
    itself) from _adamw_fixed's."""
    return np.array([fixed[name] for name in native.ADAMW_CONSTANTS], np.float32)


@functools.lru_cache(maxsize=64)
def _adamw_fixed_arrays(key: tuple, lr: float) -> dict:
    return {k: np.array(v) if isinstance(v, np.float32) else v for k, v in _adamw_fixed(key, lr).items()}


@functools.lru_cache(maxsize=64)
def _adamw_constant_arrays(key: tuple, lr: float, step: int) -> dict:
    """The same constants as 0-d float32 arrays, for numpy: a ufunc takes a 0-d array operand
    in about half the time of a numpy scalar (same value, same float32 arithmetic)."""
    c = _adamw_constants(key, lr, step)
    return {**_adamw_fixed_arrays(key, lr), **{k: np.array(c[k]) for k in _CORRECTIONS}}


def _adamw_chunk(xp, c: dict, pc, gc, mc, vc, pco, mo, vo, t1, t2) -> None:
    """One chunk of one parameter (flat views; t1, t2 scratch of the chunk's length). The
    outputs may be the state inputs themselves. ORT's order of float32 operations, exactly."""
    if c["mode"] == 0 and c["wd"]:  # PyTorch form: decay first
        xp.multiply(pc, c["lr"], out=t1)
        t1 *= c["wd"]
        xp.subtract(pc, t1, out=pco)
        pc = pco
    # m' = alpha m + (1 - alpha) g ; v' = beta v + (1 - beta) g g
    xp.multiply(gc, c["one_minus_alpha"], out=t1)
    xp.multiply(mc, c["alpha"], out=mo)
    mo += t1
    xp.multiply(gc, c["one_minus_beta"], out=t1)
    t1 *= gc
    xp.multiply(vc, c["beta"], out=vo)
    vo += t1
    if c["mode"] == 0:  # w -= lr m' / (alpha_corr (sqrt(v' / beta_corr) + eps))
        xp.divide(vo, c["beta_corr"], out=t1)
        xp.sqrt(t1, out=t1)
        t1 += c["eps"]
        t1 *= c["alpha_corr"]
        xp.multiply(mo, c["lr"], out=t2)
    else:  # Hugging Face form: w -= lr_corr m' / (sqrt(v') + eps), then w -= lr wd w
        xp.sqrt(vo, out=t1)
        t1 += c["eps"]
        xp.multiply(mo, c["lr_corr"], out=t2)
    t2 /= t1
    xp.subtract(pc, t2, out=pco)
    if c["mode"] != 0 and c["wd"]:
        xp.multiply(pco, c["lr_wd"], out=t1)
        pco -= t1


def _parts(arrays: list, scratch: list, xp=np, passes: int = 1) -> list[list[tuple]]:
    """One parameter's elementwise update cut for the compute threads (kernels.parallel): per
    part, a contiguous range of the flat `arrays`, in chunks of the part's own slice of each
    `scratch` array; each chunk is (*array views, *scratch views). One part on one thread."""
    flats = [_flat(a) for a in arrays]
    numel = flats[0].size
    parts = parallel.parts_for(numel, xp, passes=passes)
    width = max(1, min(t.size for t in scratch) // parts)
    out = []
    for k, (lo, hi) in enumerate(parallel.bounds(numel, parts)):
        temps = [t[k * width:(k + 1) * width] for t in scratch]
        out.append([(*(a[i:min(i + width, hi)] for a in flats), *(t[:min(i + width, hi) - i] for t in temps))
                    for i in range(lo, hi, width)])
    return out


@dataclass(frozen=True)
class _FusedRange:
    """One part of one parameter for the fused C loop (kernels/native.py): its length and the
    addresses of (p, g, m, v, p', m', v') at its start."""

    fn: Callable[..., None]
    n: int
    addresses: tuple[int, ...]

    def run(self, c: dict) -> None:
        self.fn(self.n, *self.addresses, c["vector_address"], c["step"], c["mode"])


class _PooledRanges:
    """One parameter's fused update as ranges on the GEMM pool (gemm_calls.PooledCalls, kind
    ADAMW): n and the addresses of p, g, m, v, p', m', v' at a range's start; the step's
    constants, step and mode filled in as it runs."""

    def __init__(self, gemm: gemm_calls.GemmPool, fn: Callable[..., None], flats: list, parts: int) -> None:
        rows = [[hi - lo, *(a[lo:].ctypes.data for a in flats)] for lo, hi in parallel.bounds(flats[0].size, parts)]
        self.calls = gemm_calls.PooledCalls(gemm, gemm_calls.ADAMW, fn, rows)

    def run(self, c: dict) -> None:
        table = self.calls.table
        table[:, 8], table[:, 9], table[:, 10] = c["vector_address"], c["step"], c["mode"]
        self.calls()


def _fused_parts(arrays: list, xp) -> list[list[_FusedRange]] | list[list[_PooledRanges]] | None:
    """The fused loop's parts: on the GEMM pool (one part of ranges of POOLED_MIN_ELEMS elements
    and more) where there is one, else ranges of MIN_ELEMS and more (one pass per element) for
    the Python pool; or None where the loop does not apply: not numpy, not float32, a
    non-contiguous array, no compiler."""
    fn = native.adamw() if xp is np else None
    if fn is None or not all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays):
        return None
    flats = [_flat(a) for a in arrays]
    gemm, pooled = gemm_calls.pooled_parts(flats[0].size)
    if gemm is not None and pooled > 1:
        return [[_PooledRanges(gemm, fn, flats, pooled)]]
    bounds = parallel.bounds(flats[0].size, parallel.parts_for(flats[0].size, xp))
    return [[_FusedRange(fn, hi - lo, tuple(a[lo:].ctypes.data for a in flats))] for lo, hi in bounds if hi > lo]


def _adamw_pieces(p, g, m, v, p_out, m_out, v_out, s1, s2, xp=np) -> list[list]:
    """Per part: the fused loop's range of one parameter, or (numpy) per chunk (p, g, m, v, p',
    m', v', t1, t2) flat views, t1/t2 the scratch (the two CHUNK-long halves, shared out among
    the parts). Both compute the same bits (tests/test_kernels_native.py)."""
    arrays = [p, g, m, v, p_out, m_out, v_out]
    fused = _fused_parts(arrays, xp)
    return fused if fused is not None else _parts(arrays, [s1, s2], xp, passes=ADAMW_SPLIT_PASSES)


def _adamw_part(xp, c: dict, pieces: list) -> None:
    for piece in pieces:
        if isinstance(piece, (_FusedRange, _PooledRanges)):
            piece.run(c)
        else:
            _adamw_chunk(xp, c, *piece)


def _adamw_parts(xp, c: dict, parts: list[list]) -> None:
    if len(parts) == 1:  # a small parameter: no task to hand out (~3 us a node)
        _adamw_part(xp, c, parts[0])
    else:
        parallel.run([functools.partial(_adamw_part, xp, c, pieces) for pieces in parts])


def _adamw_one(xp, c: dict, p, g, m, v, p_out, m_out, v_out, s1, s2) -> None:
    """One parameter, in chunks of the scratch, split across the compute threads; outputs may
    be the state inputs themselves."""
    _adamw_parts(xp, c, _adamw_pieces(p, g, m, v, p_out, m_out, v_out, s1, s2, xp))


def _scratch_pair(ctx: KernelContext, dtype) -> tuple:
    n = ctx.scratch.size // (2 * np.dtype(dtype).itemsize) if ctx.scratch is not None else 0
    return ctx.scratch_array(0, (n,), dtype), ctx.scratch_array(n * np.dtype(dtype).itemsize, (n,), dtype)


def _check_mode(attrs: dict) -> None:
    if int(attrs.get("adam_mode", 0)) not in (0, 1):
        raise ValueError(f"AdamW adam_mode {attrs.get('adam_mode')} is not 0 or 1")


@kernel("AdamWOptimizer", MS, overwrites=optimizer_overwrites(2), updates_state=True,
        scratch=_chunk_scratch(2, slice(2, None)))
def adamw_optimizer(ctx: KernelContext, inputs: list, outputs: list) -> None:
    """Flattened AdamWOptimizer: [lr, step, p.., g.., m.., v..] -> [flag, p'.., m'.., v'..]."""
    _check_mode(ctx.attrs)
    k = int(ctx.attrs["num_params"])
    c = adamw_constants(ctx.attrs, float(inputs[0].reshape(-1)[0]), int(inputs[1].reshape(-1)[0]))
    p, g, m, v = (inputs[2 + b * k:2 + (b + 1) * k] for b in range(4))
    po, mo, vo = (outputs[1 + b * k:1 + (b + 1) * k] for b in range(3))
    s1, s2 = _scratch_pair(ctx, p[0].dtype)
    for i in range(k):
        _adamw_one(ctx.xp, c, p[i], g[i], m[i], v[i], po[i], mo[i], vo[i], s1, s2)
    if outputs[0] is not None:
        outputs[0].fill(True)


def _bind_adamw_update(ctx: KernelContext, inputs: list, outputs: list):
    """The step's work only: views, chunks and attributes made once; the constants looked up by
    (lr, step) as the plain kernel does. Same chunk function, same bits."""
    if ctx.xp is not np or int(ctx.attrs.get("adam_mode", 0)) not in (0, 1):
        return None
    key = _adamw_key(ctx.attrs)
    lr, step = _flat(inputs[0]), _flat(inputs[1])
    s1, s2 = _scratch_pair(ctx, inputs[2].dtype)
    pieces = _adamw_pieces(*inputs[2:6], *outputs[:3], s1, s2)  # type: ignore[call-arg]  # mypy: *list fills all

    if not all(isinstance(piece, (_FusedRange, _PooledRanges)) for part in pieces for piece in part):
        def run(ctx, inputs, outputs):
            _adamw_parts(np, _adamw_constant_arrays(key, float(lr[0]), int(step[0])), pieces)

        return run
    # the fused loop: the node's own constants, its learning rate written in as it runs (the
    # loop makes the bias corrections: no step's constants to make, ~10-25 us a step)
    vector = _loop_constants(_adamw_fixed(key, float(lr[0])))
    c = {"vector_address": int(vector.ctypes.data), "mode": int(ctx.attrs.get("adam_mode", 0)), "step": 0}

    def run_fused(ctx, inputs, outputs):
        vector[0] = lr[0]
        c["step"] = int(step[0])
        _adamw_parts(np, c, pieces)

    return run_fused


@kernel("AdamWUpdate", OURS, overwrites={0: (2,), 1: (4,), 2: (5,)}, updates_state=True,
        scratch=_chunk_scratch(2, slice(2, 3)), bind=_bind_adamw_update)
def adamw_update(ctx: KernelContext, inputs: list, outputs: list) -> None:
    """One parameter of the interleaved optimizer: (lr, step, p, g, m, v) -> (p', m', v')."""
    _check_mode(ctx.attrs)
    c = adamw_constants(ctx.attrs, float(inputs[0].reshape(-1)[0]), int(inputs[1].reshape(-1)[0]))
    s1, s2 = _scratch_pair(ctx, inputs[2].dtype)
    _adamw_one(ctx.xp, c, *inputs[2:6], *outputs[:3], s1, s2)  # type: ignore[call-arg]  # mypy: *list fills all


# ---- SGD ---------------------------------------------------------------------------------

def _sgd_pieces(p, g, p_out, s, xp=np) -> list[list[tuple]]:
    """Per part and chunk of one parameter: (g, p, p', t) flat views, t the scratch."""
    return _parts([g, p, p_out], [s], xp, passes=2)


def _sgd_parts(xp, neg_lr, parts: list[list[tuple]]) -> None:
    """w' = w + (-lr g), as ORT's SGDOptimizerV2 computes it, each part on its own thread."""
    def one(pieces):
        def go():
            for gc, pc, pco, t in pieces:
                xp.multiply(gc, neg_lr, out=t)
                xp.add(pc, t, out=pco)
        return go

    parallel.run([one(pieces) for pieces in parts])


def _sgd_one(xp, lr, p, g, p_out, s) -> None:
    _sgd_parts(xp, -lr, _sgd_pieces(p, g, p_out, s, xp))


def _scratch_one(ctx: KernelContext, dtype):
    n = ctx.scratch.size // np.dtype(dtype).itemsize if ctx.scratch is not None else 0
    return ctx.scratch_array(0, (n,), dtype)


@kernel("SGDOptimizerV2", MS, overwrites=optimizer_overwrites(1), updates_state=True,
        scratch=_chunk_scratch(1, slice(1, None)))
def sgd_optimizer_v2(ctx: KernelContext, inputs: list, outputs: list) -> None:
    """Flattened SGDOptimizerV2: [lr, p.., g..] -> [flag, p'..]."""
    k = int(ctx.attrs["num_params"])
    lr = np.float32(_xp.host_scalar(inputs[0]))
    s = _scratch_one(ctx, inputs[1].dtype)
    for i in range(k):
        _sgd_one(ctx.xp, lr, inputs[1 + i], inputs[1 + k + i], outputs[1 + i], s)
    if outputs[0] is not None:
        outputs[0].fill(True)


def _bind_sgd_update(ctx: KernelContext, inputs: list, outputs: list):
    """_sgd_one with the views made once."""
    if ctx.xp is not np:
        return None
    lr = _flat(inputs[0])
    pieces = _sgd_pieces(inputs[1], inputs[2], outputs[0], _scratch_one(ctx, inputs[1].dtype))

    def run(ctx, inputs, outputs):
        _sgd_parts(np, -np.float32(lr[0]), pieces)

    return run


@kernel("SGDUpdate", OURS, overwrites={0: (1,)}, updates_state=True, scratch=_chunk_scratch(1, slice(1, 2)),
        bind=_bind_sgd_update)
def sgd_update(ctx: KernelContext, inputs: list, outputs: list) -> None:
    """One parameter of the interleaved optimizer: (lr, p, g) -> p'."""
    lr = np.float32(_xp.host_scalar(inputs[0]))
    _sgd_one(ctx.xp, lr, inputs[1], inputs[2], outputs[0], _scratch_one(ctx, inputs[1].dtype))


@kernel("InPlaceAccumulator", MS, overwrites={0: (0, 1)})
def in_place_accumulator(ctx: KernelContext, inputs: list, outputs: list) -> None:
    """(old sum, value, do update?) -> old sum + value, or the old sum unchanged when the flag is false."""
    xp, old, value, out = ctx.xp, inputs[0], inputs[1], outputs[0]
    update = len(inputs) < 3 or inputs[2] is None or bool(inputs[2].reshape(-1)[0])
    if update:
        xp.add(old, value, out=out)
    elif not _same(out, old):
        xp.copyto(out, old)


@kernel("ZeroGradient", MS, overwrites={0: (0,)})
def zero_gradient(ctx: KernelContext, inputs: list, outputs: list) -> None:
    """(gradient, reset signal) -> zeros of the gradient's shape."""
    outputs[0].fill(0)
