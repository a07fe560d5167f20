"""Kernels with a bind rule (onnxplan.kernels.registry.bound_kernel): the specialisation the
executor calls gives the same bits as the plain kernel, step after step (values change between
calls, memory does not), and other arrays still go to the plain kernel."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan.ir.tensor import TensorSpec
from onnxplan.kernels.optimizer import CHUNK
from onnxplan.kernels.random import Randomness
from onnxplan.kernels.registry import KernelContext, bound_kernel, find_kernel, scratch_bytes
from tests.kernel_harness import MS, RNG, make_node, peak_bytes, rand

F = np.float32
OURS = "onnxplan"
ADAMW = {"alpha": 0.9, "beta": 0.999, "epsilon": 1e-8, "correct_bias": 1}


def _adamw(n: int, mode: int, wd: float):
    def make():
        v = np.abs(rand(n, lo=0, hi=1e-3))
        return [np.array([RNG.uniform(1e-4, 1e-2)], F), np.array([RNG.integers(1, 9)], np.int64),
                rand(n), rand(n, lo=-0.1, hi=0.1), rand(n, lo=-0.01, hi=0.01), v]
    return ("AdamWUpdate", OURS, make, {**ADAMW, "adam_mode": mode, "weight_decay": wd}, 3)


def _same_shape(k: int, *shape, lo=-3.0, hi=3.0):
    return lambda: [rand(*shape, lo=lo, hi=hi) for _ in range(k)]


def _softmax_pair():
    x = rand(6, 10)
    y = np.exp(x - x.max(axis=-1, keepdims=True))
    return [rand(6, 10), (y / y.sum(axis=-1, keepdims=True)).astype(F)]


def _bn_inputs(n=2, c=3, *spatial):
    spatial = spatial or (4, 5)
    return lambda: [rand(n, c, *spatial), rand(c), rand(c), rand(c), rand(c, lo=0.1, hi=2.0)]


def _bn_grad_inputs(n=2, c=3, *spatial):
    spatial = spatial or (4, 5)
    return lambda: [rand(n, c, *spatial), rand(n, c, *spatial), rand(c), rand(c), rand(c, lo=0.5, hi=2.0)]


def _bn_outs(k):
    return lambda x: [(x[0].shape, F)] + [((x[0].shape[1],), F)] * (k - 1)


def _ln_outs(k):
    return lambda x: [(x[0].shape, F)] + [((*x[0].shape[:-1], 1), F)] * (k - 1)


def _ln_grad_inputs(simplified: bool, rows=(2, 5), m=8):
    stats = [rand(*rows, 1)] if not simplified else []
    return lambda: [rand(*rows, m), rand(*rows, m), rand(m), *stats, rand(*rows, 1, lo=0.5, hi=2.0)]


# (id, (op, domain, make inputs, attrs, outputs), aliases (output, input) to try besides none)
CASES = {
    "adamw-hf-small": (_adamw(37, 1, 0.01), [(0, 2), (1, 4), (2, 5)]),
    "adamw-torch-wd": (_adamw(CHUNK + 77, 0, 0.01), [(0, 2), (1, 4), (2, 5)]),  # two chunks
    "adamw-no-decay": (_adamw(300, 1, 0.0), []),
    "sgd": (("SGDUpdate", OURS, lambda: [np.array([0.05], F), rand(4, 5), rand(4, 5)], {}, 1), [(0, 1)]),
    "acc-add": (("InPlaceAccumulatorV2", MS, lambda: [rand(4, 3), rand(4, 3), np.array([False])], {}, 2),
                [(1, 0), (1, 1)]),
    "acc-overwrite": (("InPlaceAccumulatorV2", MS, lambda: [rand(4, 3), rand(4, 3), np.array([True])], {}, 2),
                      [(1, 0), (1, 1)]),
    "transpose": (("Transpose", "", _same_shape(1, 2, 3, 4), {"perm": [2, 0, 1]}, 1), []),
    "transpose-default": (("Transpose", "", _same_shape(1, 3, 5), {}, 1), []),
    "sum3": (("Sum", "", _same_shape(3, 4, 5), {}, 1), [(0, 1)]),
    "mean2": (("Mean", "", _same_shape(2, 4, 5), {}, 1), [(0, 0)]),
    "max-broadcast": (("Max", "", lambda: [rand(4, 5), rand(5)], {}, 1), [(0, 0)]),
    "reducesum-axes": (("ReduceSum", "", lambda: [rand(3, 4, 5), np.array([0, 2], np.int64)], {"keepdims": 0}, 1), []),
    "reducesum-all": (("ReduceSum", "", lambda: [rand(3, 4, 5)], {}, 1), []),
    "reducemean-attr": (("ReduceMean", "", _same_shape(1, 3, 4, 5), {"axes": [1], "keepdims": 1}, 1), []),
    "reducemax-noop": (("ReduceMax", "", lambda: [rand(3, 4), np.array([], np.int64)],
                        {"noop_with_empty_axes": 1}, 1), []),
    "dropout": (("Dropout", "", lambda: [rand(6, 8), np.array(0.3, F), np.array(True)], {}, 2), [(0, 0)]),
    "dropout-eval": (("Dropout", "", lambda: [rand(6, 8), np.array(0.3, F), np.array(False)], {}, 2), []),
    "pad-constant": (("Pad", "", lambda: [rand(2, 3, 4), np.array([0, 1, 2, 0, 1, 0], np.int64),
                                          np.array(1.5, F)], {}, 1), []),
    "pad-reflect": (("Pad", "", lambda: [rand(2, 3, 4), np.array([0, 2, 1, 0, 1, 2], np.int64)],
                     {"mode": "reflect"}, 1), []),
    "pad-edge-crop": (("Pad", "", lambda: [rand(2, 3, 4), np.array([1, -1, 2, 0, 0, -1], np.int64)],
                       {"mode": "edge"}, 1), []),
    "clip": (("Clip", "", lambda: [rand(4, 5), np.array(-1.0, F), np.array(RNG.uniform(0, 2), F)], {}, 1),
             [(0, 0)]),
    "concat": (("Concat", "", lambda: [rand(2, 3), rand(2, 1), rand(2, 4)], {"axis": 1},
                lambda x: [((2, 8), F)]), []),
    "concat-training": (("ConcatTraining", MS, lambda: [rand(1, 3), rand(2, 3)], {"axis": 0},
                         lambda x: [((3, 3), F), ((2,), np.int64)]), []),
    "split": (("Split", "", _same_shape(1, 2, 7), {"axis": 1}, lambda x: [((2, 3), F), ((2, 4), F)]), []),
    "split-training": (("SplitTraining", MS, _same_shape(1, 6, 2), {}, lambda x: [((1, 2), F), ((5, 2), F)]),
                       []),
    "dropout-grad": (("DropoutGrad", MS, lambda: [rand(4, 6), RNG.uniform(size=(4, 6)) > 0.3,
                                                  np.array(0.3, F)], {}, lambda x: [((4, 6), F)]), [(0, 0)]),
    "scale": (("Scale", MS, lambda: [rand(4, 5), np.array([RNG.uniform(0.5, 3)], F)], {}, 1), [(0, 0)]),
    "scale-down": (("Scale", MS, lambda: [rand(4, 5), np.array([RNG.uniform(0.5, 3)], F)], {"scale_down": 1},
                    1), [(0, 0)]),
    "gelu": (("Gelu", MS, _same_shape(1, 6, 16, lo=-6, hi=6), {}, 1), [(0, 0)]),
    "gelu-20-tanh": (("Gelu", "", _same_shape(1, 6, 16), {"approximate": "tanh"}, 1), [(0, 0)]),
    "fast-gelu-bias": (("FastGelu", MS, lambda: [rand(6, 16), rand(16)], {}, 1), [(0, 0)]),
    "bias-gelu": (("BiasGelu", MS, lambda: [rand(6, 16), rand(16)], {}, 1), [(0, 0)]),
    "erf": (("Erf", "", _same_shape(1, 6, 16), {}, 1), [(0, 0)]),
    "gelu-grad": (("GeluGrad", MS, _same_shape(2, 6, 16), {}, 1), [(0, 0), (0, 1)]),
    "relu-grad": (("ReluGrad", MS, _same_shape(2, 6, 16), {}, 1), [(0, 0), (0, 1)]),
    "softmax": (("Softmax", "", _same_shape(1, 2, 3, 10), {"axis": -1}, 1), [(0, 0)]),
    "log-softmax": (("LogSoftmax", "", _same_shape(1, 6, 10), {}, 1), [(0, 0)]),
    "softmax-grad-13": (("SoftmaxGrad_13", MS, _softmax_pair, {}, 1), [(0, 0), (0, 1)]),
    "softmax-grad": (("SoftmaxGrad", MS, _softmax_pair, {"axis": 1}, 1), [(0, 0)]),
    "layernorm": (("LayerNormalization", "", lambda: [rand(2, 5, 8), rand(8), rand(8)], {"epsilon": 1e-3},
                   _ln_outs(3)), []),
    "layernorm-ms-y-only": (("LayerNormalization", MS, lambda: [rand(2, 5, 8), rand(8)], {}, 1), []),
    "layernorm-axis1": (("LayerNormalization", "", lambda: [rand(3, 2, 4), rand(2, 4)], {"axis": 1},
                         lambda x: [((3, 2, 4), F), ((3, 1, 1), F), ((3, 1, 1), F)]), []),
    "rmsnorm": (("SimplifiedLayerNormalization", MS, lambda: [rand(2, 5, 8), rand(8)], {}, _ln_outs(2)), []),
    "layernorm-grad": (("LayerNormalizationGrad", MS, _ln_grad_inputs(False), {}, lambda x: [
        ((2, 5, 8), F), ((8,), F), ((8,), F)]), []),
    "layernorm-grad-no-dx": (("LayerNormalizationGrad", MS, _ln_grad_inputs(False), {}, lambda x: [
        None, ((8,), F), ((8,), F)]), []),
    "rmsnorm-grad": (("SimplifiedLayerNormalizationGrad", MS, _ln_grad_inputs(True), {}, lambda x: [
        ((2, 5, 8), F), ((8,), F)]), []),
    "maxpool": (("MaxPool", "", _same_shape(1, 2, 3, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2],
                                                           "pads": [1, 1, 1, 1]}, lambda x: [((2, 3, 4, 4), F)]), []),
    "maxpool-indices": (("MaxPool", "", _same_shape(1, 2, 3, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2],
                                                                   "pads": [1, 1, 1, 1]},
                         lambda x: [((2, 3, 4, 4), F), ((2, 3, 4, 4), np.int64)]), []),
    "maxpool-indices-1d-dilated": (("MaxPool", "", _same_shape(1, 3, 2, 9), {
        "kernel_shape": [2], "dilations": [2], "storage_order": 0}, lambda x: [((3, 2, 7), F), ((3, 2, 7), np.int64)]),
        []),
    "maxpool-indices-empty-window": (("MaxPool", "", _same_shape(1, 2, 2, 3, 3), {
        "kernel_shape": [2, 2], "strides": [2, 2], "pads": [2, 0, 0, 0]},
        lambda x: [((2, 2, 3, 1), F), ((2, 2, 3, 1), np.int64)]), []),
    "matmul-folded": (("MatMul", "", lambda: [rand(2, 3, 4), rand(4, 5)], {}, lambda x: [((2, 3, 5), F)]), []),
    "matmul-broadcast": (("MatMul", "", lambda: [rand(3, 4), rand(2, 4, 5)], {}, lambda x: [((2, 3, 5), F)]), []),
    "matmul-vector": (("MatMul", "", lambda: [rand(4), rand(2, 4, 5)], {}, lambda x: [((2, 5), F)]), []),
    "fused-matmul": (("FusedMatMul", MS, lambda: [rand(2, 4, 3), rand(5, 4)], {"transA": 1, "transB": 1,
                                                                            "alpha": 0.5},
                      lambda x: [((2, 3, 5), F)]), []),
    "fused-matmul-trans-batch": (("FusedMatMul", MS, lambda: [rand(3, 2, 4), rand(2, 4, 5)],
                                  {"transBatchA": 1}, lambda x: [((2, 3, 5), F)]), []),
    "transpose-matmul": (("TransposeMatMul", MS, lambda: [rand(2, 3, 4), rand(4, 5)], {},
                          lambda x: [((2, 3, 5), F)]), []),
    "conv-pointwise-bias": (("Conv", "", lambda: [rand(2, 4, 3, 5), rand(6, 4, 1, 1), rand(6)], {},
                             lambda x: [((2, 6, 3, 5), F)]), []),
    "conv-pointwise-grouped": (("Conv", "", lambda: [rand(2, 4, 3, 5), rand(6, 2, 1, 1)], {"group": 2},
                                lambda x: [((2, 6, 3, 5), F)]), []),
    "batchnorm-inference": (("BatchNormalization", "", _bn_inputs(), {"epsilon": 1e-3}, 1), []),
    "batchnorm-internal": (("BatchNormInternal", MS, _bn_inputs(), {"momentum": 0.8}, _bn_outs(5)),
                           [(1, 3), (2, 4)]),
    "batchnorm-internal-1d": (("BatchNormInternal", MS, _bn_inputs(4, 6, 1), {}, _bn_outs(3)), [(1, 3)]),
    "batchnorm-grad": (("BatchNormalizationGrad", MS, _bn_grad_inputs(), {}, _bn_outs(3)), []),
    "batchnorm-grad-no-dx": (("BatchNormalizationGrad", MS, _bn_grad_inputs(3, 2, 7),
                              {}, lambda x: [None, ((2,), F), ((2,), F)]), []),
    # from norm.TORCH_ELEMS elements the elementwise passes run on torch: still the same bits
    "layernorm-large": (("LayerNormalization", "", lambda: [rand(16, 8, 160), rand(160), rand(160)],
                         {"epsilon": 1e-3}, _ln_outs(3)), []),
    "rmsnorm-large": (("SimplifiedLayerNormalization", MS, lambda: [rand(16, 8, 160), rand(160)], {},
                       _ln_outs(2)), []),
    "layernorm-grad-large": (("LayerNormalizationGrad", MS, _ln_grad_inputs(False, (16, 8), 160), {},
                              lambda x: [((16, 8, 160), F), ((160,), F), ((160,), F)]), []),
    "rmsnorm-grad-large": (("SimplifiedLayerNormalizationGrad", MS, _ln_grad_inputs(True, (16, 8), 160), {},
                            lambda x: [((16, 8, 160), F), ((160,), F)]), []),
    "batchnorm-inference-large": (("BatchNormalization", "", _bn_inputs(4, 8, 24, 24), {"epsilon": 1e-3}, 1), []),
    "batchnorm-internal-large": (("BatchNormInternal", MS, _bn_inputs(4, 8, 24, 24), {"momentum": 0.8},
                                  _bn_outs(5)), [(1, 3), (2, 4)]),
    "batchnorm-grad-large": (("BatchNormalizationGrad", MS, _bn_grad_inputs(4, 8, 24, 24), {}, _bn_outs(3)), []),
}
OPSETS = {("Gelu", ""): 20}


def _node_and_ctx(op, domain, inputs, outs, attrs):
    node = make_node(op, inputs, len(outs), attrs, domain)
    spec = lambda a: None if a is None else TensorSpec(a.dtype, a.shape)
    in_specs, out_specs = [spec(a) for a in inputs], [spec(a) for a in outs]
    nbytes = scratch_bytes(node, in_specs, out_specs, OPSETS.get((op, domain)))
    scratch = np.full(nbytes, 0xFF, np.uint8) if nbytes else None
    return node, KernelContext(np, node, in_specs, out_specs, scratch, Randomness(7))


def _run(path: str, case, alias, steps: list[list], peaks: list | None = None) -> list:
    """Bind once to fresh arrays, then per step write the step's values into them and call:
    (inputs, outputs) after each step; each call's peak of allocated bytes into `peaks` when given."""
    (op, domain, _make, attrs, n_out) = case
    first = [np.array(a, copy=True) for a in steps[0]]
    if callable(n_out):  # the case states its outputs: [(shape, dtype)...]
        outs = [None if o is None else np.full(o[0], np.nan if np.dtype(o[1]).kind == "f" else -7, o[1])
                for o in n_out(first)]  # None: an omitted output
    else:
        outs = [np.full(_out_shape(op, first, attrs, k), np.nan if k == 0 or op != "Dropout" else True,
                        F if k == 0 or op != "Dropout" else bool) for k in range(n_out)]
    if op == "InPlaceAccumulatorV2":
        outs[0] = np.zeros(1, bool)
    if alias is not None:
        outs[alias[0]] = first[alias[1]]
    node, ctx = _node_and_ctx(op, domain, first, outs, attrs)
    decl = find_kernel(node, OPSETS.get((op, domain)))
    fn = decl.fn if path == "plain" else bound_kernel(decl, ctx, first, outs)
    if path == "bound":
        assert fn is not decl.fn, f"{op}: its bind rule did not specialise"
    seen = []
    for values in steps:
        for a, v in zip(first, values):
            a[...] = v
        if peaks is None:
            fn(ctx, first, outs)
        else:
            peaks.append(peak_bytes(lambda: fn(ctx, first, outs)))
        seen.append([a.copy() for a in (*first, *outs) if a is not None])
    return seen


def _out_shape(op, inputs, attrs, k):
    x = inputs[0]
    if op == "Transpose":
        return np.transpose(x, attrs.get("perm")).shape
    if op in ("AdamWUpdate", "SGDUpdate"):  # (p', m', v') or p': the parameter's shape
        return inputs[2 if op == "AdamWUpdate" else 1].shape
    if op == "InPlaceAccumulatorV2":
        return (1,) if k == 0 else x.shape
    if op == "Pad":
        pads = [int(p) for p in inputs[1]]
        return tuple(d + pads[i] + pads[i + x.ndim] for i, d in enumerate(x.shape))
    if op.startswith("Reduce"):
        axes = attrs.get("axes") or (list(inputs[1]) if len(inputs) > 1 else None)
        if axes is not None and len(axes) == 0 and attrs.get("noop_with_empty_axes"):
            return x.shape
        keep = attrs.get("keepdims", 1)
        axes = range(x.ndim) if axes is None else [int(a) for a in axes]
        return tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)
    return x.shape


@pytest.mark.parametrize("name", sorted(CASES))
def test_bound_equals_plain_step_after_step(name):
    case, aliases = CASES[name]
    steps = [case[2]() for _ in range(3)]
    for alias in [None, *aliases]:
        plain, bound = _run("plain", case, alias, steps), _run("bound", case, alias, steps)
        for k, (p, b) in enumerate(zip(plain, bound)):
            for i, (x, y) in enumerate(zip(p, b)):
                assert x.dtype == y.dtype and x.shape == y.shape
                np.testing.assert_array_equal(x, y, err_msg=f"{name} alias {alias} step {k} array {i}")


def test_other_arrays_go_to_the_plain_kernel():
    """A hook re-running the kernel on other arrays (verification's |inputs| pass) is not given
    the bound views' results."""
    x = rand(3, 4)
    out = np.full((4, 3), np.nan, F)
    node, ctx = _node_and_ctx("Transpose", "", [x], [out], {})
    fn = bound_kernel(find_kernel(node), ctx, [x], [out])
    other_in, other_out = [rand(3, 4)], [np.empty((4, 3), F)]
    fn(ctx, other_in, other_out)
    np.testing.assert_array_equal(other_out[0], other_in[0].T)
    assert np.isnan(out).all()


@pytest.mark.parametrize("name", ["batchnorm-grad", "batchnorm-grad-no-dx", "batchnorm-grad-large", "layernorm",
                                  "layernorm-axis1", "rmsnorm", "layernorm-large", "layernorm-grad-large",
                                  "layernorm-grad", "layernorm-grad-no-dx", "rmsnorm-grad",
                                  "maxpool-indices", "maxpool-indices-empty-window"])
def test_bound_equals_plain_in_chunks(name, monkeypatch):
    """Chunked kernels (a scratch target smaller than one image): the bound chunks are the plain ones."""
    from onnxplan.kernels import scratch

    monkeypatch.setattr(scratch, "SCRATCH_TARGET", 64)
    test_bound_equals_plain_step_after_step(name)


@pytest.mark.parametrize("name", sorted(n for n in CASES if CASES[n][0][0] in (
    "BatchNormalization", "BatchNormInternal", "BatchNormalizationGrad", "LayerNormalization",
    "SimplifiedLayerNormalization", "LayerNormalizationGrad", "SimplifiedLayerNormalizationGrad", "MaxPool",
    "MatMul", "FusedMatMul", "TransposeMatMul", "Conv")))
def test_bound_allocates_no_more_than_plain(name):
    """The specialisation's step allocates at most what the plain kernel's does (the memory plan
    counts on it): what it needs beside its arrays is made when it binds."""
    case, _ = CASES[name]
    steps = [case[2]() for _ in range(2)]
    plain, bound = [], []
    _run("plain", case, None, steps, plain)
    _run("bound", case, None, steps, bound)
    assert max(bound) <= max(plain), (bound, plain)
