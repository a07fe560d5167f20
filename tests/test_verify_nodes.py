"""`run --verify`'s per-node check (onnxplan/verification/node_check.py): each kernel against
ONNX Runtime's kernel of the same node on the same inputs, within the node's own rounding.

Proved both ways: correct runs pass it (here and in every verify test), and a kernel error far
below the end-to-end tolerances (1e-3 relative, at a node deep in the backward pass, whose
end-to-end tolerance is at least 3e-2) fails it, at that node, while every end-to-end check
passes."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan.verification.node_check import NODE_TOLERANCE
from onnxplan.verification.step_check import TOLERANCES, verify_run
from tests.faults import _at_node, _buffer_of, _first, prepared

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SMALL = 1e-3  # the planted error's relative norm: 30x under the end-to-end gradient tolerance


def _plant_small_error(mp: pytest.MonkeyPatch, prep, op: str) -> str:
    """The last node of `op` in execution order (the deepest of the backward pass) off by SMALL
    relative norm in a random direction on its first output computed; its name."""
    node = _first(prep, lambda n: n.op_type == op, last=True)
    assert node is not None, f"no {op}"
    rng = np.random.default_rng(5)

    def wrong(ctx, inputs, outputs, fn):
        fn(ctx, inputs, outputs)
        out = next(o for o in outputs if o is not None)
        r = rng.standard_normal(out.shape)
        out += (SMALL * np.linalg.norm(out) / np.linalg.norm(r) * r).astype(out.dtype)
    _at_node(mp, prep, node, wrong)
    return node.name


@pytest.mark.parametrize(("model", "op"), [("resnet18", "ConvGrad"), ("gpt", "LayerNormalizationGrad")])
def test_a_small_kernel_error_at_a_deep_node_fails_per_node_only(monkeypatch, model, op):
    prep = prepared(model, 2)
    planted = _plant_small_error(monkeypatch, prep, op)
    v = verify_run(prep, steps=1)
    assert not v.ok, "a 1e-3 kernel error passed the per-node check"
    step = v.steps[0]
    assert {c.kind for c in step.failures} == {"node"}, step.failures  # the end-to-end checks miss it
    first = step.first_difference
    assert first is not None and first.kind == "node" and first.node == planted, first
    assert 0.5 * SMALL < first.error < 2 * SMALL, first
    assert first.tolerance < SMALL / 2 < TOLERANCES["gradient"], first  # the node's own rounding only
    assert step.nodes is not None and [c.node for c in step.nodes.failures] == [planted]


@pytest.mark.parametrize("model", ["mlp", "resnet18", "transformer", "gpt"])
def test_correct_runs_pass_per_node(model):
    prep = prepared(model, 2)
    v = verify_run(prep, steps=1)
    assert v.ok, v.summary()
    nodes = v.steps[0].nodes
    assert nodes is not None and nodes.worst is not None and not nodes.failures
    assert nodes.checked + sum(nodes.skipped.values()) == len(prep.graph.nodes), nodes  # every node accounted for
    optimizer = sum(1 for n in prep.graph.nodes if n.phase == "optimizer")
    assert nodes.skipped["not in the training model"] == optimizer, nodes.skipped
    assert set(nodes.skipped) <= {"not in the training model", "updates state in place", "a view (no kernel)"}, nodes
    assert nodes.worst.error / nodes.worst.tolerance < 0.1, nodes.worst  # far from a false alarm
    assert v.tolerances["node"] == NODE_TOLERANCE
    assert v.as_dict()["steps"][0]["nodes"]["checked"] == nodes.checked


def test_an_in_place_kernel_is_checked_on_what_it_read(monkeypatch):
    """ONNX Runtime's node reads copies of our inputs taken before our kernel runs: an Add or Sum
    planned in place (its output over an input's buffer) is compared on the inputs it was given;
    on our inputs after our kernel, ONNX Runtime would read the sum as an input and fail."""
    from onnxplan.verification import step_check

    prep = prepared("resnet18", 2)
    buf = _buffer_of(prep)
    in_place = {n.name for n in prep.graph.nodes if n.op_type in ("Add", "Sum") and any(
        o and buf.get(o) is not None and any(buf.get(i) is buf.get(o) for i in n.inputs if i) for o in n.outputs)}
    assert in_place, "resnet18's plan runs no Add or Sum in place"
    checked: set[str] = set()
    real = step_check._Hooks._node_reference

    def recording(self, node, counterpart, feeds):
        got = real(self, node, counterpart, feeds)
        if got is not None:
            checked.add(node.name)
        return got
    monkeypatch.setattr(step_check._Hooks, "_node_reference", recording)
    v = verify_run(prep, steps=1)
    assert v.ok, v.summary()
    assert in_place <= checked, in_place - checked


def test_infinities_on_which_both_kernels_agree_are_agreement():
    """Two kernels given infinities (a stale swap-in's garbage) agree where they produce the same
    infinity or NaN: no per-node failure there; a finite value against an infinity still fails."""
    from onnxplan.ir.graph import Node
    from onnxplan.verification.node_check import compare_node

    node = Node("n", "Relu", "", ["x"], ["y"])
    want = np.array([np.inf, -np.inf, np.nan, 1.0, 2.0], np.float32)
    same = compare_node(node, [want.copy()], {0: want}, {}, [want])
    assert same[0].ok and same[0].error == 0.0, same
    other = want.copy()
    other[0] = 3.0
    assert not compare_node(node, [other], {0: want}, {}, [want])[0].ok


def test_the_report_says_what_was_compared_per_node_and_names_the_failing_node(monkeypatch):
    from rich.console import Console

    from onnxplan.verification.report import describe_verification

    def text(v) -> str:
        console = Console(width=400, record=True)
        for r in describe_verification(v.as_dict()):
            console.print(r)
        return console.export_text()

    prep = prepared("resnet18", 2)
    ok = text(verify_run(prep, steps=1))
    assert "per node (each kernel against ONNX Runtime's on the same inputs):" in ok
    assert "node(s) checked; worst" in ok and "not in the training model:" in ok
    planted = _plant_small_error(monkeypatch, prep, "ConvGrad")
    bad = text(verify_run(prep, steps=1))
    assert f"first value in execution order that differs: node conv1.weight_grad computed by node {planted!r}" in bad
    assert "our kernel and ONNX Runtime's differ on the same inputs at this node" in bad


def test_integer_and_boolean_outputs_are_compared_exactly():
    """MaxPool's indices 9 off in 100,000 (the gradient routed elsewhere), a mask with one element
    flipped: each fails (found by review: a share of differing elements under 1e-4 had passed);
    equal ones pass, at ratio 0."""
    from onnxplan.ir.graph import Node
    from onnxplan.verification.node_check import compare_node

    want = np.arange(100_000, dtype=np.int64)
    y = np.ones(100_000, np.float32)
    ours = want.copy()
    ours[1:10] = 0  # 9 indices wrong (index 0 is 0 already)
    pool = Node("pool", "MaxPool", "", ["x"], ["y", "idx"])
    bad = compare_node(pool, [y, ours], {0: y, 1: want}, {}, [y])[1]
    assert not bad.ok and bad.error == pytest.approx(9e-5) and bad.ratio == float("inf")
    good = compare_node(pool, [y, want.copy()], {0: y, 1: want}, {}, [y])[1]
    assert good.ok and good.ratio == 0.0
    mask = np.zeros(50_000, bool)
    flipped = mask.copy()
    flipped[3] = True
    assert not compare_node(Node("eq", "Equal", "", ["a", "b"], ["m"]), [flipped], {0: mask}, {}, [])[0].ok


@pytest.mark.parametrize("op", ["ReduceSumTraining", "ReduceMean"])
def test_a_reduction_that_cancels_is_held_to_its_rounding_floor(op):
    """A bias gradient (ReduceSumTraining) or a mean over centred values is ~0: our kernel and ONNX
    Runtime's differ by their rounding, O(1) relative. With the reduction's own floor (what the
    step hook gives every op of REDUCTION_OPS) the correct kernel passes; held to the flat
    tolerance alone it would fail (found by review: 0.64-0.75 against 1e-4)."""
    from onnx import TensorProto
    from onnx import helper as h

    from onnxplan.ir.graph import Node
    from onnxplan.kernels.registry import KernelContext, find_kernel
    from onnxplan.verification.node_check import NodeReference, compare_node
    from onnxplan.verification.step_check import REDUCTION_OPS, reduction_floor

    assert op in REDUCTION_OPS
    rng = np.random.default_rng(0)
    shape, axes = (64, 4096), (1,)
    x = rng.standard_normal(shape).astype(np.float32)
    x -= x.mean(axis=axes, keepdims=True, dtype=np.float64).astype(np.float32)
    domain = "com.microsoft" if op == "ReduceSumTraining" else ""
    graph = h.make_graph([h.make_node(op, ["x", "axes"], ["y"], domain=domain, keepdims=0)], "g",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, shape),
                          h.make_tensor_value_info("axes", TensorProto.INT64, [1])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [64])])
    ref = NodeReference(h.make_model(graph, opset_imports=[h.make_opsetid("", 18), h.make_opsetid("com.microsoft", 1)]))
    try:
        node = Node("n", op, domain, ["x", "axes"], ["y"], {"keepdims": 0}, phase="backward")
        kernel = find_kernel(node, 1 if domain else 18).fn
        ctx = KernelContext(np, node, [None, None], [None])
        ours = np.empty(64, np.float32)
        kernel(ctx, [x, np.array(axes, np.int64)], [ours])
        cp = ref.counterpart(node)
        feeds = ref.feeds(cp, [x, np.array(axes, np.int64)], [ours])
        theirs = ref.run(cp, feeds)
        inputs = list(feeds.inputs.values())
        own = reduction_floor(kernel, ctx, [x, np.array(axes, np.int64)], [ours], np)
        assert compare_node(node, [ours], theirs, {k: c * m for k, (c, m) in own.items()}, inputs)[0].ok
        assert not compare_node(node, [ours], theirs, {}, inputs)[0].ok  # the floor is what passes it
    finally:
        ref.close()


def test_one_node_sessions_run_on_one_thread():
    """A session per node signature is kept for the run: each must not hold a pool of native
    threads (found by review: 840 threads at 16 threads on resnet18)."""
    from onnx import TensorProto
    from onnx import helper as h

    from onnxplan.ir.graph import Node
    from onnxplan.verification.node_check import NodeReference

    graph = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    ref = NodeReference(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)]))
    try:
        node = Node("r", "Relu", "", ["x"], ["y"])
        cp = ref.counterpart(node)
        x = np.arange(-2, 2, dtype=np.float32)
        feeds = ref.feeds(cp, [x], [np.empty(4, np.float32)])
        assert np.array_equal(ref.run(cp, feeds)[0], np.maximum(x, 0))
        (session,) = ref._sessions.values()
        opts = session.get_session_options()
        assert opts.intra_op_num_threads == 1 and opts.inter_op_num_threads == 1
    finally:
        ref.close()
