"""A small ONNX graph builder with seeded weights and common layers for the zoo."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxplan.forward.spec import ForwardModel, InputSpec, labels_for_output

__all__ = ["IR_VERSION", "OPSET", "GraphBuilder"]

OPSET = 17
IR_VERSION = 9


class GraphBuilder:
    """Accumulates nodes, initializers and parameter lists; names are unique and readable.

    Weights are drawn from one `numpy.random.default_rng(seed)` in creation order, so a
    builder called with the same arguments always gives byte-identical models.
    """

    def __init__(self, name: str, seed: int = 0) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.input_specs: list[InputSpec] = []
        self.trainable: list[str] = []
        self.frozen: list[str] = []
        self._counts: dict[str, int] = {}

    # -- names, inputs, initializers, nodes -------------------------------------------
    def fresh(self, prefix: str) -> str:
        """A new unique name starting with `prefix`."""
        n = self._counts.get(prefix, 0)
        self._counts[prefix] = n + 1
        return prefix if n == 0 else f"{prefix}_{n}"

    def input(self, name: str, dtype: str, shape: tuple[int, ...], low: float, high: float) -> str:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        self.input_specs.append(InputSpec(name, dtype, tuple(shape), low, high))
        return name

    def param(self, name: str, array: np.ndarray, frozen: bool = False) -> str:
        """A parameter initializer: trainable unless `frozen` (then kept but not updated)."""
        name = self.fresh(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        (self.frozen if frozen else self.trainable).append(name)
        return name

    def const(self, name: str, array: np.ndarray) -> str:
        """A constant initializer (not a parameter: stays a constant in the training graph)."""
        name = self.fresh(name)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def shape_const(self, shape) -> str:
        return self.const("shape", np.asarray(shape, dtype=np.int64))

    def node(self, op: str, inputs: list[str], outputs: int = 1, name: str | None = None, **attrs):
        """Add a node; returns its output name (or a list when `outputs` > 1)."""
        base = self.fresh(name or op.lower())
        outs = [base if i == 0 else f"{base}_out{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=base, **attrs))
        return outs[0] if outputs == 1 else outs

    def normal(self, shape, std: float) -> np.ndarray:
        out = self.rng.standard_normal(shape, dtype=np.float32)
        out *= np.float32(std)
        return out

    # -- layers ---------------------------------------------------------------------------
    def linear(self, x: str, n_in: int, n_out: int, name: str, frozen: bool = False,
               gemm: bool = True, gain: float = 2.0) -> str:
        """y = x @ W + b. Gemm for 2-D x, MatMul + Add (any rank) when `gemm` is False.

        W is [n_in, n_out] with std sqrt(gain / n_in) (He for gain 2), b is zeros.
        """
        w = self.param(f"{name}.weight", self.normal((n_in, n_out), math.sqrt(gain / n_in)), frozen)
        b = self.param(f"{name}.bias", np.zeros(n_out, np.float32), frozen)
        if gemm:
            return self.node("Gemm", [x, w, b], name=name)
        return self.node("Add", [self.node("MatMul", [x, w], name=f"{name}.matmul"), b], name=f"{name}.add")

    def conv(self, x: str, c_in: int, c_out: int, k: int, stride: int, pad: int, name: str,
             bias: bool = True) -> str:
        """Conv2D, NCHW, square kernel, He-initialized weights [c_out, c_in, k, k]."""
        w = self.param(f"{name}.weight", self.normal((c_out, c_in, k, k), math.sqrt(2.0 / (c_in * k * k))))
        ins = [x, w]
        if bias:
            ins.append(self.param(f"{name}.bias", np.zeros(c_out, np.float32)))
        return self.node("Conv", ins, name=name, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[pad, pad, pad, pad])

    def batchnorm(self, x: str, c: int, name: str) -> str:
        """BatchNormalization in training mode with all three outputs declared.

        Scale/bias are trainable; the running mean/var are frozen parameters (they live in
        the checkpoint but get no gradient; ORT's training graph does not write them back).
        """
        scale = self.param(f"{name}.scale", np.ones(c, np.float32))
        bias = self.param(f"{name}.bias", np.zeros(c, np.float32))
        mean = self.param(f"{name}.running_mean", np.zeros(c, np.float32), frozen=True)
        var = self.param(f"{name}.running_var", np.ones(c, np.float32), frozen=True)
        y, _, _ = self.node("BatchNormalization", [x, scale, bias, mean, var], outputs=3, name=name,
                            epsilon=1e-5, momentum=0.9, training_mode=1)
        return y

    def layernorm(self, x: str, d: int, name: str) -> str:
        """LayerNormalization over the last axis with Mean and InvStdDev outputs declared."""
        scale = self.param(f"{name}.scale", np.ones(d, np.float32))
        bias = self.param(f"{name}.bias", np.zeros(d, np.float32))
        y, _, _ = self.node("LayerNormalization", [x, scale, bias], outputs=3, name=name,
                            axis=-1, epsilon=1e-5)
        return y

    def gelu(self, x: str, name: str) -> str:
        """Exact GELU 0.5 * x * (1 + erf(x / sqrt 2)) from opset-17 ops (Div, Erf, Add, Mul)."""
        sqrt2 = self.const("sqrt2", np.array(math.sqrt(2.0), np.float32))
        one = self.const("one", np.array(1.0, np.float32))
        half = self.const("half", np.array(0.5, np.float32))
        e = self.node("Erf", [self.node("Div", [x, sqrt2], name=f"{name}.div")], name=f"{name}.erf")
        t = self.node("Mul", [x, self.node("Add", [e, one], name=f"{name}.add")], name=f"{name}.mul")
        return self.node("Mul", [t, half], name=f"{name}.half")

    # -- finish ---------------------------------------------------------------------------
    def model(self, output: str, shape: tuple[int, ...], doc: str = "") -> onnx.ModelProto:
        out = helper.make_tensor_value_info(output, TensorProto.FLOAT, list(shape))
        graph = helper.make_graph(self.nodes, self.name, self.inputs, [out], self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="onnxplan.models", doc_string=doc)
        model.ir_version = IR_VERSION
        return model

    def forward(self, output: str, shape: tuple[int, ...], loss: str, doc: str = "") -> ForwardModel:
        """Wrap up: the ModelProto with one float output `output` of `shape`, and its specs."""
        return ForwardModel(
            name=self.name,
            model=self.model(output, shape, doc),
            trainable=list(self.trainable),
            frozen=list(self.frozen),
            inputs=list(self.input_specs),
            labels=labels_for_output(shape, loss, self.input_specs),
            loss=loss,
        )
