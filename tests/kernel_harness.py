"""Shared machinery of the kernel tests: one-node ONNX models run by ONNX Runtime and the ONNX
reference evaluator, and our kernels run on numpy arrays the way the executor runs them.

Outputs are described the same way everywhere (`outs`):
  - an int n: n outputs of unstated type (the model's graph outputs carry names only), or
  - a list with, per output, None (an omitted optional output), a (dtype, shape) pair (shape may
    be None in a model), or an array whose dtype and shape it takes (e.g. a reference's result).
"""

from __future__ import annotations

import dataclasses
import os
import tracemalloc
import zlib

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper
from onnx.reference import ReferenceEvaluator

from onnxplan.ir.graph import Node
from onnxplan.ir.tensor import TensorSpec, numpy_to_onnx_dtype
from onnxplan.kernels.registry import KernelContext, bound_kernel, find_kernel, scratch_bytes

__all__ = [
    "count_loop_calls",
    "ATOL", "DEVICE", "MS", "RNG", "RTOL", "F", "arena_run", "assert_close", "assert_equal_on_cpu",
    "assert_sums_close", "call_kernel", "check",
    "make_node", "one_node_model", "ort_run", "peak_bytes", "rand", "randn", "ref_run", "reseed", "run_kernel", "seed_for",
]

MS = "com.microsoft"
F = np.float32
RTOL, ATOL = 1e-5, 1e-6

# ONNXPLAN_TEST_DEVICE=cuda runs every call_kernel (hence run_kernel and check) on CuPy arrays
# on the GPU: the same tests, the same references, our kernels on the device.
DEVICE = os.environ.get("ONNXPLAN_TEST_DEVICE", "cpu")
if DEVICE == "cuda":
    import cupy as XP
else:
    XP = np

KERNEL_PATH = "bound"  # call_kernel: "bound" as the executor calls kernels, or "plain" (the unbound fn)

RNG = np.random.default_rng(0)  # reseeded before every test from its node id (tests/conftest.py)


def seed_for(key: str) -> int:
    """A stable seed for a test id: the same data whatever ran before it."""
    return zlib.crc32(key.encode())


def reseed(key: str) -> None:
    """Restart RNG (in place: test modules import the object) from `key`'s seed."""
    RNG.bit_generator.state = np.random.default_rng(seed_for(key)).bit_generator.state


def rand(*shape, lo=-3.0, hi=3.0, dtype=F):
    """Uniform values from RNG, the current test's own stream."""
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def randn(rng, *shape, scale=1.0, shift=0.0):
    """Standard normal float32 values from `rng`, times scale plus shift."""
    return (rng.standard_normal(shape) * scale + shift).astype(np.float32)


# ---- one-node models ---------------------------------------------------------------------------
_UNTYPED = ()  # an output that exists but whose type is not stated (an int `outs`)


def _out_entries(outs) -> list:
    return [_UNTYPED] * outs if isinstance(outs, int) else list(outs)


def _spec(entry):
    """(dtype, shape) of an `outs` entry that states one; None for an omitted or untyped output."""
    if isinstance(entry, np.ndarray):
        return entry.dtype, entry.shape
    return None if entry is None or entry is _UNTYPED else entry


def _names(inputs: list, outs) -> tuple[list[str], list[str]]:
    ins = [f"i{k}" if a is not None else "" for k, a in enumerate(inputs)]
    onames = [f"o{k}" if e is not None else "" for k, e in enumerate(_out_entries(outs))]
    return ins, onames


def make_node(op: str, inputs: list, outs=1, attrs: dict | None = None, domain: str = "") -> Node:
    """Our IR node for `op` on inputs i0, i1, ... ("" where None) and outputs o0, o1, ..."""
    ins, onames = _names(inputs, outs)
    return Node("n", op, domain, ins, onames, dict(attrs or {}))


def one_node_model(op: str, inputs: list, outs=1, attrs: dict | None = None,
                   domain: str = "") -> tuple[onnx.ModelProto, dict]:
    """A model of one node (opsets: default 17, com.microsoft 1) and its feeds; graph outputs are
    typed where `outs` states a type (ORT's MaxPoolGrad reads their shapes)."""
    ins, onames = _names(inputs, outs)
    node = helper.make_node(op, ins, onames, domain=domain or None, **(attrs or {}))
    graph_in = [helper.make_tensor_value_info(n, numpy_to_onnx_dtype(a.dtype), a.shape)
                for n, a in zip(ins, inputs) if a is not None]
    graph_out = []
    for n, entry in zip(onames, _out_entries(outs)):
        spec = _spec(entry)
        if spec is not None:
            graph_out.append(helper.make_tensor_value_info(n, numpy_to_onnx_dtype(spec[0]), spec[1]))
        elif n:
            graph_out.append(onnx.ValueInfoProto(name=n))
    graph = helper.make_graph([node], "one_node", graph_in, graph_out)
    model = helper.make_model(graph, ir_version=9, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    feeds = {n: a for n, a in zip(ins, inputs) if a is not None}
    return model, feeds


def ort_run(op: str, inputs: list, outs=1, attrs: dict | None = None, domain: str = "") -> list[np.ndarray]:
    """ONNX Runtime (the training build registers the com.microsoft training ops) on one node."""
    model, feeds = one_node_model(op, inputs, outs, attrs, domain)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [np.asarray(r) for r in session.run(None, feeds)]


def ref_run(op: str, inputs: list, outs=1, attrs: dict | None = None) -> list[np.ndarray]:
    """The ONNX reference evaluator on a one-node default-domain model."""
    model, feeds = one_node_model(op, inputs, outs, attrs, "")
    return [np.asarray(r) for r in ReferenceEvaluator(model).run(None, feeds)]


# ---- our kernels -------------------------------------------------------------------------------
def call_kernel(node: Node, inputs: list, outputs: list, random=None) -> None:
    """Call the registered kernel as the executor does: specs from the arrays (None for an omitted
    one), the declared scratch exactly, poisoned with 0xFF bytes so it must be written first, and
    the kernel bound to these arrays first (its bind rule's specialisation, where it has one).
    KERNEL_PATH = "plain" calls the unbound fn instead (tests comparing the two paths).
    random: the Randomness random ops draw from (None: the kernels' seeded default)."""
    spec = lambda a: None if a is None else TensorSpec(a.dtype, a.shape)
    in_specs, out_specs = [spec(a) for a in inputs], [spec(a) for a in outputs]
    nbytes = scratch_bytes(node, in_specs, out_specs)
    scratch = XP.full(nbytes, 0xFF, dtype=np.uint8) if nbytes else None
    if XP is np:
        ctx = KernelContext(np, node, in_specs, out_specs, scratch, random)
        decl = find_kernel(node)
        fn = decl.fn if KERNEL_PATH == "plain" else bound_kernel(decl, ctx, inputs, outputs)
        fn(ctx, inputs, outputs)
        return
    # On the device: one device array per distinct host array (an output aliased to an input
    # stays one buffer), then every array copied back, since a kernel may write its inputs.
    device: dict[int, tuple] = {}

    def up(a):
        if a is None:
            return None
        if id(a) not in device:
            device[id(a)] = (a, XP.asarray(a))
        return device[id(a)][1]

    d_in, d_out = [up(a) for a in inputs], [up(a) for a in outputs]
    find_kernel(node).fn(KernelContext(XP, node, in_specs, out_specs, scratch, random), d_in, d_out)
    for host, dev in device.values():
        if host.flags.writeable:
            host[...] = dev.get()


def _garbage(dtype, shape):
    """An output array full of values a kernel must overwrite (NaN, or -7 for integers)."""
    return np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -7, dtype)


def run_kernel(op: str, inputs: list, outs, attrs: dict | None = None, domain: str = "", *,
               outputs: list | None = None, alias: tuple[int, int] | None = None,
               node: Node | None = None) -> list:
    """Run our kernel for `op` on numpy arrays and return its outputs.

    outs: the outputs (see the module docstring); each is preallocated full of garbage, unless
    `outputs` gives the arrays themselves (then they may be inputs, written in place).
    alias=(o, i): output o is input i's very memory (all inputs are copied first, so the caller's
    arrays are never changed). node: run this node instead of make_node's.
    """
    inputs = list(inputs)
    if outputs is None:
        outputs = [None if s is None else _garbage(*s) for s in map(_spec, _out_entries(outs))]
    if alias is not None:
        inputs = [None if x is None else np.array(x, copy=True) for x in inputs]
        o, i = alias
        assert inputs[i].shape == outputs[o].shape and inputs[i].dtype == outputs[o].dtype
        outputs[o] = inputs[i]
    call_kernel(node or make_node(op, inputs, outs, attrs, domain), inputs, outputs)
    return outputs


def arena_run(op: str, inputs: list, outs, attrs: dict | None = None, domain: str = ""):
    """Like run_kernel, but inputs, outputs and scratch are disjoint views of one allocation
    (as in the executor's arena), so numpy's overlap checks see what they will see there.
    Returns (the call, the output arrays)."""
    node = make_node(op, inputs, outs, attrs, domain)
    ins = [TensorSpec(a.dtype, a.shape) if a is not None else None for a in inputs]
    outs = [None if s is None else TensorSpec(*s) for s in map(_spec, _out_entries(outs))]
    nbytes = scratch_bytes(node, ins, outs)
    specs = [s for s in ins + outs if s is not None] + [TensorSpec("uint8", (nbytes,))]
    offsets, total = [], 0
    for s in specs:
        offsets.append(total)
        total += -(-s.nbytes // 64) * 64
    arena = np.zeros(total + 64, np.uint8)
    shift = (-arena.ctypes.data) % 64
    views = iter([arena[shift + o: shift + o + s.nbytes].view(s.dtype).reshape(s.shape)
                  for o, s in zip(offsets, specs)])
    in_arrays = []
    for a in inputs:
        if a is None:
            in_arrays.append(None)
            continue
        view = next(views)
        view[...] = a
        in_arrays.append(view)
    out_arrays = [next(views) if s is not None else None for s in outs]
    scratch = next(views) if nbytes else None
    ctx = KernelContext(np, node, ins, outs, scratch)
    fn = find_kernel(node).fn
    return lambda: fn(ctx, in_arrays, out_arrays), out_arrays


def peak_bytes(fn) -> int:
    """Peak bytes allocated (and traced) while fn runs, beyond what was live before."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


# ---- comparisons -------------------------------------------------------------------------------
def assert_close(got, want, rtol=RTOL, atol=ATOL) -> None:
    """Output by output: the same shape and dtype, and values within the tolerances."""
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def assert_equal_on_cpu(got, want) -> None:
    """Bit for bit on the CPU (our numpy kernels follow ORT's order of operations); on the GPU,
    whose reductions sum in another order, within RTOL/ATOL."""
    if XP is np:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def assert_sums_close(got, expected, rtol=1e-5):
    """Sums of many products or reductions in another order than ORT's (MLAS, Eigen; OpenBLAS
    blocking, chunking): the rounding error scales with the magnitude of the terms, not of the
    (possibly cancelling) result, so the absolute tolerance is rtol times the largest expected value."""
    expected = np.asarray(expected)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol * float(np.abs(expected).max()))

def assert_conv_grad_like_ort(inputs: list, x_shape, w_shape, attrs: dict, wanted) -> None:
    """ConvGrad (dY, X, W) against ONNX Runtime's for each (dX, dW, dB) choice in `wanted` (1:
    that output is asked for): every output asked for, by its sums (assert_sums_close)."""
    for which in wanted:
        outs = [s if keep else None for s, keep in zip(
            [("float32", x_shape), ("float32", w_shape), ("float32", (w_shape[0],))], which)]
        got = [g for g in run_kernel("ConvGrad", inputs, outs, attrs, MS) if g is not None]
        expected = ort_run("ConvGrad", inputs, outs, attrs, MS)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_sums_close(g, e)


def check(op: str, inputs: list, attrs: dict | None = None, n_out: int = 1, domain: str = "",
          against=("reference", "ort"), aliases=(), rtol=RTOL, atol=ATOL) -> None:
    """Our kernel equals the reference(s), plain and with each (output, input) alias."""
    wants = []
    if "reference" in against and not domain:
        wants.append(ref_run(op, inputs, n_out, attrs))
    if "ort" in against:
        wants.append(ort_run(op, inputs, n_out, attrs, domain))
    for alias in (None, *aliases):
        got = run_kernel(op, inputs, wants[0], attrs, domain, alias=alias)
        for want in wants:
            assert_close(got, want, rtol, atol)


# ---- the fused C loops -------------------------------------------------------------------------
def count_loop_calls(monkeypatch, accessor: str, fields: tuple[str, ...]) -> dict[str, int]:
    """Counts of the calls of each of `fields` of kernels.native.<accessor>()'s loops while the
    test runs (the loops are wrapped, not replaced; None stays None: no compiler)."""
    from onnxplan.kernels import native

    counts = dict.fromkeys(fields, 0)
    real = getattr(native, accessor)

    def counting(name, fn):
        def call(*args):
            counts[name] += 1
            return fn(*args)
        return call

    def spy():
        fns = real()
        return None if fns is None else dataclasses.replace(fns, **{k: counting(k, getattr(fns, k)) for k in fields})

    monkeypatch.setattr(native, accessor, spy)
    return counts
