"""Random ops and their gradients: Dropout, com.microsoft BitmaskDropout, DropoutGrad,
BitmaskDropoutGrad, RandomUniformLike, RandomNormalLike.

Every random value comes from one place, the executor's Randomness (ctx.random): normally a
seeded generator (reset with the state, so a run is reproducible); when verifying against ONNX
Runtime, the values ONNX Runtime drew for that node in the same step (`given`), so both sides
compute with the same random numbers. Dropout draws its keep-mask (bool, or bit-packed for
BitmaskDropout); the Random*Like ops draw their output. Draws happen on the host (numpy) and
are uploaded: the same seed gives the same numbers on numpy and CuPy."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from onnxplan.ir.graph import original_name
from onnxplan.kernels import _xp
from onnxplan.kernels.registry import KernelContext, KernelFn, declare, kernel

__all__ = ["DEFAULT_SEED", "Randomness", "pack_bitmask", "recompute_draws", "unpack_bitmask"]

MS = "com.microsoft"
DEFAULT_SEED = 0
BITS = 32  # ORT's BitmaskDropout packs the keep-mask into uint32 words, element i at bit i % 32
DRAW_BLOCK = 1 << 16  # keep-mask elements drawn at a time (even: a block takes whole 64-bit draws); its
# raw words (256 KiB) are host memory outside the plan, so a block stays small (GPT-2 small's attention
# Dropouts at 1 << 20: 4 MiB of words each, beside a tensor-sized mask: measured 8 MiB over its plan)


class Randomness:
    """The random values of one executor. `given[node name]` (a host array: the keep-mask of a
    Dropout, bool or bit-packed; the output of a Random*Like op) overrides the generator for
    that node in the next step; `drawn[node name]` records what each random node used."""

    def __init__(self, seed: int = DEFAULT_SEED) -> None:
        self.seed = seed
        self.given: dict[str, np.ndarray] = {}
        self.drawn: dict[str, np.ndarray] = {}
        # the nodes whose draws are kept through the step (None: every node's): those a
        # recomputed copy draws again (Executor: recompute_draws). A kept draw is host memory
        # outside the plan, a tensor's size each (GPT-2 small's 37 Dropouts: ~70 MiB, measured
        # 86 MiB over its plan before); the others are dropped once their node has run
        self.keep: frozenset[str] | None = None
        self.reset()

    def reset(self) -> None:
        self.gen = np.random.default_rng(self.seed)
        self.drawn.clear()

    def new_step(self) -> None:
        self.drawn.clear()

    def draw(self, node_name: str, make, into: np.ndarray | None = None) -> np.ndarray:
        """The host array for `node_name`: the given one, else what this node (or the node it
        is a recomputed copy of, `NAME@rcK`) drew earlier in this step, else make(generator,
        into). `into`: a host array make may draw straight into (the node's own output), offered
        only for a draw not kept through the step (else make gets None and allocates its own)."""
        key = original_name(node_name)
        value = self.given.get(key)
        if value is None:
            value = self.drawn.get(key)
        kept = self.keep is None or key in self.keep
        if value is None:
            value = make(self.gen, None if kept else into)
        if kept:
            self.drawn[key] = value
        return value


def recompute_draws(node_names) -> frozenset[str]:
    """The random nodes a step's recomputed copies (`NAME@rcK`) draw again: the draws to keep."""
    return frozenset(original_name(n) for n in node_names if original_name(n) != n)


_FALLBACK = Randomness()


def _random(ctx) -> Randomness:
    return ctx.random if ctx.random is not None else _FALLBACK


def pack_bitmask(keep: np.ndarray) -> np.ndarray:
    """Bool keep-mask -> uint32 words, element i at bit i % 32 of word i // 32 (ORT's layout)."""
    flat = np.asarray(keep, dtype=bool).reshape(-1)
    words = -(-flat.size // BITS)
    padded = np.zeros(words * BITS, dtype=np.uint64)
    padded[:flat.size] = flat
    weights = np.uint64(1) << np.arange(BITS, dtype=np.uint64)
    return (padded.reshape(words, BITS) * weights).sum(axis=1).astype(np.uint32)


def unpack_bitmask(xp: Any, words: Any, size: int) -> Any:
    """uint32 words -> the first `size` bits as a bool array (on xp)."""
    bits = (words.reshape(-1, 1) >> xp.arange(BITS, dtype=xp.uint32)) & xp.uint32(1)
    return bits.reshape(-1)[:size].astype(bool)


def _ratio_and_mode(ctx, inputs) -> tuple[float, bool]:
    ratio = _xp.host_scalar(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else 0.5
    training = bool(_xp.host_scalar(inputs[2])) if len(inputs) > 2 and inputs[2] is not None else False
    return float(ratio), training


def _keep_threshold(ratio: float) -> int:
    """The uint32 threshold of ORT's rule `uniform >= ratio` for a uniform u / 2**32 (u a raw
    32-bit draw): keep when u >= ceil(ratio * 2**32); 2**32 (keep nothing) for a ratio that rounds to 1."""
    return min(math.ceil(ratio * 2.0 ** 32), 2 ** 32)


def _keep_mask(ctx, shape, ratio: float, packed: bool, into: Any = None) -> np.ndarray:
    """ORT's rule: keep element i when uniform_i >= ratio, uniform_i = u_i / 2**32 from the raw
    32-bit words of the generator (two per 64-bit draw: half the time of Generator.random's
    float32 draws, which dominated Dropout at realistic sizes). `into`: the node's bool mask
    output, drawn into directly when the draw is not kept (Randomness.draw), so no host mask of
    the tensor's size is made beside it."""
    size = math.prod(int(d) for d in shape)  # np.prod costs ~10 us a call
    target = into if (not packed and isinstance(into, np.ndarray) and into.dtype == np.bool_
                      and into.size == size and into.flags.c_contiguous) else None

    def make(gen, out):
        threshold = _keep_threshold(ratio)
        keep = out.reshape(-1) if out is not None else np.zeros(size, dtype=bool)
        if threshold >= 2 ** 32:  # a ratio that rounds to 1: nothing kept (and nothing drawn)
            keep.fill(False)
        else:  # the raw words a block at a time (the same stream as one draw)
            for start in range(0, size, DRAW_BLOCK):
                n = min(DRAW_BLOCK, size - start)
                words = gen.bit_generator.random_raw(-(-n // 2)).view(np.uint32)[:n]
                np.greater_equal(words, np.uint32(threshold), out=keep[start:start + n])
        return pack_bitmask(keep) if packed else keep.reshape(shape)

    return _random(ctx).draw(ctx.node.name, make, target)


def _same_memory(a: Any, b: Any) -> bool:
    """`a` is `b`'s memory (a reshaped view of it): the draw went straight into the output."""
    return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.size == b.size and (
        a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def _dropout(ctx, inputs, outputs, ratio: float, training: bool, packed: bool) -> None:
    xp, x, y = ctx.xp, inputs[0], outputs[0]
    mask = outputs[1] if len(outputs) > 1 else None
    if not training or ratio == 0.0:
        if y is not x:
            xp.copyto(y, x)
        if mask is not None:
            mask.fill(0xFFFFFFFF if packed else True)
        return
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"ratio {ratio} outside [0, 1)")
    host = _keep_mask(ctx, x.shape, ratio, packed, into=mask)
    keep = xp.asarray(host)
    if mask is not None and not _same_memory(host, mask):
        mask[...] = keep.reshape(mask.shape)
    if packed:
        keep = unpack_bitmask(xp, keep, x.size).reshape(x.shape)
    scale = x.dtype.type(1.0 / (1.0 - ratio))
    xp.multiply(x, keep, out=y)
    xp.multiply(y, scale, out=y)


def _bind_dropout(ctx: KernelContext, inputs: list, outputs: list) -> KernelFn | None:
    """Dropout-12+ on numpy: the ratio and mode inputs read through flat views made once, then
    _dropout itself."""
    if ctx.xp is not np:
        return None
    ratio_in, mode_in = _xp.flat_input(inputs, 1), _xp.flat_input(inputs, 2)

    def run(ctx_: KernelContext, inputs_: list, outputs_: list) -> None:
        ratio = float(ratio_in[0]) if ratio_in is not None else 0.5
        training = bool(mode_in[0]) if mode_in is not None else False
        _dropout(ctx_, inputs_, outputs_, ratio, training, packed=False)

    return run


@kernel("Dropout", since=12, overwrites={0: (0,)}, random=True, draw_output=1, bind=_bind_dropout)
def _dropout_12(ctx, inputs, outputs):
    """Dropout-12+: y = x * keep / (1 - ratio) in training mode, else y = x and keep all."""
    ratio, training = _ratio_and_mode(ctx, inputs)
    _dropout(ctx, inputs, outputs, ratio, training, packed=False)


@kernel("Dropout", since=7, until=11, overwrites={0: (0,)}, random=True, draw_output=1)
def _dropout_7(ctx, inputs, outputs):
    """Dropout before opset 12 has no training mode: the identity, every element kept."""
    _dropout(ctx, inputs, outputs, 0.0, False, packed=False)


@kernel("BitmaskDropout", MS, overwrites={0: (0,)}, random=True, draw_output=1)
def _bitmask_dropout(ctx, inputs, outputs):
    """As Dropout, the keep-mask packed in uint32 words."""
    ratio, training = _ratio_and_mode(ctx, inputs)
    _dropout(ctx, inputs, outputs, ratio, training, packed=True)


def _dropout_grad(ctx, inputs, outputs, packed: bool, ratio: float | None = None) -> None:
    """dX = dY * keep / (1 - ratio), as ONNX Runtime's kernel: whatever training_mode says (in
    inference mode the forward kept every element, so the mask is all ones). `ratio`: input 2's
    value, when read already."""
    xp, dy, dx = ctx.xp, inputs[0], outputs[0]
    if ratio is None:
        ratio = _xp.host_scalar(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else 0.5
    if ratio == 0.0:
        if dx is not dy:
            xp.copyto(dx, dy)
        return
    keep = inputs[1]
    if packed:
        keep = unpack_bitmask(xp, keep, dy.size).reshape(dy.shape)
    xp.multiply(dy, keep, out=dx)
    xp.multiply(dx, dy.dtype.type(1.0 / (1.0 - float(ratio))), out=dx)


def _bind_dropout_grad(ctx: KernelContext, inputs: list, outputs: list) -> KernelFn | None:
    """DropoutGrad on numpy: the ratio input read through a flat view made once, then _dropout_grad."""
    if ctx.xp is not np:
        return None
    ratio_in = _xp.flat_input(inputs, 2)

    def run(ctx_: KernelContext, inputs_: list, outputs_: list) -> None:
        _dropout_grad(ctx_, inputs_, outputs_, False, ratio_in[0].item() if ratio_in is not None else 0.5)

    return run


@kernel("DropoutGrad", MS, overwrites={0: (0,)}, bind=_bind_dropout_grad)
def _dropout_grad_kernel(ctx, inputs, outputs):
    _dropout_grad(ctx, inputs, outputs, packed=False)


@kernel("BitmaskDropoutGrad", MS, overwrites={0: (0,)})
def _bitmask_dropout_grad(ctx, inputs, outputs):
    _dropout_grad(ctx, inputs, outputs, packed=True)


def _random_like(ctx, outputs, sample) -> None:
    y = outputs[0]
    host = _random(ctx).draw(ctx.node.name, lambda gen, _into: sample(gen, y.shape).astype(y.dtype))
    y[...] = ctx.xp.asarray(host).reshape(y.shape)


@kernel("RandomUniformLike", random=True, draw_output=0)
def _random_uniform_like(ctx, inputs, outputs):
    """Uniform in [low, high), the shape of the input, dtype from `dtype` or the input."""
    low, high = float(ctx.attrs.get("low", 0.0)), float(ctx.attrs.get("high", 1.0))
    _random_like(ctx, outputs, lambda gen, shape: gen.uniform(low, high, shape))


@kernel("RandomNormalLike", random=True, draw_output=0)
def _random_normal_like(ctx, inputs, outputs):
    """Normal(mean, scale), the shape of the input, dtype from `dtype` or the input."""
    mean, scale = float(ctx.attrs.get("mean", 0.0)), float(ctx.attrs.get("scale", 1.0))
    _random_like(ctx, outputs, lambda gen, shape: gen.normal(mean, scale, shape))


# Random ops without a kernel here, declared so that planning knows they draw at random (a stage
# holding one is never recomputed); running them is refused as for any op without a kernel.
# The gradients (DropoutGrad, BitmaskDropoutGrad) read the forward's mask: they are not random.
for _op, _domain, _draw in (("RandomNormal", "", 0), ("RandomUniform", "", 0), ("Multinomial", "", 0),
                            ("Bernoulli", "", 0), ("BiasDropout", MS, 1), ("BitmaskBiasDropout", MS, 1)):
    declare(_op, _domain, random=True, draw_output=_draw)
