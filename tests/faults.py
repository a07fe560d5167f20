"""Planted faults for any model: the checks of `run --verify` proved the other way.

Each Fault wrongs one thing a real bug could wrong (a kernel's arithmetic at one node, a plan's
offsets, a swap-in, a recompute's input) in a model-agnostic way: it picks its victim from the
graph (the first node of a kind in execution order, a pair of live buffers), so the same
faults run on the zoo's small models in the test suite (tests/test_verify_faults_any.py) and
on the full-size tier in benchmarks/verify_faults_full.py. `plant` applies the fault through a
pytest MonkeyPatch (undone when it is) and says which node verification must name first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from onnxplan.budget import MemoryRequest, plan_for_budget
from onnxplan.executor.prepare import Prepared
from onnxplan.ir.graph import Node
from onnxplan.kernels.registry import find_decl
from onnxplan.loading import open_step
from onnxplan.loading.request import LoadRequest
from onnxplan.planning import PlanOptions

__all__ = ["FAULTS", "Fault", "Planted", "patch_kernel", "prepared"]

MS = "com.microsoft"


def prepared(model: str, batch: int | None, optimizer: str | None = "sgd", *, swap: str | None = None,
             checkpoint: str | None = None, budget: int | None = None) -> Prepared:
    """The plan of `model` with the memory policy named (none: the plain plan)."""
    folder, graph = open_step(LoadRequest(model, batch, optimizer))
    res = plan_for_budget(graph, PlanOptions(), MemoryRequest(budget if swap else None, swap, checkpoint=checkpoint))
    return Prepared(folder, res.graph, res.plan)


def patch_kernel(mp: pytest.MonkeyPatch, graph, op: str, domain: str, make: Callable) -> None:
    """Replace the kernel of `op` by make(real kernel); its bind rule off, so the planted
    kernel is the one called."""
    assert any(n.op_type == op and n.domain == domain for n in graph.nodes), f"the model has no {op}"
    decl = find_decl(domain, op, graph.opsets.get(domain))
    mp.setattr(decl, "fn", make(decl.fn))
    mp.setattr(decl, "bind", None)


def _first(prep: Prepared, ok: Callable[[Node], bool], last: bool = False) -> Node | None:
    """The first (or last) node in execution order that `ok` accepts."""
    at = {name: i for i, name in enumerate(prep.plan.order)}
    hits = sorted((n for n in prep.graph.nodes if ok(n) and n.name in at), key=lambda n: at[n.name])
    return (hits[-1] if last else hits[0]) if hits else None


def _at_node(mp: pytest.MonkeyPatch, prep: Prepared, node: Node, wrong: Callable) -> None:
    """The kernel of `node`'s op, wronged by wrong(ctx, inputs, outputs, real) at `node` only."""
    def make(fn):
        def kernel(ctx, inputs, outputs):
            if ctx.node.name != node.name:
                return fn(ctx, inputs, outputs)
            return wrong(ctx, inputs, outputs, fn)
        return kernel

    patch_kernel(mp, prep.graph, node.op_type, node.domain, make)


@dataclass(frozen=True)
class Planted:
    """A fault in place: the plan to verify, the node verification must name first (None: any
    node of `kind`), the kind of check expected to fail first."""

    prepared: Prepared
    node: str | None
    kind: str | None = None


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    plant: Callable[[pytest.MonkeyPatch, Prepared], Planted | None]  # None: the model has no victim
    replan: dict = dataclasses.field(default_factory=dict)  # prepared(...) options it needs (swap, checkpoint)


def _sign(mp, prep):
    """A gradient kernel negating the first quarter of its output (a wrong sign on part of it)."""
    node = _first(prep, lambda n: n.op_type in ("ReluGrad", "ConvGrad", "BatchNormalizationGrad", "GeluGrad"))
    if node is None:
        return None

    def wrong(ctx, inputs, outputs, fn):
        fn(ctx, inputs, outputs)
        out = outputs[0].reshape(-1)
        out[: max(1, out.size // 4)] *= -1
    _at_node(mp, prep, node, wrong)
    return Planted(prep, node.name)


def _stride(mp, prep):
    """A strided Conv sampling the odd positions (its input shifted by one column)."""
    node = _first(prep, lambda n: n.op_type == "Conv" and any(s > 1 for s in n.attrs.get("strides", [1])))
    if node is None:
        return None

    def wrong(ctx, inputs, outputs, fn):
        return fn(ctx, [np.roll(inputs[0], -1, axis=-1), *inputs[1:]], outputs)
    _at_node(mp, prep, node, wrong)
    return Planted(prep, node.name)


def _unbiased(mp, prep):
    """Every BatchNorm updating running_var with the unbiased batch variance (PyTorch's convention)."""
    if _first(prep, lambda n: n.op_type == "BatchNormInternal") is None:
        return None

    def make(fn):
        def bad(ctx, inputs, outputs):
            old = np.array(inputs[4], copy=True)
            fn(ctx, inputs, outputs)
            m = float(ctx.attrs.get("momentum", 0.9))
            n = inputs[0].size // inputs[0].shape[1]
            batch_var = (outputs[2] - m * old) / (1 - m)
            outputs[2][...] = m * old + (1 - m) * batch_var * n / (n - 1)
        return bad
    patch_kernel(mp, prep.graph, "BatchNormInternal", MS, make)
    return Planted(prep, None, "running")


def _gradient_norms(prep: Prepared, nodes: set[str]) -> dict[str, list[float]]:
    """Node -> the norms of its outputs in one correct step of the plan (our executor, the
    seeded step data): which gradients a fault scaled by their norm can move at all."""
    from onnxplan.executor.runner import Executor, initial_parameters, step_batches

    norms: dict[str, list[float]] = {}

    def wrap(node, fn):
        if node.name not in nodes:
            return fn

        def recorded(ctx, inputs, outputs):
            fn(ctx, inputs, outputs)
            norms[node.name] = [0.0 if o is None else float(np.linalg.norm(o)) for o in outputs]
        return recorded

    ex = Executor(prep.graph, prep.plan, wrap=wrap)
    ex.load_state(initial_parameters(prep.folder))
    ex.step(step_batches(prep.folder, 1, 0)[0])
    return norms


def _deep_noise(mp, prep):
    """The last node in execution order (where gradients are smallest) computing a parameter's
    gradient that is not zero, 10% off in a random direction (three times the gradients' 3e-2
    tolerance). A parameter's gradient, not the node's dX: at 224x224 a random 10% on a stem's dX
    averages out in its dW reduction over 25k positions (0.2% there) and in every trained value,
    so no check of the step can see it; and not zero: a fresh EfficientNet-B0's stem and
    classifier gradients are exactly 0 in float32 at 224x224, which no relative fault moves."""
    graph = prep.graph

    def param_grad(n: Node) -> int | None:
        return next((k for k, o in enumerate(n.outputs) if o and graph.values[o].vclass.value == "gradient"), None)
    ops = ("ConvGrad", "BatchNormalizationGrad", "Gemm", "MatMul", "LayerNormalizationGrad")
    candidates = {n.name for n in graph.nodes if n.op_type in ops and param_grad(n) is not None}
    norms = _gradient_norms(prep, candidates)
    node = _first(prep, lambda n: n.name in candidates and norms.get(n.name, [0.0] * 9)[param_grad(n) or 0] > 0,
                  last=True)
    if node is None:
        return None
    k, rng = param_grad(node), np.random.default_rng(11)

    def wrong(ctx, inputs, outputs, fn):
        fn(ctx, inputs, outputs)
        out = outputs[k]
        r = rng.standard_normal(out.shape)
        out += (0.1 * np.linalg.norm(out) / np.linalg.norm(r) * r).astype(out.dtype)
    _at_node(mp, prep, node, wrong)
    return Planted(prep, node.name)


def _drop_sum(mp, prep):
    """A Sum of several gradients dropping its last term."""
    node = _first(prep, lambda n: n.op_type == "Sum" and len(n.inputs) > 1)
    if node is None:
        return None
    _at_node(mp, prep, node, lambda ctx, inputs, outputs, fn: fn(ctx, inputs[:-1], outputs))
    return Planted(prep, node.name)


def _overlap(mp, prep):
    """Two activations live at once given one offset: the later one overwrites the earlier
    before its last read. At least half of the earlier one is overwritten: a clobber of a few
    bytes of a large tensor (128 B of a 1.2 MB padded image, read by a dW reduction over 100k
    positions) changes results by less than the tolerances, by design."""
    acts = sorted((b for b in prep.plan.buffers if b.vclass == "activation" and b.bytes >= 64),
                  key=lambda b: b.first_eo)
    for a in acts:
        b = next((x for x in acts if a.first_eo < x.first_eo < a.last_eo
                  and a.bytes <= 2 * x.bytes <= 2 * a.bytes), None)
        if b is not None:
            moved = tuple(dataclasses.replace(x, offset=a.offset) if x.name == b.name else x for x in prep.plan.buffers)
            return Planted(Prepared(prep.folder, prep.graph, dataclasses.replace(prep.plan, buffers=moved)), None)
    return None


def _stale_swap(mp, prep):
    """Swap-ins that copy nothing: the readers of swapped values read whatever the arena holds."""
    from onnxplan.executor.swap_io import SwapRuntime

    if not prep.plan.swaps:
        return None
    mp.setattr(SwapRuntime, "_swap_in", lambda self, name: (lambda ctx, inputs, outputs: None))
    return Planted(prep, None)


def _buffer_of(prep: Prepared) -> dict:
    """Value -> its arena buffer (by the buffer's root and its merged aliases)."""
    return {v: b for b in prep.plan.buffers for v in (b.name, *b.aliases)}


def _recompute_wrong(mp, prep):
    """A recomputed node reading another live value of the same shape than the one it replays
    (live, at another offset: a dead value's slot may hold the right bytes by then)."""
    graph, buf = prep.graph, _buffer_of(prep)
    copy = _first(prep, lambda n: "@rc" in n.name and n.inputs
                  and graph.values[n.inputs[0]].vclass.value == "activation")
    if copy is None:
        return None
    eo, right = list(prep.plan.order).index(copy.name), buf.get(copy.inputs[0])
    spec = graph.values[copy.inputs[0]].spec

    def live_elsewhere(v: str) -> bool:
        b = buf.get(v)
        return b is not None and right is not None and b.first_eo <= eo <= b.last_eo and \
            (b.offset + b.bytes <= right.offset or right.offset + right.bytes <= b.offset)
    wrong = next((v for v, val in graph.values.items() if val.spec == spec and v != copy.inputs[0]
                  and val.vclass.value == "activation" and live_elsewhere(v)), None)
    if wrong is None:
        return None
    mp.setattr(copy, "inputs", [wrong, *copy.inputs[1:]])
    return Planted(prep, copy.name)


FAULTS: tuple[Fault, ...] = (
    Fault("sign", "a gradient kernel's output negated on its first quarter (first such node)", _sign),
    Fault("stride", "a strided Conv reading its input shifted by one column", _stride),
    Fault("unbiased-var", "BatchNorm's running variance updated with the unbiased batch variance", _unbiased),
    Fault("deep-noise", "the last parameter gradient computed, 10% off in a random direction", _deep_noise),
    Fault("drop-sum", "a Sum of gradients dropping its last term", _drop_sum),
    Fault("overlap", "two live activations planned at one offset", _overlap),
    Fault("stale-swap", "swap-ins that copy nothing", _stale_swap, {"swap": "on-demand"}),
    Fault("recompute-input", "a recomputed node reading the wrong value", _recompute_wrong, {"checkpoint": "sqrt"}),
)
