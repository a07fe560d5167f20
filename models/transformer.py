"""Small pre-LN transformers from plain ONNX ops: an encoder classifier and a causal GPT."""

from __future__ import annotations

import math

import numpy as np

from onnxplan.forward.spec import ForwardModel
from onnxplan.models._graph import GraphBuilder

__all__ = ["build_gpt", "build_transformer"]


def _embed(g: GraphBuilder, batch: int, seq: int, vocab: int, d: int) -> str:
    """Token embedding (Gather) plus a learned positional embedding [seq, d] (broadcast Add)."""
    ids = g.input("input_ids", "int64", (batch, seq), 0, vocab)
    tok = g.param("tok_emb.weight", g.normal((vocab, d), 0.02))
    pos = g.param("pos_emb.weight", g.normal((seq, d), 0.02))
    return g.node("Add", [g.node("Gather", [tok, ids], name="tok_emb", axis=0), pos], name="emb_add")


def _attention(g: GraphBuilder, x: str, batch: int, seq: int, d: int, heads: int, name: str,
               mask: str | None) -> str:
    """Multi-head self-attention with MatMul/Transpose/Reshape/Softmax, optional additive mask.

    x [B, S, D] -> q, k, v [B, H, S, Dh]; scores q @ k^T / sqrt(Dh) [B, H, S, S]
    (+ mask [S, S]); softmax over the last axis; @ v; back to [B, S, D]; output projection.
    """
    dh = d // heads
    split = g.shape_const([batch, seq, heads, dh])
    merge = g.shape_const([batch, seq, d])

    def proj(kind: str, perm: list[int]) -> str:
        h = g.linear(x, d, d, f"{name}.{kind}", gemm=False, gain=1.0)
        h = g.node("Reshape", [h, split], name=f"{name}.{kind}_split")
        return g.node("Transpose", [h], name=f"{name}.{kind}_heads", perm=perm)

    q = proj("q", [0, 2, 1, 3])
    k_t = proj("k", [0, 2, 3, 1])  # [B, H, Dh, S]
    v = proj("v", [0, 2, 1, 3])
    scale = g.const("attn_scale", np.array(1.0 / math.sqrt(dh), np.float32))
    scores = g.node("Mul", [g.node("MatMul", [q, k_t], name=f"{name}.qk"), scale], name=f"{name}.scale")
    if mask is not None:
        scores = g.node("Add", [scores, mask], name=f"{name}.mask")
    probs = g.node("Softmax", [scores], name=f"{name}.softmax", axis=-1)
    ctx = g.node("MatMul", [probs, v], name=f"{name}.pv")
    ctx = g.node("Transpose", [ctx], name=f"{name}.ctx_t", perm=[0, 2, 1, 3])
    ctx = g.node("Reshape", [ctx, merge], name=f"{name}.ctx_merge")
    return g.linear(ctx, d, d, f"{name}.out", gemm=False, gain=1.0)


def _block(g: GraphBuilder, x: str, batch: int, seq: int, d: int, heads: int, ff: int,
           name: str, mask: str | None) -> str:
    """Pre-LN block: x + attn(LN(x)), then + FF(LN(.)) with FF = Linear-GELU-Linear."""
    a = _attention(g, g.layernorm(x, d, f"{name}.ln1"), batch, seq, d, heads, f"{name}.attn", mask)
    x = g.node("Add", [x, a], name=f"{name}.res1")
    h = g.linear(g.layernorm(x, d, f"{name}.ln2"), d, ff, f"{name}.ff1", gemm=False)
    h = g.linear(g.gelu(h, f"{name}.gelu"), ff, d, f"{name}.ff2", gemm=False, gain=1.0)
    return g.node("Add", [x, h], name=f"{name}.res2")


def build_transformer(batch: int = 16, loss: str = "ce", layers: int = 2, seq: int = 64,
                      d_model: int = 128, heads: int = 4, ff: int = 512, vocab: int = 1000,
                      classes: int = 10) -> ForwardModel:
    """Encoder classifier: embeddings, `layers` pre-LN blocks, final LN, mean-pool, linear head.

    Defaults: batch 16, seq 64, d_model 128, 4 heads, FF 512 (exact GELU from Erf), vocab
    1000, 2 layers, 10 classes. Input `input_ids` int64 [batch, seq] in [0, vocab); output
    `logits` float32 [batch, classes]. Parameters (defaults): 136,192 embeddings +
    198,272 per layer + 256 final LN + 1,290 head = 534,282.
    """
    g = GraphBuilder("transformer" if layers == 2 else f"transformer-{layers}l", seed=0)
    h = _embed(g, batch, seq, vocab, d_model)
    for i in range(layers):
        h = _block(g, h, batch, seq, d_model, heads, ff, f"layer{i}", mask=None)
    h = g.layernorm(h, d_model, "ln_f")
    h = g.node("ReduceMean", [h], name="mean_pool", axes=[1], keepdims=0)  # [B, D]
    h = g.linear(h, d_model, classes, "head", gain=1.0)
    return g.forward(h, (batch, classes), loss, doc=build_transformer.__doc__ or "")


def build_gpt(batch: int = 16, loss: str = "ce", layers: int = 2, seq: int = 64,
              d_model: int = 128, heads: int = 4, ff: int = 512, vocab: int = 1000) -> ForwardModel:
    """Decoder-only language model: causal mask (a constant [seq, seq] of 0 / -1e9 added to
    the scores before Softmax), `layers` pre-LN blocks, final LN, LM head, and the logits
    reshaped to [batch*seq, vocab] so the ce labels are next-token ids [batch*seq].

    Defaults as `transformer` (batch 16, seq 64, d_model 128, 4 heads, FF 512, vocab 1000,
    2 layers). Input `input_ids` int64 [batch, seq]; output `logits` float32
    [batch*seq, vocab]. Parameters (defaults): 136,192 + 2 * 198,272 + 256 + 129,000
    (untied LM head) = 661,992.
    """
    g = GraphBuilder("gpt" if layers == 2 else f"gpt-{layers}l", seed=0)
    h = _embed(g, batch, seq, vocab, d_model)
    causal = np.triu(np.full((seq, seq), -1e9, np.float32), k=1)
    mask = g.const("causal_mask", causal)
    for i in range(layers):
        h = _block(g, h, batch, seq, d_model, heads, ff, f"layer{i}", mask=mask)
    h = g.layernorm(h, d_model, "ln_f")
    h = g.node("Reshape", [h, g.shape_const([batch * seq, d_model])], name="flatten_tokens")
    h = g.linear(h, d_model, vocab, "lm_head", gain=1.0)
    return g.forward(h, (batch * seq, vocab), loss, doc=build_gpt.__doc__ or "")
