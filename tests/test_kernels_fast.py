"""The kernels that call torch's CPU operators (onnxplan.kernels._torch) on tensors large enough
to take that path: the same references and tolerances as the small-shape tests, and a guard
that each writes into its given view with no hidden tensor-sized memory.

The guard runs the kernel in a fresh process on a realistic shape (inputs, outputs and declared
scratch allocated and written first; one warm-up call), resets the peak RSS (/proc/self/clear_refs
"5"), calls the kernel again and reads VmHWM: the rise must stay under a quarter of the output.
glibc's mmap threshold is pinned so every large temporary is a fresh mapping (a warm-up's freed
block is not silently reused). tracemalloc cannot see torch's allocator; RSS can."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from onnxplan import settings
from onnxplan.kernels import _torch
from tests.kernel_harness import ATOL, MS, check, rand

ROOT = Path(__file__).resolve().parents[1]


LARGE = 1 << 14  # elements: more than one numpy block (blockwise) per tensor


def _big_rows(cols: int) -> int:
    return -(-LARGE // cols) + 3


# ---- numerics on the torch path ----------------------------------------------------------------
@pytest.mark.parametrize("op", ["Gelu", "FastGelu"])
def test_gelu_family_large(op):
    check(op, [rand(_big_rows(64), 64, lo=-6, hi=6)], domain=MS, aliases=[(0, 0)])


def test_fast_gelu_and_bias_gelu_large():
    x, b = rand(_big_rows(64), 64), rand(64)
    check("FastGelu", [x, b], domain=MS, aliases=[(0, 0)])
    check("BiasGelu", [x, b], domain=MS, aliases=[(0, 0)])


def test_erf_large():
    check("Erf", [rand(_big_rows(64), 64, lo=-6, hi=6)], aliases=[(0, 0)])


@pytest.mark.parametrize("op", ["GeluGrad", "ReluGrad"])
def test_activation_grads_large(op):
    x = rand(_big_rows(64), 64, lo=-5, hi=5)
    if op == "ReluGrad":
        x[0, :8] = 0.0
    check(op, [rand(*x.shape), x], domain=MS, aliases=[(0, 0), (0, 1)])


def test_silu_and_fast_gelu_grad_large():
    """QuickGelu with alpha 1 (SiLU) and its gradient by torch's silu, FastGeluGrad by torch's
    gelu_backward(approximate="tanh"); QuickGelu at alpha 1.702 keeps the numpy kernel (checked
    too; its gradient's numpy kernel is test_activation_grads')."""
    x = rand(_big_rows(64), 64, lo=-6, hi=6)
    for alpha in (1.0, 1.702):
        check("QuickGelu", [x], {"alpha": alpha}, domain=MS, aliases=[(0, 0)])
    check("QuickGeluGrad", [rand(*x.shape), x], {"alpha": 1.0}, domain=MS, aliases=[(0, 0), (0, 1)])
    # FastGeluGrad's tolerance: test_activation_grads' (float32 cancellation for X < -3)
    check("FastGeluGrad", [rand(*x.shape), x], domain=MS, aliases=[(0, 0), (0, 1)], atol=1e-5)


def test_transpose_large_every_dtype():
    """Transpose by torch's copy_ of a permuted view: exact, any numeric dtype; numpy when off."""
    for dtype in (np.float32, np.float64, np.int64, np.int32, np.bool_, np.float16):
        x = (rand(_big_rows(64), 64) * 100).astype(dtype)
        check("Transpose", [x])
        check("Transpose", [x.reshape(-1, 8, 8)], {"perm": [1, 2, 0]})  # numpy's copy
        check("Transpose", [x.reshape(-1, 2, 4, 8)], {"perm": [1, 0, 2, 3]})  # torch's: last axis stays


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_large(op):
    check(op, [rand(_big_rows(128), 128, lo=-8, hi=8)], {"axis": -1}, aliases=[(0, 0)])


@pytest.mark.parametrize("op", ["SoftmaxGrad_13", "SoftmaxGrad", "LogSoftmaxGrad_13"])
def test_softmax_grads_large(op):
    x = rand(_big_rows(128), 128)
    z = x - x.max(axis=1, keepdims=True)
    ls = (z - np.log(np.exp(z).sum(axis=1, keepdims=True))).astype(np.float32)
    y = ls if op.startswith("Log") else np.exp(ls)
    attrs = {"axis": 1} if op == "SoftmaxGrad" else {}
    check(op, [rand(*x.shape), y], attrs, domain=MS, aliases=[(0, 0), (0, 1)])


def test_torch_path_at_every_size(monkeypatch):
    """One thread, torch's operators beat the numpy kernels at every size (MIN_ELEMS = 1); off
    (ONNXPLAN_TORCH_KERNELS=0), or on non-float, non-contiguous or mismatched arrays, numpy serves."""
    x = np.zeros((4, 8), np.float32)
    assert _torch.usable(np, x, x)
    assert not _torch.usable(np, x.astype(np.int64), x.astype(np.int64))
    assert not _torch.usable(np, x, x.T.copy().T)
    settings.use(replace(settings.current(), torch_kernels=False))
    assert not _torch.usable(np, x, x)


@pytest.mark.parametrize("op", ["Gelu", "GeluGrad", "ReluGrad", "Erf", "FastGelu", "Softmax", "LogSoftmax",
                                "QuickGelu", "QuickGeluGrad", "FastGeluGrad", "Transpose"])
def test_numpy_path_still_matches(monkeypatch, op):
    """The numpy kernels (torch off; also the GPU path) keep their references and tolerances."""
    settings.use(replace(settings.current(), torch_kernels=False))
    x = rand(6, 16, lo=-5, hi=5)
    domain = "" if op in ("Erf", "Softmax", "LogSoftmax", "Transpose") else MS
    attrs = {"axis": -1} if "Softmax" in op else {"alpha": 1.0} if op.startswith("QuickGelu") else None
    ins = [rand(*x.shape), x] if op.endswith("Grad") else [x]
    atol = 1e-5 if op == "FastGeluGrad" else ATOL  # test_activation_grads' tolerance
    check(op, ins, attrs, domain=domain, aliases=[] if op == "Transpose" else [(0, 0)], atol=atol)


# ---- the hidden-memory guard -------------------------------------------------------------------
_CHILD = r"""
import json, sys
import numpy as np
from onnxplan.ir.tensor import TensorSpec
from onnxplan.kernels import _torch
from onnxplan.kernels.registry import KernelContext, bound_kernel, declare, find_kernel, scratch_bytes
from tests.kernel_harness import make_node

# the guard's own check: a kernel with a tensor-sized temporary
declare("PlantedAlloc", fn=lambda ctx, i, o: np.copyto(o[0], np.exp(i[0]) + 1))
from onnxplan.threads import use_threads
_torch.load()
use_threads(1)


def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def measure(case):
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in case["inputs"]]
    outputs = [np.full(s, 1.0, np.float32) for s in case["outputs"]]
    if case.get("positive"):
        inputs[-1] = np.abs(inputs[-1]) / np.abs(inputs[-1]).sum(axis=-1, keepdims=True)
    for i, value in case.get("scalars", {}).items():  # e.g. AdamW's lr and step
        inputs[int(i)] = np.array([value], np.float32 if isinstance(value, float) else np.int64)
    node = make_node(case["op"], inputs, len(outputs), case.get("attrs"), case.get("domain", ""))
    in_specs = [TensorSpec(a.dtype, a.shape) for a in inputs]
    out_specs = [TensorSpec(a.dtype, a.shape) for a in outputs]
    nbytes = scratch_bytes(node, in_specs, out_specs)
    scratch = np.full(nbytes, 0xFF, np.uint8) if nbytes else None
    ctx = KernelContext(np, node, in_specs, out_specs, scratch)
    decl = find_kernel(node)
    fn = decl.fn if case.get("plain") else bound_kernel(decl, ctx, inputs, outputs)  # the executor's path
    fn(ctx, inputs, outputs)  # warm-up: lazy imports, torch's pool
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status("VmRSS")
    fn(ctx, inputs, outputs)
    return {"extra": status("VmHWM") - base, "out_bytes": outputs[0].nbytes}


cases = json.loads(sys.argv[1])
print(json.dumps({name: measure(case) for name, case in cases.items()}))
"""


def _can_reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def hidden_bytes(cases: dict) -> dict:
    """Per case: {"extra": peak RSS rise of the second call, "out_bytes": the output's bytes},
    all measured one after another in one fresh process."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="65536",
               ONNXPLAN_TORCH_KERNELS="1", PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(cases)], check=False, capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


ROWS = 4096  # realistic: a transformer b16-b64 activation, a few MiB
GUARDED = {
    "Gelu": {"op": "Gelu", "domain": MS, "inputs": [[ROWS, 512]], "outputs": [[ROWS, 512]]},
    "FastGelu": {"op": "FastGelu", "domain": MS, "inputs": [[ROWS, 512], [512]], "outputs": [[ROWS, 512]]},
    "BiasGelu": {"op": "BiasGelu", "domain": MS, "inputs": [[ROWS, 512], [512]], "outputs": [[ROWS, 512]]},
    "Erf": {"op": "Erf", "inputs": [[ROWS, 512]], "outputs": [[ROWS, 512]]},
    "GeluGrad": {"op": "GeluGrad", "domain": MS, "inputs": [[ROWS, 512]] * 2, "outputs": [[ROWS, 512]]},
    "ReluGrad": {"op": "ReluGrad", "domain": MS, "inputs": [[ROWS, 512]] * 2, "outputs": [[ROWS, 512]]},
    "Softmax": {"op": "Softmax", "inputs": [[ROWS * 8, 64]], "outputs": [[ROWS * 8, 64]],
                "attrs": {"axis": -1}},
    "LogSoftmax": {"op": "LogSoftmax", "inputs": [[ROWS * 8, 64]], "outputs": [[ROWS * 8, 64]],
                   "attrs": {"axis": -1}},
    "SoftmaxGrad_13": {"op": "SoftmaxGrad_13", "domain": MS, "inputs": [[ROWS * 8, 64]] * 2,
                       "outputs": [[ROWS * 8, 64]], "positive": True},
    "QuickGelu": {"op": "QuickGelu", "domain": MS, "inputs": [[ROWS, 512]], "outputs": [[ROWS, 512]],
                  "attrs": {"alpha": 1.0}},
    "QuickGeluGrad": {"op": "QuickGeluGrad", "domain": MS, "inputs": [[ROWS, 512]] * 2,
                      "outputs": [[ROWS, 512]], "attrs": {"alpha": 1.0}},
    "FastGeluGrad": {"op": "FastGeluGrad", "domain": MS, "inputs": [[ROWS, 512]] * 2, "outputs": [[ROWS, 512]]},
    "Transpose": {"op": "Transpose", "inputs": [[ROWS, 512]], "outputs": [[512, ROWS]]},
    "Transpose 4-D": {"op": "Transpose", "inputs": [[16, 128, 8, 64]], "outputs": [[16, 8, 128, 64]],
                      "attrs": {"perm": [0, 2, 1, 3]}},
    # conv kernels (onnxplan/kernels/conv.py): columns, padded copies, channels-last blocks and the
    # dilated dY all live in the declared scratch; the depthwise ones here (>= 32K outputs) run tap by
    # tap on torch views, X's phases, channels-last copies and dW's products in the declared scratch
    "Conv depthwise": {"op": "Conv", "inputs": [[8, 64, 40, 40], [64, 1, 3, 3], [64]], "outputs": [[8, 64, 40, 40]],
                       "attrs": {"group": 64, "pads": [1, 1, 1, 1]}},
    "ConvGrad depthwise": {"op": "ConvGrad", "domain": MS, "inputs": [[8, 64, 40, 40], [8, 64, 40, 40], [64, 1, 3, 3]],
                           "outputs": [[8, 64, 40, 40], [64, 1, 3, 3], [64]],
                           "attrs": {"group": 64, "pads": [1, 1, 1, 1]}},
    "Conv depthwise strided": {"op": "Conv", "inputs": [[8, 64, 40, 40], [64, 1, 5, 5], [64]],
                               "outputs": [[8, 64, 20, 20]],
                               "attrs": {"group": 64, "pads": [2, 2, 1, 1], "strides": [2, 2]}},
    "Conv depthwise short rows": {"op": "Conv", "inputs": [[16, 512, 6, 6], [512, 1, 5, 5], [512]],
                                  "outputs": [[16, 512, 6, 6]], "attrs": {"group": 512, "pads": [2, 2, 2, 2]}},
    "ConvGrad depthwise short rows": {"op": "ConvGrad", "domain": MS,
                                      "inputs": [[16, 512, 6, 6], [16, 512, 6, 6], [512, 1, 5, 5]],
                                      "outputs": [[16, 512, 6, 6], [512, 1, 5, 5], [512]],
                                      "attrs": {"group": 512, "pads": [2, 2, 2, 2]}},
    "ConvGrad depthwise strided": {"op": "ConvGrad", "domain": MS,
                                   "inputs": [[8, 64, 20, 20], [8, 64, 40, 40], [64, 1, 5, 5]],
                                   "outputs": [[8, 64, 40, 40], [64, 1, 5, 5], [64]],
                                   "attrs": {"group": 64, "pads": [2, 2, 1, 1], "strides": [2, 2]}},
    "Conv dense": {"op": "Conv", "inputs": [[8, 64, 40, 40], [64, 64, 3, 3]], "outputs": [[8, 64, 40, 40]],
                   "attrs": {"pads": [1, 1, 1, 1]}},  # im2col by rows from a row-padded copy
    "ConvGrad dense": {"op": "ConvGrad", "domain": MS, "inputs": [[8, 64, 40, 40], [8, 64, 40, 40], [64, 64, 3, 3]],
                       "outputs": [[8, 64, 40, 40], [64, 64, 3, 3], [64]],
                       "attrs": {"pads": [1, 1, 1, 1]}},  # dX as the conv of dY with W flipped (FlipDx)
    "Conv grouped": {"op": "Conv", "inputs": [[8, 64, 40, 40], [64, 16, 3, 3]], "outputs": [[8, 64, 40, 40]],
                     "attrs": {"group": 4, "pads": [1, 1, 1, 1]}},
    "ConvGrad grouped": {"op": "ConvGrad", "domain": MS, "inputs": [[8, 64, 40, 40], [8, 64, 40, 40], [64, 16, 3, 3]],
                         "outputs": [[8, 64, 40, 40], [64, 16, 3, 3], [64]],
                         "attrs": {"group": 4, "pads": [1, 1, 1, 1]}},
}

needs_proc = pytest.mark.skipif(not sys.platform.startswith("linux") or not _can_reset_peak(),
                                reason="needs /proc/self/clear_refs (Linux)")


# numpy kernels with a bind rule (the bound path only: the views made once, scratch planned)
GUARDED_BOUND = {
    "AdamWUpdate": {"op": "AdamWUpdate", "domain": "onnxplan", "inputs": [[1], [1]] + [[ROWS * 512]] * 4,
                    "outputs": [[ROWS * 512]] * 3, "scalars": {"0": 1e-3, "1": 3},
                    "attrs": {"adam_mode": 1, "weight_decay": 0.01}},
    "Sum": {"op": "Sum", "inputs": [[ROWS, 512]] * 3, "outputs": [[ROWS, 512]]},
    # the BatchNorm and LayerNorm bind rules' copies and elementwise passes by torch (norm._ew_pass)
    "LayerNormalization": {"op": "LayerNormalization", "inputs": [[ROWS, 512], [512], [512]],
                           "outputs": [[ROWS, 512], [ROWS, 1], [ROWS, 1]]},
    "SimplifiedLayerNormalization": {"op": "SimplifiedLayerNormalization", "inputs": [[ROWS, 512], [512]],
                                     "outputs": [[ROWS, 512], [ROWS, 1]]},
    "LayerNormalizationGrad": {"op": "LayerNormalizationGrad", "domain": MS,
                               "inputs": [[ROWS, 512], [ROWS, 512], [512], [ROWS, 1], [ROWS, 1]],
                               "outputs": [[ROWS, 512], [512], [512]]},
    "BatchNormInternal": {"op": "BatchNormInternal", "domain": MS,
                          "inputs": [[8, 96, 48, 48], [96], [96], [96], [96]],
                          "outputs": [[8, 96, 48, 48], [96], [96], [96], [96]]},
    "BatchNormalization": {"op": "BatchNormalization", "inputs": [[8, 96, 48, 48], [96], [96], [96], [96]],
                           "outputs": [[8, 96, 48, 48]]},
    "BatchNormalizationGrad": {"op": "BatchNormalizationGrad", "domain": MS,
                               "inputs": [[8, 96, 48, 48], [8, 96, 48, 48], [96], [96], [96]],
                               "outputs": [[8, 96, 48, 48], [96], [96]]},
}
PLANTED = {"op": "PlantedAlloc", "inputs": [[ROWS, 512]], "outputs": [[ROWS, 512]]}


@pytest.fixture(scope="module")
def measured() -> dict:
    plain = {f"{name}/plain": {**case, "plain": True} for name, case in GUARDED.items()}
    return hidden_bytes({**GUARDED, **plain, **GUARDED_BOUND, "PlantedAlloc": PLANTED})


@needs_proc
@pytest.mark.parametrize("name", sorted(GUARDED) + [f"{n}/plain" for n in sorted(GUARDED)] + sorted(GUARDED_BOUND))
def test_no_hidden_tensor_sized_memory(measured, name):
    """Each torch kernel bound (the executor's path) and plain; the bound numpy kernels."""
    got = measured[name]
    assert got["extra"] < got["out_bytes"] // 4, f"{name}: peak RSS rose {got['extra']} B during the call " \
                                                   f"(output {got['out_bytes']} B)"


@needs_proc
def test_the_guard_sees_a_planted_allocation(measured):
    got = measured["PlantedAlloc"]
    assert got["extra"] >= got["out_bytes"], got


def test_the_depthwise_guards_run_tap_by_tap():
    """The guarded depthwise shapes are on the torch tap-by-tap path (the one that could hide memory)."""
    from onnxplan.kernels import conv_taps

    for name in ("Conv depthwise", "Conv depthwise strided", "ConvGrad depthwise", "ConvGrad depthwise strided",
                 "Conv depthwise short rows", "ConvGrad depthwise short rows"):
        case = GUARDED[name]
        if case["op"] == "Conv":
            (x, w), y = case["inputs"][:2], case["outputs"][0]
        else:
            y, x, w = case["inputs"]
        assert conv_taps.by_taps(x, w, y, case["attrs"]["group"]), name
