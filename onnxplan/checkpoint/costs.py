"""Time estimates per node: a FLOP/byte roofline now, measured kernel times when profiled."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from onnxplan.ir.graph import Node, StepGraph, original_name

__all__ = ["CPU_NUMPY", "Machine", "TimeModel", "node_bytes", "node_flops"]

MS = "com.microsoft"
_MATMUL = {("", "MatMul"), ("", "Gemm"), (MS, "FusedMatMul")}
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
    """A roofline: sustained FLOP/s of matrix products and of elementwise code, memory
    bandwidth, and a fixed cost per kernel call (dispatch, Python)."""

    name: str
    matmul_flops: float
    elementwise_flops: float
    bandwidth: float  # bytes/s
    call_seconds: float


# numpy on one CPU socket: BLAS for products, single-threaded ufuncs for the rest
CPU_NUMPY = Machine("cpu-numpy", matmul_flops=4e10, elementwise_flops=1e9, bandwidth=5e9,
                    call_seconds=4e-6)


def _shape(g: StepGraph, name: str) -> tuple[int, ...]:
    v = g.values.get(name) if name else None
    return v.spec.shape if v is not None and v.spec is not None else ()


def _numel(g: StepGraph, name: str) -> int:
    return prod(_shape(g, name)) if name else 0


def _contracted(g: StepGraph, n: Node) -> int:
    a = _shape(g, n.inputs[0])
    if not a:
        return 1
    if n.op_type == "Gemm":
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
    if n.op_type in ("ReduceSum", "ReduceMean", "GlobalAveragePool", "Sum"):
        return float(sum(_numel(g, i) for i in n.inputs if i))
    total = sum(_numel(g, o) for o in n.outputs if o)
    return float(total * _PER_ELEMENT.get(n.op_type, 1))


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
        m = self.machine
        flops = node_flops(g, n)
        rate = m.matmul_flops if n.key in _MATMUL or n.op_type in ("Conv", "ConvGrad", "ConvGradInput") else m.elementwise_flops
        return max(flops / rate, node_bytes(g, n) / m.bandwidth) + m.call_seconds

    def step_seconds(self, g: StepGraph) -> float:
        """Predicted seconds of one step: the sum over nodes (one stream, no overlap)."""
        return sum(self.node_seconds(g, n) for n in g.nodes)
