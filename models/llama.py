"""A LLaMA-style decoder of any depth from plain ONNX ops: large training steps for planning.

Not in the zoo (the CI gate plans every zoo model); `benchmarks/plan_large.py` picks the
number of layers that reaches a wanted step-graph size.
"""

from __future__ import annotations

import math

import numpy as np

from onnxplan.forward.spec import ForwardModel
from onnxplan.models._graph import GraphBuilder

__all__ = ["build_llama"]


def _rmsnorm(g: GraphBuilder, x: str, d: int, name: str, eps: float = 1e-6) -> str:
    """x / sqrt(mean(x^2, last axis) + eps) * weight (no bias, no mean subtraction)."""
    w = g.param(f"{name}.weight", np.ones(d, np.float32))
    ms = g.node("ReduceMean", [g.node("Mul", [x, x], name=f"{name}.sq")], name=f"{name}.ms", axes=[-1], keepdims=1)
    eps_c = g.const("rms_eps", np.array(eps, np.float32))
    rms = g.node("Sqrt", [g.node("Add", [ms, eps_c], name=f"{name}.eps")], name=f"{name}.sqrt")
    return g.node("Mul", [g.node("Div", [x, rms], name=f"{name}.div"), w], name=f"{name}.scale")


def _rotary(g: GraphBuilder, x: str, cos: str, sin: str, half: int, name: str) -> str:
    """x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x[..., h:], x[..., :h])."""
    lo = g.node("Slice", [x, g.const("starts", np.array([0], np.int64)), g.const("ends", np.array([half], np.int64)),
                          g.const("axes", np.array([3], np.int64))], name=f"{name}.lo")
    hi = g.node("Slice", [x, g.const("starts", np.array([half], np.int64)),
                          g.const("ends", np.array([2 * half], np.int64)), g.const("axes", np.array([3], np.int64))],
                name=f"{name}.hi")
    rot = g.node("Concat", [g.node("Neg", [hi], name=f"{name}.neg"), lo], name=f"{name}.rot", axis=-1)
    return g.node("Add", [g.node("Mul", [x, cos], name=f"{name}.cos"), g.node("Mul", [rot, sin], name=f"{name}.sin")],
                  name=f"{name}.rope")


def _attention(g: GraphBuilder, x: str, batch: int, seq: int, d: int, heads: int, name: str,
               mask: str, cos: str, sin: str) -> str:
    """Causal multi-head attention, rotary embeddings on q and k, no biases."""
    dh = d // heads
    split = g.shape_const([batch, seq, heads, dh])

    def proj(kind: str) -> str:
        w = g.param(f"{name}.{kind}.weight", g.normal((d, d), math.sqrt(1.0 / d)))
        h = g.node("Reshape", [g.node("MatMul", [x, w], name=f"{name}.{kind}"), split], name=f"{name}.{kind}_split")
        return g.node("Transpose", [h], name=f"{name}.{kind}_heads", perm=[0, 2, 1, 3])  # [B, H, S, Dh]

    q = _rotary(g, proj("q"), cos, sin, dh // 2, f"{name}.q")
    k = _rotary(g, proj("k"), cos, sin, dh // 2, f"{name}.k")
    v = proj("v")
    k_t = g.node("Transpose", [k], name=f"{name}.k_t", perm=[0, 1, 3, 2])
    scale = g.const("attn_scale", np.array(1.0 / math.sqrt(dh), np.float32))
    scores = g.node("Mul", [g.node("MatMul", [q, k_t], name=f"{name}.qk"), scale], name=f"{name}.scale")
    scores = g.node("Add", [scores, mask], name=f"{name}.mask")
    probs = g.node("Softmax", [scores], name=f"{name}.softmax", axis=-1)
    ctx = g.node("Transpose", [g.node("MatMul", [probs, v], name=f"{name}.pv")], name=f"{name}.ctx_t",
                 perm=[0, 2, 1, 3])
    ctx = g.node("Reshape", [ctx, g.shape_const([batch, seq, d])], name=f"{name}.ctx_merge")
    wo = g.param(f"{name}.o.weight", g.normal((d, d), math.sqrt(1.0 / d)))
    return g.node("MatMul", [ctx, wo], name=f"{name}.o")


def _swiglu(g: GraphBuilder, x: str, d: int, ff: int, name: str) -> str:
    """down(silu(gate(x)) * up(x)), silu(z) = z * sigmoid(z)."""
    wg = g.param(f"{name}.gate.weight", g.normal((d, ff), math.sqrt(1.0 / d)))
    wu = g.param(f"{name}.up.weight", g.normal((d, ff), math.sqrt(1.0 / d)))
    wd = g.param(f"{name}.down.weight", g.normal((ff, d), math.sqrt(1.0 / ff)))
    gate = g.node("MatMul", [x, wg], name=f"{name}.gate")
    silu = g.node("Mul", [gate, g.node("Sigmoid", [gate], name=f"{name}.sigmoid")], name=f"{name}.silu")
    h = g.node("Mul", [silu, g.node("MatMul", [x, wu], name=f"{name}.up")], name=f"{name}.glu")
    return g.node("MatMul", [h, wd], name=f"{name}.down")


def build_llama(batch: int = 2, loss: str = "ce", layers: int = 4, seq: int = 32, d_model: int = 64,
                heads: int = 4, ff: int = 176, vocab: int = 256) -> ForwardModel:
    """Decoder-only LM with LLaMA blocks: x + attn(RMSNorm(x)) with rotary q/k and a causal
    mask, then + SwiGLU(RMSNorm(.)); final RMSNorm, untied LM head, logits [batch*seq, vocab]
    with next-token ce labels. Token embedding only (positions come from the rotary angles,
    base 10000). Defaults are small (batch 2, seq 32, d 64, 4 heads, FF 176, vocab 256) so
    that depth, not width, sets the size of the step graph.
    """
    g = GraphBuilder(f"llama-{layers}l", seed=0)
    ids = g.input("input_ids", "int64", (batch, seq), 0, vocab)
    tok = g.param("tok_emb.weight", g.normal((vocab, d_model), 0.02))
    h = g.node("Gather", [tok, ids], name="tok_emb", axis=0)
    dh = d_model // heads
    inv = 1.0 / (10000.0 ** (np.arange(0, dh, 2, dtype=np.float64) / dh))
    ang = np.outer(np.arange(seq, dtype=np.float64), inv)
    ang = np.concatenate([ang, ang], axis=-1)  # [seq, dh]
    cos = g.const("rope_cos", np.cos(ang).astype(np.float32))
    sin = g.const("rope_sin", np.sin(ang).astype(np.float32))
    mask = g.const("causal_mask", np.triu(np.full((seq, seq), -1e9, np.float32), k=1))
    for i in range(layers):
        name = f"layer{i}"
        a = _attention(g, _rmsnorm(g, h, d_model, f"{name}.attn_norm"), batch, seq, d_model, heads,
                       f"{name}.attn", mask, cos, sin)
        h = g.node("Add", [h, a], name=f"{name}.res1")
        m = _swiglu(g, _rmsnorm(g, h, d_model, f"{name}.mlp_norm"), d_model, ff, f"{name}.mlp")
        h = g.node("Add", [h, m], name=f"{name}.res2")
    h = _rmsnorm(g, h, d_model, "norm_f")
    h = g.node("Reshape", [h, g.shape_const([batch * seq, d_model])], name="flatten_tokens")
    wl = g.param("lm_head.weight", g.normal((d_model, vocab), math.sqrt(1.0 / d_model)))
    h = g.node("MatMul", [h, wl], name="lm_head")
    return g.forward(h, (batch * seq, vocab), loss, doc=build_llama.__doc__ or "")
