"""ONNX Runtime's side of a verified step, stateless: the training and optimizer models of the
artifact folder run in InferenceSessions with the whole state fed in, so any step can start from
any state (ours, before the step), and everything the comparison needs comes out as outputs:

- the loss, every parameter's gradient (the input of its InPlaceAccumulatorV2; the accumulator
  is reset every step, so the accumulated gradient is that value),
- the updated BatchNorm running statistics (BatchNormInternal / BatchNormalization outputs 1, 2),
- the random values ONNX Runtime drew (Dropout keep-masks, Random*Like outputs), so our random
  ops can use them,
- on request every intermediate value (to find the first one that differs).

The training model run this way is the same graph and the same kernels as
onnxruntime.training.api.Module's (the loss of a step is bit-identical), with one repair of a
reference bug: ONNX Runtime 1.19's CPU ConvGrad ignores auto_pad (explicit_conv_grad_pads), so
its ConvGrad nodes get the explicit pads their auto_pad means. The optimizer model gets its
optional outputs (updated parameters and moments) exposed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx

from onnxplan.errors import ModelError
from onnxplan.ir.load import ACC_SUFFIX, OPTIMIZER_OPS, RESET_FLAG
from onnxplan.ir.windows import SAME, auto_pad, window
from onnxplan.kernels.registry import random_ops
from onnxplan.ort import ort_cause
from onnxplan.threads import ort_session_options

__all__ = [
    "BN_OPS",
    "ORT_DEFAULT_LEARNING_RATE",
    "OrtOptimizerStep",
    "OrtStep",
    "OrtTrainingStep",
    "explicit_conv_grad_pads",
    "is_batch_norm",
]

ORT_DEFAULT_LEARNING_RATE = 1e-3  # onnxruntime.training.api.Optimizer's initial learning rate
_MAX_IR_VERSION = 10  # the newest IR onnxruntime 1.19 loads
# BatchNorm in training mode: running statistics in inputs 3, 4, their updates in outputs 1, 2
BN_OPS = frozenset({("com.microsoft", "BatchNormInternal"), ("", "BatchNormalization")})


def is_batch_norm(domain: str, op_type: str) -> bool:
    """True for an op of BN_OPS ("ai.onnx" is the default domain "")."""
    return ("" if domain == "ai.onnx" else domain, op_type) in BN_OPS


@dataclass
class OrtStep:
    """What ONNX Runtime computed in one training step from a given state."""

    loss: float
    grads: dict[str, np.ndarray]  # trainable parameter -> its gradient
    running: dict[str, np.ndarray]  # running statistic (a frozen parameter) -> its new value
    random: dict[str, np.ndarray]  # random node -> what it drew (keep-mask or output)
    values: dict[str, np.ndarray] = field(default_factory=dict)  # intermediates, when exposed
    loss_inputs: list[np.ndarray | None] = field(default_factory=list)  # what the loss node read


def _serialized(model: onnx.ModelProto) -> bytes:
    if model.ir_version > _MAX_IR_VERSION:
        model.ir_version = 9  # generate_artifacts stamps the optimizer model with a newer IR
    return model.SerializeToString()


def _session(model: bytes):
    import onnxruntime

    opts = ort_session_options()  # the process's threads; idle workers sleep between our kernels
    opts.log_severity_level = 3
    try:
        return onnxruntime.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - pybind errors share no base but Exception

        raise ModelError(f"onnxruntime refused the verification model: {ort_cause(str(exc))}") from None


def _load(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise ModelError(f"{path}: not found (is {path.parent} an onnxplan artifact folder?)")
    return onnx.load(str(path))


def explicit_conv_grad_pads(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> list[str]:
    """Give every ConvGrad with auto_pad SAME_UPPER/SAME_LOWER the explicit pads it means, in
    place; returns the names of the nodes rewritten.

    ONNX Runtime 1.19's CPU ConvGrad never reads auto_pad: it takes `pads` as given, zeros when
    absent (orttraining/training_ops/cpu/nn/conv_grad.cc), while its Conv resolves auto_pad. For
    a window wider than one element with SAME padding, its im2col then walks an unpadded input
    with the padded output's size, and dX and dW come out wrong by O(1) of their norm (a 3x3
    depthwise Conv of hf-efficientnet's TorchScript export: 1.1x; the same node with the
    explicit pads agrees with float64 to 7e-8). Both are wrong gradients, not rounding: the
    reference has to be repaired, not the tolerance widened. The pads come from the static
    spatial sizes of X (input 1) and dY (input 0) by the arithmetic our kernels use
    (onnxplan.ir.windows.window, ONNX's SAME rule); a node whose shapes are not in `shapes`
    is left as it is (the difference then shows, never a silent pass)."""
    done = []
    for n in model.graph.node:
        if n.op_type != "ConvGrad" or n.domain != "com.microsoft":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        dy, x, w = (shapes.get(i) for i in n.input[:3])
        if auto_pad(attrs) not in SAME or dy is None or x is None or w is None:
            continue
        kernel = attrs.get("kernel_shape") or w[2:]
        win = window(attrs, x[2:], dy[2:], kernel)
        kept = [a for a in n.attribute if a.name not in ("auto_pad", "pads")]
        del n.attribute[:]
        n.attribute.extend(kept)
        n.attribute.append(onnx.helper.make_attribute("pads", [*win.pads_begin, *win.pads_end]))
        done.append(n.name)
    return done


class OrtTrainingStep:
    """training_model.onnx in an InferenceSession: loss, gradients, running statistics, random
    values (and on request every intermediate) of one step from a given state. `shapes` (value
    -> static shape, the step graph's) lets explicit_conv_grad_pads repair ConvGrad's auto_pad."""

    def __init__(self, folder: str | Path, shapes: Mapping[str, tuple[int, ...]] | None = None) -> None:
        self.model = _load(Path(folder) / "training_model.onnx")
        g = self.model.graph
        self.loss_name = g.output[0].name
        self.grad_of: dict[str, str] = {}  # parameter -> raw gradient value
        self.running_of: dict[str, str] = {}  # running statistic input -> its updated output
        self.random_of: dict[str, str] = {}  # random node -> the output holding its draw
        self.value_node: dict[str, str] = {}  # value -> the node that produced it
        draws = random_ops()  # op -> the output holding what it drew (Dropout: its keep-mask)
        for k, n in enumerate(g.node):
            if not n.name:
                n.name = f"{n.op_type}_{k}"
            key = (n.domain if n.domain != "ai.onnx" else "", n.op_type)
            if n.op_type == "InPlaceAccumulatorV2" and n.input[0].endswith(ACC_SUFFIX):
                self.grad_of[n.input[0][: -len(ACC_SUFFIX)]] = n.input[1]
            elif is_batch_norm(*key) and len(n.output) >= 3 and len(n.input) >= 5:
                for i, o in ((3, 1), (4, 2)):
                    if n.output[o]:
                        self.running_of[n.input[i]] = n.output[o]
            elif key in draws:
                j = draws[key]
                while len(n.output) <= j:
                    n.output.append("")
                if not n.output[j]:
                    n.output[j] = f"{n.name}.verify_random"
                self.random_of[n.name] = n.output[j]
            for o in n.output:
                if o:
                    self.value_node[o] = n.name
        self.repaired = explicit_conv_grad_pads(self.model, shapes or {})  # ConvGrad nodes given explicit pads
        self.inputs = [vi.name for vi in g.input]
        self.loss_node = next((n for n in g.node if self.loss_name in n.output), None)
        self.opset = next((o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx")), 17)
        self._models: dict[tuple[bool, bool], bytes] = {}  # (expose_all, given) -> the model run

    def _model_bytes(self, expose_all: bool, given: bool) -> bytes:
        """The training model with what the comparison reads as outputs (and the random nodes
        taking given values), serialized once per variant: a session is made per run from it."""
        if (expose_all, given) not in self._models:
            m = onnx.ModelProto()
            m.CopyFrom(self.model)
            if given:
                _take_random_as_inputs(m, set(self.random_of))
            have = {o.name for o in m.graph.output}
            want = [*self.grad_of.values(), *self.running_of.values(), *self.random_of.values()]
            if self.loss_node is not None:
                want += [i for i in self.loss_node.input if i in self.value_node]
            if expose_all:
                want += list(self.value_node)
            for name in dict.fromkeys(want):
                if name not in have:
                    m.graph.output.append(onnx.ValueInfoProto(name=name))
                    have.add(name)
            self._models[(expose_all, given)] = _serialized(m)
        return self._models[(expose_all, given)]

    def run(self, params: dict[str, np.ndarray], batch: dict[str, np.ndarray], *,
            expose_all: bool = False, given: dict[str, np.ndarray] | None = None) -> OrtStep:
        """One step from `params` (every parameter, trained and frozen) on `batch`; `given`:
        the random values to use (by node, as OrtStep.random), else ONNX Runtime draws."""
        feeds = {_GIVEN_PREFIX + n: v for n, v in (given or {}).items() if n in self.random_of}
        for name in self.inputs:
            if name in batch:
                feeds[name] = batch[name]
            elif name in self.running_of:  # state a kernel may update in place: never our copy
                feeds[name] = np.array(params[name], copy=True)
            elif name in params:
                feeds[name] = params[name]
            elif name == RESET_FLAG:
                feeds[name] = np.ones((1,), dtype=bool)
            elif name.endswith(ACC_SUFFIX) and name[: -len(ACC_SUFFIX)] in params:
                feeds[name] = np.zeros_like(params[name[: -len(ACC_SUFFIX)]])
            else:
                raise ModelError(f"the training model's input {name!r} has no value to feed")
        # a session per run: dropped with its arena when the run is done (a kept session holds
        # its arena's blocks, some 60% of ONNX Runtime's step, though they are free between runs)
        sess = _session(self._model_bytes(expose_all, bool(given) and bool(self.random_of)))
        names = [o.name for o in sess.get_outputs()]
        out = dict(zip(names, sess.run(None, feeds)))
        del sess
        return OrtStep(
            loss=float(np.asarray(out[self.loss_name]).reshape(-1)[0]),
            grads={p: out[v] for p, v in self.grad_of.items()},
            running={r: out[v] for r, v in self.running_of.items()},
            random={n: out[v] for n, v in self.random_of.items()},
            values=out if expose_all else {},
            loss_inputs=[] if self.loss_node is None else
            [out.get(i, feeds.get(i)) if i else None for i in self.loss_node.input],
        )

    def conv_grad_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """The entries of `shapes` explicit_conv_grad_pads reads (the inputs of ConvGrad nodes):
        what a child process needs to repair its own copy of the model the same way."""
        read = {i for n in self.model.graph.node if n.op_type == "ConvGrad" for i in n.input[:3]}
        return {name: tuple(shapes[name]) for name in read if name in shapes}

    def exact_loss(self, loss_inputs: list[np.ndarray | None]) -> float | None:
        """The loss node evaluated in float64 (the ONNX reference evaluator) on the inputs ONNX
        Runtime gave it (`loss_inputs`): the loss without ONNX Runtime's float32 reduction
        error. None when the node is not a standard ONNX op or cannot be evaluated."""
        from onnx import helper
        from onnx.reference import ReferenceEvaluator

        n = self.loss_node
        if n is None or n.domain not in ("", "ai.onnx"):
            return None
        feeds, inputs = {}, []
        for k, (name, x) in enumerate(zip(n.input, loss_inputs)):
            if not name or x is None:
                inputs.append("")
                continue
            x = np.asarray(x)
            x = x.astype(np.float64) if x.dtype.kind == "f" else x
            feeds[f"i{k}"] = x
            inputs.append(f"i{k}")
        node = helper.make_node(n.op_type, inputs, [f"o{j}" for j in range(len(n.output))])
        node.attribute.extend(n.attribute)
        graph = helper.make_graph(
            [node], "loss",
            [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()],
            [helper.make_tensor_value_info(f"o{j}", onnx.TensorProto.UNDEFINED, None) for j in range(len(n.output))])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        try:
            got = cast(list, ReferenceEvaluator(model).run(None, feeds))  # a list: no intermediate=True
            return float(np.asarray(got[0]).reshape(-1)[0])
        except Exception:  # noqa: BLE001 - a help to judge the loss, never a failure of its own
            return None


_GIVEN_PREFIX = "verify.given."


def _take_random_as_inputs(model: onnx.ModelProto, nodes: set[str]) -> None:
    """Rewrite the random nodes to use given values (graph inputs `verify.given.NODE`):
    Dropout in training mode becomes Where(keep, x / (1 - ratio), 0) with the given keep-mask,
    a Random*Like op an Identity of the given output."""
    from onnx import helper

    g = model.graph
    types = {}  # value -> elem type, where ONNX's inference knows it (Random*Like's input)
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
        for vi in [*inferred.value_info, *inferred.input, *inferred.output]:
            if vi.type.HasField("tensor_type"):
                types[vi.name] = vi.type.tensor_type.elem_type
    except Exception:  # noqa: BLE001, S110 - inference is a help here, not a need
        pass
    new_nodes = []
    draws = random_ops()
    for n in g.node:
        if n.name not in nodes:
            new_nodes.append(n)
            continue
        given = _GIVEN_PREFIX + n.name
        j = draws[(n.domain if n.domain != "ai.onnx" else "", n.op_type)]
        if n.op_type in ("RandomUniformLike", "RandomNormalLike"):
            dtype = next((a.i for a in n.attribute if a.name == "dtype"), types.get(n.input[0], onnx.TensorProto.FLOAT))
            g.input.append(helper.make_tensor_value_info(given, dtype, None))
            new_nodes.append(helper.make_node("Identity", [given], [n.output[0]], name=n.name))
            continue
        if n.op_type != "Dropout":
            new_nodes.append(n)  # BitmaskDropout: ONNX Runtime's CPU build has no kernel for it
            continue
        g.input.append(helper.make_tensor_value_info(given, onnx.TensorProto.BOOL, None))
        x = n.input[0]
        t = f"{given}/"
        ratio = n.input[1] if len(n.input) > 1 and n.input[1] else t + "half"
        mode = n.input[2] if len(n.input) > 2 and n.input[2] else ""
        consts = [helper.make_node("Constant", [], [t + "half"], value_float=0.5),
                  helper.make_node("Constant", [], [t + "zero_f"], value_float=0.0),
                  helper.make_node("Constant", [], [t + "one_f"], value_float=1.0)]
        body = [
            helper.make_node("CastLike", [ratio, x], [t + "ratio"]),
            helper.make_node("CastLike", [t + "zero_f", x], [t + "zero"]),
            helper.make_node("CastLike", [t + "one_f", x], [t + "one"]),
        ]
        if mode:
            body.append(helper.make_node("Where", [mode, t + "ratio", t + "zero"], [t + "r"]))
        else:
            body.append(helper.make_node("Identity", [t + "zero"], [t + "r"]))  # inference: keep all
        body += [
            helper.make_node("Sub", [t + "one", t + "r"], [t + "keep"]),
            helper.make_node("Div", [x, t + "keep"], [t + "scaled"]),
            helper.make_node("Where", [given, t + "scaled", t + "zero"], [n.output[0]]),
        ]
        if len(n.output) > j and n.output[j]:
            body.append(helper.make_node("Identity", [given], [n.output[j]]))
        new_nodes += consts + body
    del g.node[:]
    g.node.extend(new_nodes)


class OrtOptimizerStep:
    """optimizer_model.onnx in an InferenceSession, its updated parameters and moments exposed."""

    def __init__(self, folder: str | Path) -> None:
        model = _load(Path(folder) / "optimizer_model.onnx")
        nodes = [n for n in model.graph.node if n.op_type in OPTIMIZER_OPS]
        if len(nodes) != 1:
            raise ModelError(f"{folder}: expected one optimizer node in optimizer_model.onnx")
        node = nodes[0]
        self.kind = OPTIMIZER_OPS[node.op_type]
        seq_inputs = ["params", "gradients", "first_order_moments", "second_order_moments"]
        n_out = 4 if self.kind == "AdamW" else 2  # SGD: flag, updated weights
        while len(node.output) < n_out:
            node.output.append("")
        types = {vi.name: vi.type for vi in model.graph.input}
        have = {o.name for o in model.graph.output}
        for j in range(1, n_out):
            if not node.output[j]:
                node.output[j] = f"verify.updated.{seq_inputs[(0, 2, 3)[j - 1]]}"
            if node.output[j] not in have:
                vi = onnx.ValueInfoProto(name=node.output[j])
                src = node.input[(2, 4, 5)[j - 1]] if self.kind == "AdamW" else node.input[1]
                if src in types:
                    vi.type.CopyFrom(types[src])
                model.graph.output.append(vi)
        self.outputs = list(node.output[1:n_out])
        used = {i for n in model.graph.node for i in n.input}
        kept = [vi for vi in model.graph.input if vi.name in used]  # SGD's graph lists unused inputs
        del model.graph.input[:]
        model.graph.input.extend(kept)
        self.inputs = [vi.name for vi in kept]
        self._model = _serialized(model)
        self._session: Any = None  # made by the first run, dropped by release()

    def run(self, names: list[str], learning_rate: float, step: int, params: Mapping[str, np.ndarray],
            grads: Mapping[str, np.ndarray], moments: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Updated parameters (by name) and, for AdamW, moments (`NAME.exp_avg`, `NAME.exp_avg_sq`)."""
        moments = moments or {}
        # AdamWOptimizer updates its sequence inputs in place: give it copies of the state
        seqs: dict[str, list[np.ndarray]] = {"params": [np.array(params[p], copy=True) for p in names],
                                             "gradients": [grads[p] for p in names]}
        if self.kind == "AdamW":
            seqs["first_order_moments"] = [np.array(moments[f"{p}.exp_avg"], copy=True) for p in names]
            seqs["second_order_moments"] = [np.array(moments[f"{p}.exp_avg_sq"], copy=True) for p in names]
        feeds: dict[str, np.ndarray | list[np.ndarray]] = {}
        for name in self.inputs:
            if name == "learning_rate":
                feeds[name] = np.array([learning_rate], dtype=np.float32)
            elif name == "step":
                feeds[name] = np.array([step], dtype=np.int64)
            elif name in seqs:
                feeds[name] = seqs[name]
            else:
                raise ModelError(f"the optimizer model's input {name!r} has no value to feed")
        if self._session is None:
            self._session = _session(self._model)
        got = self._session.run(self.outputs, feeds)
        out = dict(zip(names, got[0]))
        if self.kind == "AdamW":
            out.update({f"{p}.exp_avg": m for p, m in zip(names, got[1])})
            out.update({f"{p}.exp_avg_sq": v for p, v in zip(names, got[2])})
        return out

    def release(self) -> None:
        """Drop the session and its arena (the next run makes a new one)."""
        self._session = None
