"""`run --verify`'s per-node check: each node's kernel against ONNX Runtime's kernel of the same
node, on the same inputs.

The end-to-end comparison (step_check) measures our step's values against ONNX Runtime's of the
same name; its tolerance must cover everything upstream (fifty layers of float32 rounding before
ResNet-50's stem gradient: 0.18 relative), so a kernel computing a slightly different function at
one deep node (BatchNorm's unbiased running variance, a 10% error in one gradient) hides inside
it. Here every node our executor runs (where the training model has the node) is also run by
ONNX Runtime on copies of the inputs our kernel reads, taken before our kernel runs (an in-place
kernel never changes what ONNX Runtime reads), as a one-node model run after ours (a kernel of
ours refusing garbage, such as a stale swap-in's indices out of range, raises first: ONNX
Runtime's MaxPoolGrad crashes the process on them); the two outputs differ only by that node's
own rounding: NODE_TOLERANCE, raised by the node's own rounding floor (a reduction's c(K) u
||kernel(|inputs|)||, BatchNorm's statistics and gradients: norm_floors; subnormal_floor; never
the relative error the inputs carry in from upstream). A kernel that computes another function fails at the
node that is wrong, at any depth and any size.

What it cannot see: the plan (two live buffers at one offset, a stale swap-in, a recomputed node
reading the wrong value): both kernels then read the same wrong input and agree; the end-to-end
comparison catches those. Not checked (counted by reason in the report): random nodes (ONNX
Runtime's single node would draw its own values), nodes the training model does not have
(swap-ins, optimizer, onnxplan's own ops), split pieces (a chunk of a node), in-place
accumulators (they update state), nodes whose op our passes rewrote (except ConvGrad's dX half,
ConvGradInput: ONNX Runtime's ConvGrad asked for dX alone), views (no kernel runs: counted by
step_check), nodes ONNX Runtime refuses to run alone (counted with its reason).

Design note: the alternative, our kernel on ONNX Runtime's captured inputs, needs every
intermediate of ONNX Runtime's step exposed at once (its run then holds all of them: several GB
for GPT-2 small beside the 8 GiB the verification must fit in) and a third training run per step;
this needs one node's inputs and outputs at a time and no extra training run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from onnxplan.executor.runner import _download
from onnxplan.ir.graph import Node, original_name
from onnxplan.kernels.registry import is_random
from onnxplan.passes.split import is_piece_node
from onnxplan.verification.checks import Check

__all__ = ["NODE_TOLERANCE", "NodeFeeds", "NodeReference", "compare_node", "subnormal_floor"]

# relative norm error of one node's output against ONNX Runtime's on the same inputs (raised by the
# node's own rounding floor): elementwise kernels agree to a few ulp (~1e-7), reductions are floored
NODE_TOLERANCE = 1e-4
_MAX_IR_VERSION = 10  # the newest IR onnxruntime 1.19 loads
_SKIP_OPS = {"InPlaceAccumulatorV2": "updates state in place"}
# ours split in two by passes/split_grad.py: ConvGrad's dX half (X is read for its shape only)
_CONV_GRAD_INPUT = ("onnxplan", "ConvGradInput")


@dataclass(frozen=True)
class NodeFeeds:
    """What ONNX Runtime's one-node model reads (input name -> a copy of ours) and the types and
    shapes of the outputs it writes (output name -> (dtype, shape), ours)."""

    inputs: dict[str, np.ndarray]
    outputs: dict[str, tuple[np.dtype, tuple[int, ...]]]


@dataclass(frozen=True)
class _Counterpart:
    """How one of our nodes maps onto a node of the training model: the one-node model's key,
    what to feed it (our input index, or a zero tensor of our output 0's shape: ConvGradInput's
    X), and which of its outputs are our outputs."""

    proto: onnx.NodeProto  # renamed: inputs i0.., outputs o0.. (omitted: "")
    feeds: tuple[int | None, ...]  # per ORT input: our input index; None: zeros like our output 0
    outputs: tuple[int, ...]  # our output indices it computes (ORT output k = ours k)
    key: bytes = b""  # the proto serialised once: sessions are keyed by it and the feeds' types


def _normal(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


class NodeReference:
    """ONNX Runtime's kernels of the training model's nodes, each run alone on given inputs:
    one-node sessions made once per node signature (op, attributes, input types and shapes),
    without a memory arena (nothing held between runs)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        """`model`: the training model as ONNX Runtime runs it (ConvGrad's pads repaired)."""
        self.by_output = {o: n for n in model.graph.node for o in n.output if o}
        self.opsets = list(model.opset_import)
        self.ir_version = min(model.ir_version, _MAX_IR_VERSION)
        self._counterparts: dict[str, _Counterpart | str] = {}
        self._sessions: dict[tuple, Any] = {}

    def counterpart(self, node: Node) -> _Counterpart | str:
        """The mapping of `node` (cached by name), or why it has none (a skip reason)."""
        if node.name not in self._counterparts:
            self._counterparts[node.name] = self._map(node)
        return self._counterparts[node.name]

    def _map(self, node: Node) -> _Counterpart | str:
        if is_random(node):
            return "random"
        if is_piece_node(node):
            return "split piece"
        if node.op_type in _SKIP_OPS:
            return _SKIP_OPS[node.op_type]
        first = next((original_name(o) for o in node.outputs if o), None)
        theirs = self.by_output.get(first) if first else None
        if theirs is None or node.phase == "optimizer":
            return "not in the training model"
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in theirs.attribute):
            return "has a subgraph"
        ours = (_normal(node.domain), node.op_type)
        if ours == (_normal(theirs.domain), theirs.op_type) and len(node.inputs) == len(theirs.input):
            feeds: tuple[int | None, ...] = tuple(range(len(node.inputs)))
        elif ours == _CONV_GRAD_INPUT and theirs.op_type == "ConvGrad" and len(node.inputs) == 2:
            feeds = (0, None, 1)  # dY, X (its shape: our dX's), W
        else:
            return "op rewritten by a pass"
        outs = tuple(k for k, o in enumerate(node.outputs) if o and k < len(theirs.output)
                     and original_name(o) == theirs.output[k])
        if not outs:
            return "op rewritten by a pass"
        proto = onnx.NodeProto()
        proto.CopyFrom(theirs)
        proto.name = "node"
        del proto.input[:], proto.output[:]
        proto.input.extend(f"i{k}" if theirs.input[k] else "" for k in range(len(feeds)))
        # ONNX Runtime's kernels write the outputs the training model has (BatchNormInternal's running
        # statistics: omitted, it crashes); only ConvGrad computes just those asked for (ours split it)
        n_out = max(outs) + 1 if theirs.op_type == "ConvGrad" else len(theirs.output)
        proto.output.extend(f"o{k}" if k in outs else f"x{k}" if theirs.output[k] and theirs.op_type != "ConvGrad"
                            else "" for k in range(n_out))
        return _Counterpart(proto, feeds, outs, proto.SerializeToString())

    def feeds(self, cp: _Counterpart, inputs: list, outputs: list) -> NodeFeeds:
        """Copies of our `inputs` (numpy or device arrays) as ONNX Runtime's node reads them (a
        copy: ONNX Runtime may write into an input it is given, BatchNormInternal's running
        statistics in place of an output nobody reads), and our outputs' types and shapes (a
        kernel such as MaxPoolGrad reads its output's shape from the graph: untyped, ONNX
        Runtime's one-node run crashes; ConvGradInput's X has our dX's)."""
        feeds: dict[str, np.ndarray] = {}
        for k, src in enumerate(cp.feeds):
            if not cp.proto.input[k]:
                continue
            if src is None:
                feeds[f"i{k}"] = np.zeros(outputs[0].shape, outputs[0].dtype)
            elif inputs[src] is not None:
                a = inputs[src]
                feeds[f"i{k}"] = np.array(a, copy=True) if isinstance(a, np.ndarray) else _download(a)
        return NodeFeeds(feeds, {f"o{k}": (np.dtype(outputs[k].dtype), tuple(outputs[k].shape)) for k in cp.outputs})

    def run(self, cp: _Counterpart, feeds: NodeFeeds) -> dict[int, np.ndarray]:
        """ONNX Runtime's outputs of the node (our output index -> value) on `feeds`."""
        sess = self._session(cp, feeds)
        got = sess.run([f"o{k}" for k in cp.outputs], feeds.inputs)
        return dict(zip(cp.outputs, got))

    def _session(self, cp: _Counterpart, feeds: NodeFeeds) -> Any:
        typed = {**{n: (a.dtype, a.shape) for n, a in feeds.inputs.items()}, **feeds.outputs}
        key = (cp.key, tuple((n, d.str, s) for n, (d, s) in typed.items()))
        if key not in self._sessions:
            import onnxruntime

            from onnxplan.threads import ort_session_options

            h = onnx.helper
            inputs = [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(d), s) for n, (d, s) in typed.items()
                      if n in feeds.inputs]
            outputs = [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(d), s) for n, (d, s) in feeds.outputs.items()]
            graph = h.make_graph([cp.proto], "node", inputs, outputs)
            model = h.make_model(graph, opset_imports=self.opsets)
            model.ir_version = self.ir_version
            opts = ort_session_options()
            # one thread: a session per node signature is kept for the run (dozens to hundreds),
            # and a pool each held compute - 1 native threads (found by review: 840 threads at 16)
            opts.intra_op_num_threads = opts.inter_op_num_threads = 1
            opts.enable_cpu_mem_arena = False  # nothing held between one node's runs
            opts.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
            opts.log_severity_level = 3
            self._sessions[key] = onnxruntime.InferenceSession(model.SerializeToString(), opts,
                                                               providers=["CPUExecutionProvider"])
        return self._sessions[key]

    def close(self) -> None:
        self._sessions.clear()


def subnormal_floor(inputs: list, out: np.ndarray) -> float:
    """The norm of what rounding in float's subnormal range may leave in `out`: below the
    smallest normal number a value is rounded to a fixed spacing s (2^-149 in float32), not to a
    relative u, so each term of a K-term sum and each addition may be off by s/2 absolutely
    (two sides, the probabilistic count of norm_floors.sum_rounding with s/2 for u):
        2 (6 sqrt(K) + 2) s/2 per element, K from the sizes (step_check._terms).
    Negligible unless the values themselves are subnormal (a fresh EfficientNet-B0 at 224x224:
    BatchNorm gradients of ~1e-38 at blocks 6-7, before its values underflow to 0)."""
    from onnxplan.verification.norm_floors import LAMBDA
    from onnxplan.verification.step_check import _terms

    sizes = [int(np.prod(np.shape(a))) for a in inputs if a is not None and a.dtype.kind == "f"]
    k = _terms(sizes, int(out.size), False)
    half = float(np.finfo(out.dtype).smallest_subnormal) / 2
    return 2 * (LAMBDA * math.sqrt(k) + 2) * half * math.sqrt(out.size)


def compare_node(node: Node, outputs: list, theirs: dict[int, np.ndarray], floors: dict[int, float],
                 inputs: list) -> list[Check]:
    """Our outputs of `node` against ONNX Runtime's on the same `inputs`: a float output by
    relative norm error within NODE_TOLERANCE raised by its own rounding floor (`floors`: output
    index -> absolute floor, plus subnormal_floor), any other output exactly (tolerance 0; the
    error: the share of elements that differ)."""
    from onnxplan.verification.step_check import floored, gradient_error

    checks = []
    for k, want in theirs.items():
        arr = outputs[k]
        if arr is None:
            continue
        ours = arr if isinstance(arr, np.ndarray) else _download(arr)
        want = np.asarray(want)
        if want.dtype.kind == "f":
            floor = floors.get(k, 0.0) + subnormal_floor(inputs, want)
            tol = floored(NODE_TOLERANCE, floor, want)
            err = gradient_error(*_agreeing_non_finite(ours, want), tol, floor) if ours.shape == want.shape \
                else math.inf
        else:  # integers and booleans (MaxPool's indices, masks): exactly, one element off fails
            tol = 0.0
            err = 0.0 if ours.shape == want.shape and np.array_equal(ours, want) else math.inf
            if err and ours.shape == want.shape:  # the share of elements that differ
                err = float(np.mean(ours != want))
        checks.append(Check("node", node.outputs[k], err, tol, node.name))
    return checks


def _agreeing_non_finite(ours: np.ndarray, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`ours`, `want` with the non-finite elements on which they agree (the same infinity, NaN
    and NaN) set to 0 on both: two kernels given an input of infinities (a stale swap-in's
    garbage) agree there, and inf - inf must not read as a difference. As given when every
    element of `want` is finite (no copy)."""
    finite = np.isfinite(want)
    if finite.all():
        return ours, want
    agree = ~finite & ((ours == want) | (np.isnan(ours) & np.isnan(want)))
    return np.where(agree, 0, ours), np.where(agree, 0, want)
