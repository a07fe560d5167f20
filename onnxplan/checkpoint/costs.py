"""Time estimates per node: a FLOP/byte roofline now, measured kernel times when profiled."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from math import prod

from onnxplan.ir.graph import Node, StepGraph, original_name

__all__ = ["CHUNK_OPS", "CPU_NUMPY", "Machine", "priced_op", "TimeModel", "node_bytes", "node_flops", "work_kind"]

MS = "com.microsoft"
_MATMUL = {("", "MatMul"), ("", "Gemm"), (MS, "FusedMatMul"), ("onnxplan", "GemmAdd")}
# the split pass's chunk ops (passes/split.py) priced as the op each computes a part of: the same
# FLOPs per element of what it makes and the same factor, so K chunks cost about the whole's
# work plus K - 1 calls (and the GatherRows chunks each pass over the whole output: K outputs'
# bytes); the piece transfers are priced by swap.pricing at the store's bandwidth
CHUNK_OPS = {"GemmAdd": "Gemm", "SoftmaxCrossEntropyLossRows": "SoftmaxCrossEntropyLoss",
             "SoftmaxCrossEntropyLossGradRows": "SoftmaxCrossEntropyLossGrad", "GatherRows": "Gather",
             "GatherGradRows": "GatherGrad", "PieceRows": "Slice"}
# FLOPs per output element of ops that are not a matrix product (default 1)
_PER_ELEMENT = {
    "Softmax": 5, "LogSoftmax": 5, "SoftmaxGrad": 4, "SoftmaxGrad_13": 4, "LogSoftmaxGrad": 4,
    "LogSoftmaxGrad_13": 4, "LayerNormalization": 8, "LayerNormalizationGrad": 12,
    "BatchNormalization": 8, "BatchNormInternal": 8, "BatchNormalizationGrad": 12, "Erf": 10,
    "Gelu": 12, "GeluGrad": 16, "FastGelu": 10, "FastGeluGrad": 14, "Tanh": 6, "Sigmoid": 4,
    "Exp": 4, "Log": 4, "Sqrt": 2, "Div": 2, "Pow": 6, "SoftmaxCrossEntropyLoss": 6,
    "SoftmaxCrossEntropyLossGrad": 4, "AdamWUpdate": 12, "AdamWOptimizer": 12,
}


@dataclass(frozen=True)
class Machine:
    """A roofline: sustained FLOP/s of matrix products, convolutions (forward; gradients) and of
    elementwise code, memory bandwidth, a fixed cost per kernel call (dispatch, Python), and per
    op type a factor on the roofline's time where a kernel is slower or faster than it (several
    passes over memory, a gather, a window): time = max(FLOPs / rate, bytes / bandwidth) x
    factor + call."""

    name: str
    matmul_flops: float
    elementwise_flops: float
    bandwidth: float  # bytes/s
    call_seconds: float
    conv_flops: float | None = None  # Conv (None: matmul_flops)
    conv_grad_flops: float | None = None  # ConvGrad, ConvGradInput (None: conv_flops)
    op_factor: Mapping[str, float] = field(default_factory=dict)  # op type -> factor (default 1)

    def rate(self, kind: str) -> float:
        """FLOP/s of a kind of work (work_kind)."""
        if kind == "conv":
            return self.conv_flops or self.matmul_flops
        if kind == "conv_grad":
            return self.conv_grad_flops or self.conv_flops or self.matmul_flops
        return self.matmul_flops if kind == "matmul" else self.elementwise_flops

    def seconds(self, flops: float, nbytes: int, op_type: str, kind: str) -> float:
        """The roofline's seconds of a node of `op_type` and `kind` doing `flops` on `nbytes`."""
        return (max(flops / self.rate(kind), nbytes / self.bandwidth) * self.op_factor.get(op_type, 1.0)
                + self.call_seconds)


# Our kernels on one core of this project's machine at one thread (the thread count the decision
# benchmark measures at; BLAS and torch for products, torch or numpy for the rest). Calibrated by
# benchmarks/calibrate_costs.py (each node's least of 9 node-timed steps over two runs at load
# 3.5-3.8, of the plain plans of transformer b16, gpt b16, resnet18 b8 and vgg16 b8: 824 nodes;
# the steps' sums predicted 20.2 / 26.8 / 208 / 123 ms against 19.9 / 25.1 / 202 / 140 measured;
# see reports/price.md). The estimate it replaced (4e10, 1e9, 5e9, 4e-6, no factors) priced those
# steps 6-8x slow and elementwise work up to 25x slow: a recomputed segment looked as dear as
# milliseconds of swap I/O, and swap's simulated compute hid transfers that the real one did not.
CPU_NUMPY = Machine(
    "cpu-numpy", matmul_flops=1.9e11, elementwise_flops=3.8e10, bandwidth=8e10, call_seconds=1.6e-6,
    conv_flops=1.6e11, conv_grad_flops=1.35e11,
    op_factor={"AdamWUpdate": 0.51, "BatchNormInternal": 4.0, "BatchNormalizationGrad": 3.7, "GatherGrad": 72.0,
               "Gelu": 1.5, "GeluGrad": 1.5, "LayerNormalization": 6.6, "LayerNormalizationGrad": 5.0,
               "MaxPool": 64.0, "MaxPoolGrad": 8.1, "ReduceSum": 2.3, "Relu": 3.3, "ReluGrad": 2.6, "Softmax": 4.7,
               "SoftmaxCrossEntropyLoss": 9.1, "SoftmaxCrossEntropyLossGrad": 7.2, "Sum": 0.91, "Transpose": 2.2})


def priced_op(n: Node) -> str:
    """The op type `n` is priced as: a split chunk op's whole op (CHUNK_OPS), else its own."""
    return CHUNK_OPS.get(n.op_type, n.op_type) if n.domain == "onnxplan" else n.op_type


def _shape(g: StepGraph, name: str) -> tuple[int, ...]:
    v = g.values.get(name) if name else None
    return v.spec.shape if v is not None and v.spec is not None else ()


def _numel(g: StepGraph, name: str) -> int:
    return prod(_shape(g, name)) if name else 0


def _contracted(g: StepGraph, n: Node) -> int:
    a = _shape(g, n.inputs[0])
    if not a:
        return 1
    if n.op_type in ("Gemm", "GemmAdd"):
        return a[0] if n.attrs.get("transA", 0) else a[-1]
    if n.op_type == "FusedMatMul" and n.attrs.get("transA", 0) and len(a) >= 2:
        return a[-2]
    return a[-1]


def _conv_taps(g: StepGraph, n: Node, weight: str) -> int:
    w = _shape(g, weight)
    return prod(w[1:]) if len(w) >= 2 else 1  # C_in / group * kernel positions


def node_flops(g: StepGraph, n: Node) -> float:
    """Floating-point operations of one node (estimate)."""
    out = _numel(g, n.outputs[0]) if n.outputs and n.outputs[0] else 0
    if n.key in _MATMUL:
        return 2.0 * out * _contracted(g, n)
    if n.key == ("", "Conv"):
        return 2.0 * out * _conv_taps(g, n, n.inputs[1])
    if n.key in ((MS, "ConvGrad"), ("onnxplan", "ConvGradInput")):  # dX, dW: a forward-sized product each
        outs = [*n.outputs, "", ""][:2] if n.op_type == "ConvGrad" else [n.outputs[0], ""]
        weight = n.inputs[2] if n.op_type == "ConvGrad" else n.inputs[1]
        return 2.0 * sum(bool(o) for o in outs) * _numel(g, n.inputs[0]) * _conv_taps(g, n, weight)
    if n.key == ("onnxplan", "ConvGradWeight"):  # dW's rows: each summed over dY's images and positions
        return 2.0 * out * prod(_shape(g, n.inputs[0])[:1] + _shape(g, n.inputs[0])[2:])
    if n.op_type in ("ReduceSum", "ReduceMean", "GlobalAveragePool", "Sum"):
        return float(sum(_numel(g, i) for i in n.inputs if i))
    total = sum(_numel(g, o) for o in n.outputs if o)
    return float(total * _PER_ELEMENT.get(priced_op(n), 1))


def work_kind(n: Node) -> str:
    """The rate a node's FLOPs run at (Machine.rate): matmul, conv, conv_grad or elementwise."""
    if n.key in _MATMUL:
        return "matmul"
    if n.op_type == "Conv":
        return "conv"
    return "conv_grad" if n.op_type in ("ConvGrad", "ConvGradInput", "ConvGradWeight") else "elementwise"


def node_bytes(g: StepGraph, n: Node) -> int:
    """Bytes read and written by one node (each distinct value once)."""
    names = dict.fromkeys(x for x in (*n.inputs, *n.outputs) if x)
    return sum(g.values[x].nbytes for x in names if x in g.values)


@dataclass
class TimeModel:
    """Seconds per node: measured (a profile of our kernels) where known, else the roofline."""

    machine: Machine = CPU_NUMPY
    measured: dict[str, float] = field(default_factory=dict)  # node name -> seconds
    source: str = "flops"  # flops | profile

    def node_seconds(self, g: StepGraph, n: Node) -> float:
        base = original_name(n.name)  # a recomputed copy costs what its original costs
        if base in self.measured:
            return self.measured[base]
        fused, _, half = base.rpartition("/")
        if half in ("dX", "dW") and fused in self.measured and n.op_type in ("ConvGrad", "ConvGradInput"):
            return self.measured[fused] / 2  # a split ConvGrad (passes.split_grad): one of its two products
        if n.aliases and all(k == "rv" for _, k in n.aliases.values()):
            return 0.0  # read-only views move no data
        return self.machine.seconds(node_flops(g, n), node_bytes(g, n), priced_op(n), work_kind(n))

    def step_seconds(self, g: StepGraph) -> float:
        """Predicted seconds of one step: the sum over nodes (one stream, no overlap)."""
        return sum(self.node_seconds(g, n) for n in g.nodes)
