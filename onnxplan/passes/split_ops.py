"""What the split pass (passes/split.py) splits, how, and why not: the ops, the kind of split each
makes, the inputs a chunk reads a piece of, and the one-line refusal (issue 28).

Three kinds of split, all along the leading axis (every piece one contiguous byte range):
  - rows (KIND_ROWS): chunk k makes rows [k R/K, (k+1) R/K) of the output (R its leading rows)
    from the same rows of its sliced inputs; any other input is read whole. The elementwise and
    row-wise ops (SPLITTABLE_OPS), and the products over the rows of the left operand (MatMul,
    com.microsoft FusedMatMul without a batch-axis transpose, Gemm with transA = 0: each chunk
    reads its rows of A, the whole B, writes its rows of Y; a batched product of rank >= 3 also
    slices a B of the output's rank along the batch). A product whose left operand is batched
    and whose right one is not (A [B, S, M] x B [M, N], no transA: GPT-2's LM head) splits over
    the flattened rows where K does not divide the batch (`flattens`, `piece_shape`): piece j of
    A [B, S, M] is rows [j B*S/K, (j+1) B*S/K) of [B*S, M], the same byte range (views of the
    arena, shared with the views Reshape / Flatten of the same bytes), so the dW product over the
    [B*S, .] views (Gemm transA = 1) sums K row chunks as below. A chunk computes each row from the same
    inputs as the whole node; the bits may still differ where BLAS blocks fewer rows differently
    (the kernel cuts a product for the compute threads by its size, kernels/matmul.py): the
    tolerance is float32 rounding of one dot product, tests/test_split_products.py.
    Convolutions over the batch (Conv, onnxplan.ConvGradInput: split-grad's dX half) are rows
    too: chunk k reads its images of X (or dY) and the whole W, writes its images of Y (dX,
    `x_shape` its images' shape); the im2col scratch is the chunk's (its images' columns),
    so it shrinks with K; each image from the same products (tested within 4 ulps: the kernel
    cuts its GEMMs by size).
  - view (KIND_VIEW): Reshape / Flatten / Squeeze / Unsqueeze of a tensor whose rows (in and
    out: the leading axis, or the flattened rows, piece_shape) K divides: piece k of the output
    is piece k of the input under the piece's shape (the same bytes: a read-only view of the
    input piece, as realize makes the whole).
  - accumulate (KIND_ACCUMULATE): the output is a sum over the leading rows R of the sliced
    inputs, so it is not split: the K chunks each read their rows and add into a running whole
    output. Gemm with transA = 1, transB = 0 (dW = A^T dY, A [R, M], dY [R, N]): chunk 0 is
    Gemm(A_0, dY_0 [, C]) with the node's own C and beta, chunk k > 0 is Gemm(A_k, dY_k,
    acc_{k-1}) with beta 1; ReduceSum over axes that include axis 0 (a bias gradient): chunk k
    is ReduceSum(X_k) -> part_k, then Add(acc_{k-1}, part_k) (in place where the in-place pass
    lets it). A Gemm's chunks are onnxplan.GemmAdd (kernels/split_chunks.py: by blocks of
    rows), chunk k > 0 adding into the sum so far in place where the in-place pass lets it: one
    dW-sized buffer. The summation order changes (K
    partial sums added in chunk order): not the same bits; the tolerance (a few float32 ulps of
    the sum of |terms|) is tested against the unsplit kernel (tests/test_split_products.py) and
    against ONNX Runtime by `run --verify`.
  - channels (KIND_CHANNELS): a ConvGrad making dW only (split_grad's dW half, no dB, group 1)
    over dW's output channels: chunk k makes dW[k M/K : (k+1) M/K] (a piece of dW: a byte range)
    from dY's channels k M/K .. (k+1) M/K, copied out of dY whole (PieceRows along axis 1, M/K of
    its channels) and X whole: onnxplan.ConvGradWeight (ConvGrad's kernel with dW requested and
    W's piece shape as `w_shape`: W itself is not read, kernels/conv_grad_weight.py). Each
    output channel's dW is summed over the same images and positions in the same order by the
    same GEMM on fewer rows: same bits unless BLAS blocks fewer rows otherwise (tested). Its
    im2col scratch is X's whole (the columns do not depend on the output channels), each chunk
    makes it again: the least machinery that puts W and dW (9 MiB each at resnet18's layer4)
    out of the working set, dW a piece of 9/K MiB; over the batch dW would stay whole.
  - a loss over rows (KIND_ROWS, LOSS_OPS): SoftmaxCrossEntropyLoss (reduction mean or sum) and
    com.microsoft SoftmaxCrossEntropyLossGrad over the rows of the scores (log_prob): chunk k is
    onnxplan.SoftmaxCrossEntropyLossRows (...GradRows) with `start`, `stop` its rows; it reads its
    rows of the scores (log_prob), the labels (and class weights) whole (8 KiB at GPT-2 small:
    the mean's denominator, the kept labels' summed weights, is the whole step's), writes its
    rows of log_prob (dlogits); the forward's loss is a sum over the rows (summed_outputs): chunk
    k's share (its rows' sum, over the whole denominator for mean) added in chunk order
    (passes/split.py's _Sums). ignore_index and the class weights act per row (implemented: the
    same kernel); reduction 'none' is refused (its per-row losses, 4 B a row, are pieces off the
    page); the Internal forms (ignore_index as an input, the gradient's bias) are not LOSS_OPS. The
    gradient gives the same bits; the loss sums its terms in another order (K partial sums added
    in chunk order): within a few float32 ulps of the sum of |terms| (tests/test_split_loss.py).
  - a table over its rows (KIND_TABLE, TABLE_OPS): Gather (axis 0) and com.microsoft GatherGrad
    (axis 0) over the rows of the table (the Gather's data; GatherGrad's dW): chunk k owns table
    rows [a_k, b_k) (table_rows: ceil(R/K) rounded up to whole pages of rows, the last the rest,
    so the ranges partition [0, R) and every piece is a whole number of pages; pieces flat, as
    flat_elems). Gather: chunk k is onnxplan.GatherRows (kernels/split_chunks.py) reading its
    rows of the table (a homed parameter's by range from its home: its optimizer update must be
    split too) and the indices whole, writing the output positions whose index falls in its
    rows; the output is whole and live across the chunks (chunk 0 makes it, chunk k > 0 writes
    into the output so far, in place where the in-place pass lets it: passes/split.py's _Sums),
    every position written by exactly one chunk: a copy, the same bits. GatherGrad: chunk k is
    onnxplan.GatherGradRows making dW rows [a_k, b_k) (a piece, zeroed by its chunk) from the
    indices and dY whole, each row's updates added in the order of the indices as the whole
    kernel adds them: the same bits. Negative indices are normalized (i + R); an index out of
    [-R, R) raises in the chunk as in the whole kernel. Refused: another axis (one line), a
    persistent table no split update homes, a K leaving a chunk no rows.
  - flat: an optimizer update (or an elementwise op none of whose inputs broadcasts, and whose
    rows split in no K up to MAX_K) whose leading axis does not split in K (its rows, or its pieces' pages) splits over its flattened
    tensors (flat_elems): pieces of E elements, E a whole number
    of pages, the last the rest (ending its slot); elementwise, the same bits.
Refused (why_not, one line): any other op; a softmax across the split axis; a product with a
transposed left operand of rank 2 (its output rows are A's columns) or a batch-axis transpose; a
Gemm accumulation with transB; a reduction that keeps axis 0; a node that aliases an input
(views excepted) or has control dependencies; a K that does not divide the rows or leaves a
piece off a page boundary (unless the piece is at least OFF_PAGE_MIN bytes: its partial end pages are moved
by read-modify-write, executor/piece_io.py); a persistent sliced input of a node that is not an
update.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from onnxplan.ir.graph import Node, StepGraph
from onnxplan.passes.interleave import UPDATE_OPS
from onnxplan.passes.realize import READ_ONLY_VIEW_OPS

__all__ = ["KIND_ACCUMULATE", "KIND_CHANNELS", "KIND_ROWS", "KIND_TABLE", "KIND_VIEW", "TABLE_OPS", "LOSS_OPS", "MATMUL_OPS", "MAX_K", "NORM_GRAD_OPS", "OFF_PAGE_MIN",
           "PIECE_ALIGN", "ROW_COPY_MAX",
           "ROW_OPS", "SPLITTABLE_OPS", "CONV_OPS", "accumulate_axes", "chunk_attrs", "chunk_op", "copied_rows", "flat_elems", "flattens",
           "piece_shape", "sliced_inputs", "sliced_outputs", "split_kind",
           "split_rows", "summed_outputs", "table_rows", "table_update", "unread_inputs", "weight_gradient", "why_not"]

PIECE_ALIGN = 4096  # the swap store's page: a piece's byte offset in its slot is a multiple of it
# ... unless the piece is this large: its partial end pages cost a page read and write each
# (executor/piece_io.py), small against its bytes (GPT-2's logits: 50257-float rows, no whole
# number of pages in any K)
OFF_PAGE_MIN = 1 << 20
MAX_K = 16  # the most chunks a node is split in (each chunk a call, each piece a transfer)
MS = "com.microsoft"
KIND_ROWS, KIND_VIEW, KIND_ACCUMULATE, KIND_CHANNELS, KIND_TABLE = "rows", "view", "accumulate", "channels", "table"
_UNARY = ("Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Neg", "Abs", "Sqrt", "Reciprocal", "LeakyRelu",
          "Softplus", "Elu", "Selu", "HardSigmoid", "Sin", "Cos")
_BINARY = ("Add", "Sub", "Mul", "Div", "Pow", "Where", "Sum")
_MS_OPS = ("Gelu", "FastGelu", "QuickGelu", "BiasGelu", "GeluGrad", "FastGeluGrad", "QuickGeluGrad",
           "BiasGeluGrad_dX", "BiasFastGeluGrad_dX", "ReluGrad", "SigmoidGrad", "TanhGrad", "LeakyReluGrad")
# row-wise: a softmax over an axis other than the split one (and its gradient) reads and writes
# each row on its own
ROW_OPS = frozenset({("", "Softmax"), ("", "LogSoftmax"), (MS, "SoftmaxGrad_13"), (MS, "LogSoftmaxGrad_13"),
                     (MS, "SoftmaxGrad"), (MS, "LogSoftmaxGrad")})
# (domain, op): elementwise, so any rows of the output depend on the same rows of the inputs only
SPLITTABLE_OPS = frozenset({("", op) for op in (*_UNARY, *_BINARY)} | {(MS, op) for op in _MS_OPS} | ROW_OPS
                           | UPDATE_OPS)
MATMUL_OPS = frozenset({("", "MatMul"), (MS, "FusedMatMul"), ("", "Gemm")})
# convolutions over the batch: each image's output from its own image (and the whole W)
CONV_OPS = frozenset({("", "Conv"), ("onnxplan", "ConvGradInput")})
# normalization gradients over the last axes: dX by rows, dscale (and dbias) summed over the rows
NORM_GRAD_OPS = frozenset({(MS, "LayerNormalizationGrad"), (MS, "SimplifiedLayerNormalizationGrad")})
# a sliced input whose pieces are off the store's page (a norm's per-row mean, 4 KiB at
# transformer b16) is read whole and each chunk's rows copied (PieceRows), up to this size whole
ROW_COPY_MAX = 256 * 1024
_SUM = ("", "ReduceSum")
# a loss over rows (module docstring): the op -> its chunk's op (domain onnxplan), and the input
# each chunk reads its rows of (the scores; the gradient's log_prob)
LOSS_OPS = {("", "SoftmaxCrossEntropyLoss"): ("SoftmaxCrossEntropyLossRows", 0),
            (MS, "SoftmaxCrossEntropyLossGrad"): ("SoftmaxCrossEntropyLossGradRows", 1)}
# a table over its rows (module docstring): the op -> its chunk's op (domain onnxplan)
TABLE_OPS = {("", "Gather"): "GatherRows", (MS, "GatherGrad"): "GatherGradRows"}


def _shape(g: StepGraph, v: str) -> tuple[int, ...]:
    return g.values[v].known_spec.shape


def _known(g: StepGraph, v: str) -> bool:
    return bool(v) and v in g.values and g.values[v].spec is not None


def accumulate_axes(g: StepGraph, node: Node) -> tuple[int, ...] | None:
    """The axes a ReduceSum sums (normalized; None: its axes are not known statically, or it
    keeps them all)."""
    x = node.inputs[0] if node.inputs else ""
    if not _known(g, x):
        return None
    rank = len(_shape(g, x))
    if len(node.inputs) > 1 and node.inputs[1]:
        raw = g.initializers.get(node.inputs[1], g.folded.get(node.inputs[1]))
        if raw is None:
            return None
        axes = [int(a) for a in np.asarray(raw).reshape(-1)]
    else:
        axes = [int(a) for a in node.attrs.get("axes") or []]
    if not axes:
        return None if int(node.attrs.get("noop_with_empty_axes", 0)) else tuple(range(rank))
    return tuple(sorted({a % rank for a in axes})) if rank else ()


def weight_gradient(node: Node) -> bool:
    """A ConvGrad that makes dW only (split_grad's dW half without dB)."""
    outs = [*node.outputs, "", "", ""][:3]
    return node.key == (MS, "ConvGrad") and not outs[0] and bool(outs[1]) and not outs[2] and len(node.inputs) >= 3


def split_kind(g: StepGraph, node: Node) -> str:
    """The kind of split `node` makes (module docstring), "" when its op is not split."""
    if weight_gradient(node):
        return KIND_CHANNELS
    if node.key in TABLE_OPS:
        return KIND_TABLE
    if node.key in SPLITTABLE_OPS or node.key in LOSS_OPS:
        return KIND_ROWS
    if node.key in READ_ONLY_VIEW_OPS:
        return KIND_VIEW
    if node.key == ("", "Gemm") and int(node.attrs.get("transA", 0)):
        return KIND_ACCUMULATE
    if node.key in MATMUL_OPS or node.key in NORM_GRAD_OPS or node.key in CONV_OPS:
        return KIND_ROWS
    if node.key == _SUM:
        axes = accumulate_axes(g, node)
        return KIND_ACCUMULATE if axes and 0 in axes else ""
    return ""


def piece_shape(shape: tuple[int, ...], k: int) -> tuple[int, ...] | None:
    """The shape of each of the K pieces of a tensor of `shape` split by rows: its leading axis's
    K-th where K divides it; else, at rank >= 3, the K-th of its flattened rows (every axis but
    the last: [B, S, N] -> [B*S/K, N]). Either way piece j is bytes [j n/K, (j+1) n/K) of the
    contiguous tensor (n its bytes): the same range, so a piece made under one shape is read
    under the other (a view). None where neither divides."""
    if shape and shape[0] % k == 0:
        return (shape[0] // k, *shape[1:])
    if len(shape) >= 3 and math.prod(shape[:-1]) % k == 0:
        return (math.prod(shape[:-1]) // k, shape[-1])
    return None


def _flat_rows(shape: tuple[int, ...]) -> int:
    """The rows of a tensor over its flattened leading axes (every axis but the last, rank >= 3)."""
    return math.prod(shape[:-1]) if len(shape) >= 3 else (shape[0] if shape else 0)


def flattens(g: StepGraph, node: Node) -> bool:
    """Whether `node` splits over its output's flattened rows (piece_shape) where K does not
    divide its leading axis: a view (the same bytes), or a product whose left operand is batched
    and whose right one is not (MatMul, FusedMatMul without transA or a batch-axis transpose,
    A [..., S, M] x B [M, N]: the rows of a contiguous A [..., S, M] are the rows of
    [(...) S, M], each output row from its own row of A and the whole B; GPT-2's LM head, whose
    batch of 4 left each chunk the tied 50257 x 768 B whole beside a quarter of the logits)."""
    if split_kind(g, node) == KIND_VIEW:
        return True
    if node.key not in MATMUL_OPS or node.op_type == "Gemm" or len(node.inputs) < 2:
        return False
    if any(int(node.attrs.get(a, 0)) for a in ("transA", "transBatchA", "transBatchB")):
        return False
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
    if not all(_known(g, v) for v in (a, b, y)):
        return False
    out = _shape(g, y)
    return len(out) >= 3 and _shape(g, a)[:-1] == out[:-1] and len(_shape(g, b)) == 2


def split_rows(g: StepGraph, node: Node) -> int:
    """The rows the chunks divide: the output's leading axis (its flattened rows for a node that
    `flattens`), or for an accumulation the leading axis of what it sums over, for a table its
    rows (0 when unknown)."""
    if node.key in TABLE_OPS:
        table = _table(node)
        return _shape(g, table)[0] if _known(g, table) and _shape(g, table) else 0
    if split_kind(g, node) == KIND_ACCUMULATE or node.key in LOSS_OPS:
        ins = [*node.inputs, "", ""]
        x = ins[LOSS_OPS[node.key][1]] if node.key in LOSS_OPS else ins[0]
        return _shape(g, x)[0] if _known(g, x) and _shape(g, x) else 0
    out = next((o for o in node.outputs if o), "")
    if not _known(g, out) or not _shape(g, out):
        return 0
    return _flat_rows(_shape(g, out)) if flattens(g, node) else _shape(g, out)[0]


def _product_inputs(g: StepGraph, node: Node) -> list[str]:
    """A product's inputs each chunk reads a piece of: A of the output's rank; B where the
    output is batched (rank >= 3) and B is too; Gemm's C of rank 2 over the output's rows."""
    out = _shape(g, node.outputs[0])
    rows, rank = out[0], len(out)
    ins = [*node.inputs, "", ""]
    a, b, c = ins[0], ins[1], ins[2] if node.op_type == "Gemm" else ""
    picked = [a] if _known(g, a) and len(_shape(g, a)) == rank and _shape(g, a)[0] == rows else []
    if rank >= 3 and _known(g, b) and len(_shape(g, b)) == rank and _shape(g, b)[0] == rows:
        picked.append(b)
    if _known(g, c) and len(_shape(g, c)) == 2 and _shape(g, c)[0] == rows:
        picked.append(c)
    return picked if rows > 1 else []


def sliced_inputs(g: StepGraph, node: Node) -> list[str]:
    """The inputs of `node` that each chunk reads a piece of (by its kind; elementwise: the
    inputs of the output's rank and leading rows)."""
    kind = split_kind(g, node)
    if kind == KIND_VIEW:
        return [node.inputs[0]]
    if kind == KIND_CHANNELS:  # dY is copied by channels (channel_copies), X read whole
        return []
    if kind == KIND_TABLE:  # a Gather's table by rows, the indices whole; GatherGrad reads all whole
        return [node.inputs[0]] if node.op_type == "Gather" else []
    if kind == KIND_ACCUMULATE:
        return [node.inputs[0]] if node.key == _SUM else list(dict.fromkeys(node.inputs[:2]))
    if node.key in MATMUL_OPS:
        return list(dict.fromkeys(_product_inputs(g, node)))
    if node.key in LOSS_OPS:  # the scores (log_prob) by rows; the labels, weights and dY whole
        return [node.inputs[LOSS_OPS[node.key][1]]]
    if node.key in CONV_OPS:  # X (Conv) or dY (ConvGradInput) by images; W and a bias whole
        x, out = node.inputs[0], _shape(g, node.outputs[0])
        return [x] if _known(g, x) and len(_shape(g, x)) == len(out) and _shape(g, x)[0] == out[0] > 1 else []
    out = _shape(g, next(o for o in node.outputs if o))
    return [i for i in dict.fromkeys(node.inputs)
            if i and g.values[i].spec is not None and len(_shape(g, i)) == len(out) and _shape(g, i)[0] == out[0]
            and out[0] > 1]


def summed_outputs(g: StepGraph, node: Node) -> list[str]:
    """The outputs that are sums over the rows (made whole, added up chunk by chunk): an
    accumulation's output, a norm gradient's dscale and dbias."""
    if split_kind(g, node) == KIND_ACCUMULATE or node.key in (("", "SoftmaxCrossEntropyLoss"), ("", "Gather")):
        return [node.outputs[0]]  # (a Gather's output is made whole too: written chunk by chunk in place)
    return [o for o in node.outputs[1:] if o] if node.key in NORM_GRAD_OPS else []


def sliced_outputs(g: StepGraph, node: Node) -> list[str]:
    """The outputs each chunk makes a piece of (the others are summed_outputs)."""
    summed = summed_outputs(g, node)
    return [o for o in node.outputs if o and o not in summed]


def unread_inputs(g: StepGraph, node: Node) -> list[str]:
    """Inputs of `node` its chunks do not read: a dW ConvGrad's W (its chunks take their piece's
    shape as an attribute; the kernel reads only W's shape)."""
    return [node.inputs[2]] if split_kind(g, node) == KIND_CHANNELS else []


def copied_rows(g: StepGraph, node: Node, k: int) -> list[str]:
    """The sliced inputs whose pieces in `k` are off the store's page and that are small enough
    (ROW_COPY_MAX) to be read whole and copied by rows into each chunk's piece."""
    return [v for v in sliced_inputs(g, node) if (g.values[v].nbytes // k) % PIECE_ALIGN
            and g.values[v].nbytes <= ROW_COPY_MAX and _shape(g, v) and _shape(g, v)[0] % k == 0]


def _product_refusal(g: StepGraph, node: Node) -> str:
    """Why a product (MatMul, FusedMatMul, Gemm with transA = 0) does not split over its rows."""
    out = _shape(g, node.outputs[0])
    if node.op_type == "FusedMatMul" and (int(node.attrs.get("transBatchA", 0)) or int(node.attrs.get("transBatchB", 0))):
        return "a batch-axis transpose of an operand"
    if len(out) < 2:
        return "a product of rank < 2"
    if len(out) == 2 and int(node.attrs.get("transA", 0)):
        return "its left operand is transposed (the output's rows are its columns: a sum over its rows)"
    picked = _product_inputs(g, node)
    if not picked or (len(out) == 2 and node.inputs[0] not in picked):
        return "no operand is read by rows"
    return ""


def _accumulate_refusal(g: StepGraph, node: Node) -> str:
    """Why a sum over the leading rows (Gemm transA = 1, ReduceSum over axis 0) does not split."""
    ins = node.inputs[:1 if node.key == _SUM else 2]
    if not all(_known(g, i) and _shape(g, i) for i in ins):
        return "an input has no static shape"
    if node.op_type == "Gemm":
        if int(node.attrs.get("transB", 0)):
            return "Gemm's dW accumulation with transB (B's rows are not the summed axis)"
        if _shape(g, ins[0])[0] != _shape(g, ins[1])[0]:
            return "A and B differ in leading rows"
    return ""


def _loss_refusal(g: StepGraph, node: Node) -> str:
    """Why a loss (LOSS_OPS) does not split over its rows."""
    reduction = node.attrs.get("reduction", "mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else str(reduction)
    if reduction not in ("mean", "sum"):
        return f"a loss with reduction {reduction!r} (its per-row losses, 4 B a row, would be pieces off the page)"
    grad = node.op_type.endswith("Grad")
    scores, labels = node.inputs[LOSS_OPS[node.key][1]], node.inputs[2 if grad else 1]
    if not all(_known(g, v) for v in (scores, labels, node.outputs[0])):
        return "an input or output has no static shape"
    if len(_shape(g, scores)) < 2:
        return "scores of rank < 2"
    return ""


def _kind_refusal(g: StepGraph, node: Node, kind: str) -> str:
    """Why `node` of `kind` does not split in any K (its op, attributes and layout)."""
    if node.after or (node.aliases and kind != KIND_VIEW):
        return "the node aliases an input or has control dependencies"
    if node.key in LOSS_OPS:
        return _loss_refusal(g, node)
    if kind == KIND_ACCUMULATE:
        return _accumulate_refusal(g, node)
    if kind == KIND_CHANNELS:
        return "" if int(node.attrs.get("group", 1)) == 1 else "a grouped convolution (its dW channels are per group)"
    outs = sliced_outputs(g, node)
    if not outs or any(g.values[o].spec is None for o in outs) or len({_shape(g, o) for o in outs}) != 1:
        return "its outputs differ in shape (or have none)"
    if not _shape(g, outs[0]):
        return "only the leading axis of a tensor of rank >= 1 is split"
    if kind == KIND_VIEW:
        src = node.inputs[0]
        return "" if _known(g, src) and _shape(g, src) else "a view of a scalar or of an unknown shape"
    if node.key in ROW_OPS:
        shape = _shape(g, outs[0])
        if len(shape) < 2 or int(node.attrs.get("axis", -1)) % len(shape) == 0:
            return "its softmax runs across axis 0, the one split"
    if node.key in MATMUL_OPS:
        return _product_refusal(g, node)
    if node.key in CONV_OPS and not sliced_inputs(g, node):
        return "its input is not read by images"
    if node.key in NORM_GRAD_OPS and int(node.attrs.get("axis", -1)) % len(_shape(g, outs[0])) == 0:
        return "it normalizes across axis 0, the one split"
    return ""


def chunk_op(node: Node) -> tuple[str, str]:
    """A chunk's (domain, op): the node's, but a loss's or a table's chunk op (LOSS_OPS,
    TABLE_OPS, domain onnxplan)."""
    if node.key in TABLE_OPS:
        return "onnxplan", TABLE_OPS[node.key]
    return ("onnxplan", LOSS_OPS[node.key][0]) if node.key in LOSS_OPS else (node.domain, node.op_type)


def chunk_attrs(g: StepGraph, node: Node, k: int, j: int, attrs: dict[str, Any]) -> dict[str, Any]:
    """Chunk j of K's attributes: the node's, but a ConvGradInput's `x_shape` of its K-th of the
    images, a loss chunk's rows [start, stop) of the labels, a table chunk's rows [start, stop)
    of its table's `rows`."""
    if node.key in TABLE_OPS:
        rows, per = split_rows(g, node), table_rows(g, node, k)
        return {**attrs, "start": min(j * per, rows), "stop": min((j + 1) * per, rows), "rows": rows}
    if node.key in LOSS_OPS:
        rows = split_rows(g, node)
        return {**attrs, "start": j * rows // k, "stop": (j + 1) * rows // k}
    if node.key == ("onnxplan", "ConvGradInput") and "x_shape" in attrs:
        x_shape = [int(d) for d in attrs["x_shape"]]
        return {**attrs, "x_shape": [x_shape[0] // k, *x_shape[1:]]}
    return attrs


def flat_elems(g: StepGraph, node: Node, k: int) -> int:
    """Elements per piece of an optimizer update (or an elementwise op whose inputs all have its
    output's shape: GPT-2's tied embedding's gradient Sum) split over its flattened tensors (0:
    not flat). Used where its leading axis does not split in `k` (GPT-2's tied embedding, 50257
    rows, whose bytes are no whole number of pages per piece): pieces of E elements (a whole
    number of the store's pages), the last one the rest, ending the slot. A table (KIND_TABLE)
    is always cut so: E its table_rows' elements."""
    if node.key in TABLE_OPS:
        per = table_rows(g, node, k)
        return per * g.values[_table(node)].known_spec.numel // split_rows(g, node) if per else 0
    flat_op = node.key in UPDATE_OPS or (node.key in SPLITTABLE_OPS and node.key not in ROW_OPS)
    if not flat_op or k < 2 or _kind_refusal(g, node, KIND_ROWS) or _rows_refusal(g, node, k) == "":
        return 0  # not an update or elementwise, refused whatever its cut (aliases, ...), or split by rows
    out = next((o for o in node.outputs if o), "")
    if not _known(g, out):
        return 0
    spec = g.values[out].known_spec
    total, size = spec.numel, spec.itemsize
    sliced = sliced_inputs(g, node)
    if node.key not in UPDATE_OPS and (set(sliced) != {i for i in node.inputs if i} or len(node.outputs) != 1):
        return 0  # an elementwise op flat only with every input its output's shape (no broadcast)
    if node.key not in UPDATE_OPS and any(_rows_refusal(g, node, j) == "" for j in range(2, MAX_K + 1)):
        return 0  # an elementwise op flat only where its rows split in no K (plans of those that do stay)
    if node.key not in UPDATE_OPS and any(g.values[v].persistent for v in [*sliced, *node.outputs]):
        return 0  # parameters and state are paged by swap, not split (an update's are homed)
    if PIECE_ALIGN % size or any(g.values[v].known_spec.numel != total for v in sliced):
        return 0
    page = PIECE_ALIGN // size
    per = -(-total // k)
    per = -(-per // page) * page
    return per if (k - 1) * per < total else 0


def _table(node: Node) -> str:
    """The table a KIND_TABLE node is split over: a Gather's data, GatherGrad's dW."""
    return node.inputs[0] if node.op_type == "Gather" else node.outputs[0]


def table_rows(g: StepGraph, node: Node, k: int) -> int:
    """Table rows per chunk of a KIND_TABLE node in `k` (the last the rest): ceil(R/K) rounded
    up to rows whose bytes are whole pages; 0 when that leaves a chunk no rows or the table
    has no static shape."""
    table = _table(node)
    rows = split_rows(g, node)
    if k < 2 or not rows:
        return 0
    row_bytes = g.values[table].known_spec.nbytes // rows
    if not row_bytes:
        return 0
    unit = PIECE_ALIGN // math.gcd(PIECE_ALIGN, row_bytes)  # rows per whole number of pages
    per = -(-(-(-rows // k)) // unit) * unit
    return per if (k - 1) * per < rows else 0


def table_update(g: StepGraph, table: str) -> Node | None:
    """The optimizer update (UPDATE_OPS) of a persistent table: its split homes the table."""
    return next((n for n in g.nodes if n.key in UPDATE_OPS and table in n.inputs
                 and table in sliced_inputs(g, n)), None)


def _table_refusal(g: StepGraph, node: Node, k: int, axis: int) -> str:
    """Why a Gather / GatherGrad does not split over its table's rows in `k` ("" when it does)."""
    if node.after or node.aliases:
        return "the node aliases an input or has control dependencies"
    table, out = _table(node), node.outputs[0]
    ins = [*node.inputs, "", ""]
    if not all(_known(g, v) and _shape(g, v) for v in (table, out)) or not _known(g, ins[1]):
        return "its table or output has no static shape"
    if axis != 0 or int(node.attrs.get("axis", 0)) % len(_shape(g, table)) != 0:
        return (f"a {node.op_type} over axis {node.attrs.get('axis', 0)} (only one over its table's rows, "
                "axis 0, splits: another axis makes every output row read every table row)")
    upd = table_update(g, table) if node.op_type == "Gather" else None
    if g.values[table].persistent and (upd is None or all(why_not(g, upd, j) for j in range(2, MAX_K + 1))):
        return f"its table {table!r} is persistent and no optimizer update of it splits (parameters are paged by swap)"
    if not table_rows(g, node, k):
        return f"K={k} leaves a chunk no rows of the {split_rows(g, node)}-row table (in whole pages of rows)"
    return ""


def why_not(g: StepGraph, node: Node, k: int, axis: int = 0) -> str:
    """Why `node` cannot be split in `k` chunks along `axis` ("" when it can)."""
    if node.key in TABLE_OPS:
        return _table_refusal(g, node, k, axis)
    why = _rows_refusal(g, node, k, axis)
    if why and axis == 0 and flat_elems(g, node, k):
        return ""
    return why


def _rows_refusal(g: StepGraph, node: Node, k: int, axis: int = 0) -> str:
    """Why `node` cannot be split in `k` chunks along `axis` by its rows ("" when it can)."""
    kind = split_kind(g, node)
    if not kind and node.key == (MS, "ConvGrad"):
        return ("a ConvGrad making dX or dB too (only a dW-only ConvGrad, split-grad's dW half, splits: over "
                "dW's output channels; dB's channel pieces would be off the store's page)")
    if not kind:
        return (f"op {node.domain + '.' if node.domain else ''}{node.op_type} is not split (neither elementwise, "
                "row-wise, a product over rows nor a sum over rows)")
    if axis != 0:
        return "only the leading axis of a tensor of rank >= 1 is split"
    why = _kind_refusal(g, node, kind)
    if why:
        return why
    rows = split_rows(g, node)
    if k < 2 or not rows or rows % k:
        return f"K={k} does not divide the {rows} rows of axis {axis}"
    copied = copied_rows(g, node, k)
    for v in sliced_inputs(g, node) + sliced_outputs(g, node):
        if _known(g, v) and piece_shape(_shape(g, v), k) is None:
            return f"K={k} divides neither the leading axis nor the flattened rows of {v!r} {_shape(g, v)}"
        if g.values[v].persistent and node.key not in UPDATE_OPS:
            return f"input {v!r} is persistent (parameters and state are paged by swap, not split)"
        piece = g.values[v].nbytes // k
        if piece % PIECE_ALIGN and v not in copied and piece < OFF_PAGE_MIN:
            return (f"a piece of {v!r} is {piece} B, not a multiple of {PIECE_ALIGN} B (the store's page) "
                    f"and under {OFF_PAGE_MIN} B")
    return ""
