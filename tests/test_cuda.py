"""The executor on a GPU (CuPy): every small zoo model against ONNX Runtime, the measured device
peak against the plan, swap and recompute bit-identical to the plain run on the device, and the
CLI. Without CuPy or a CUDA device these skip, except the test of `--device cuda`'s error line.

The kernels alone run on the GPU with the kernel tests themselves:
`ONNXPLAN_TEST_DEVICE=cuda python -m pytest tests/test_kernels_*.py` (tests/kernel_harness.py).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from onnxplan.budget import MemoryRequest, ProfiledCosts, plan_for_budget, plan_with_checkpoint
from onnxplan.cli.app import app
from onnxplan.device import DevicePeak, array_module, cuda_available
from onnxplan.errors import EXIT_USAGE, UsageError
from onnxplan.executor.arena import Arena
from onnxplan.executor.prepare import Prepared
from onnxplan.executor.runner import execute, initial_parameters, step_batches
from onnxplan.ir.tensor import TensorSpec
from onnxplan.loading import open_step
from onnxplan.planning import PlanOptions, plan_step
from tests.ort_check import check_against_ort
from tests.zoo_small import SMALL, least_rotor_code, small_artifacts

HAVE_CUDA, WHY = cuda_available()
gpu = pytest.mark.skipif(not HAVE_CUDA, reason=f"no GPU: {WHY}")
MiB = 1 << 20


@pytest.fixture(scope="module")
def cp():
    return array_module("cuda")


@pytest.mark.skipif(HAVE_CUDA, reason="a GPU is here: the error path is not reachable")
def test_device_cuda_without_gpu_is_one_line_exit_2(tmp_path):
    with pytest.raises(UsageError, match="--device cuda"):
        array_module("cuda")
    res = CliRunner().invoke(app, ["run", "mlp", "--batch", "2", "--device", "cuda", "--no-measure"])
    assert res.exit_code == EXIT_USAGE, res.output
    assert "--device cuda" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output


def test_unknown_device_is_usage_error():
    with pytest.raises(UsageError, match="unknown --device"):
        array_module("tpu")


@gpu
def test_arena_on_device_is_aligned_and_views_share_it(cp):
    arena = Arena(1000, cp)
    assert arena.address % 64 == 0 and arena.nbytes == 1000
    a = arena.view(64, TensorSpec("float32", (4, 4)))
    a.fill(3.0)
    assert float(arena.bytes(64, 64).view(cp.float32).sum().get()) == 48.0


@gpu
@pytest.mark.parametrize("model", sorted(SMALL))
def test_every_small_model_on_gpu_matches_onnx_runtime(cp, model):
    """Losses of 3 steps and every parameter after them against ORT's training API (CPU)."""
    check_against_ort(model, "sgd" if model.startswith("nnt") else "adamw",
                      PlanOptions(order="nntrainer", planner="best-fit"), xp=cp)


@gpu
@pytest.mark.parametrize("model", ["mlp", "transformer", "resnet18"])
def test_measured_device_peak_is_the_planned_peak(cp, model):
    """The most device memory live CuPy arrays hold during the steps: the planned peak plus
    the two allocations' alignment slack and 512-byte rounding, and kernel temporaries that
    stay small (blocked loops of 64 KiB; cuBLAS's and reductions' own pool allocations)."""
    folder, graph = open_step(small_artifacts(model))
    res = plan_step(graph, PlanOptions(planner="best-fit"))
    params, batches = initial_parameters(folder), step_batches(folder, 2, 0)
    with DevicePeak(cp) as peak:
        ex, losses, _ = execute(Prepared(folder, res.graph, res.plan), batches, params, steps=2, warmup=0,
                                learning_rate=None, check_arena=False, xp=cp)
    planned = res.plan.peak_bytes
    assert np.isfinite(losses).all()
    assert planned <= peak.peak <= planned + 2 * MiB, (model, planned, peak.peak)


@gpu
@pytest.mark.parametrize("policy", ["on-demand", "proactive", "window"])
def test_swap_on_gpu_is_bit_identical_to_no_swap(cp, policy):
    model = "vgg16"
    folder, graph = open_step(small_artifacts(model, "sgd"))
    params, batches = initial_parameters(folder), step_batches(folder, 3, 0)
    out = {}
    for name in ("none", policy):
        res = plan_step(graph, PlanOptions(planner="best-fit", order="nntrainer", swap=name))
        ex, losses, _ = execute(Prepared(folder, res.graph, res.plan), batches, params, steps=3, warmup=0,
                                learning_rate=None, check_arena=False, xp=cp)
        out[name] = (losses, ex.parameters(), res.plan)
        if ex.swap is not None:
            ex.swap.close()
    assert out[policy][2].swaps, "the policy swapped nothing"
    assert out[policy][0] == out["none"][0]
    for k, w in out["none"][1].items():
        np.testing.assert_array_equal(out[policy][1][k], w, err_msg=k)


@gpu
@pytest.mark.parametrize("policy", ["sqrt", "rotor-least"])
def test_recompute_on_gpu_equals_no_recompute(cp, policy):
    model = "resnet18"
    folder, graph = open_step(small_artifacts(model))
    params, batches = initial_parameters(folder), step_batches(folder, 3, 0)
    opts = PlanOptions(planner="best-fit")
    none = plan_step(graph, opts)
    least = plan_step(graph, replace(opts, recompute=least_rotor_code(folder))) if policy == "rotor-least" \
        else plan_with_checkpoint(graph, opts, policy)
    assert any(n.endswith("@rc1") for n in least.plan.order), "nothing is recomputed"
    runs = []
    for res in (none, least):
        ex, losses, _ = execute(Prepared(folder, res.graph, res.plan), batches, params, steps=3, warmup=0,
                                learning_rate=None, check_arena=False, xp=cp)
        runs.append((losses, ex.parameters()))
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=1e-6, atol=0)
    for k, w in runs[0][1].items():
        np.testing.assert_allclose(runs[1][1][k], w, rtol=1e-6, atol=1e-12, err_msg=k)


@gpu
def test_cli_run_on_gpu_verifies_and_reports_the_device_peak():
    res = CliRunner().invoke(app, ["run", "transformer", "--batch", "2", "--device", "cuda", "--verify",
                                   "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["verified"] is True and out["device"].startswith("cuda:")
    assert out["peak_bytes"] <= out["measured_peak_bytes"] <= out["peak_bytes"] + 2 * MiB
    assert "pool" in out["measurement"]["method"]


@gpu
@pytest.mark.parametrize("pre,post", [(1, 1), (1, 64), (3, 5)])
def test_scatter_add_on_gpu_is_deterministic_and_numpys_order(cp, pre, post):
    """Repeated indices summed in index order, as numpy's add.at: the same bits every run."""
    from onnxplan.kernels._xp import scatter_add

    rng = np.random.default_rng(0)
    rows, k = 50, 4000
    index = rng.integers(0, rows, size=k)
    scale = 10.0 ** rng.integers(-3, 3, size=(pre, k, post))
    values = (rng.standard_normal((pre, k, post)) * scale).astype(np.float32)
    want = np.zeros((pre, rows, post), np.float32)
    scatter_add(np, want, index, values)
    runs = []
    for _ in range(3):
        got = cp.zeros((pre, rows, post), cp.float32)
        scatter_add(cp, got, cp.asarray(index), cp.asarray(values))
        runs.append(got.get())
    for got in runs:
        np.testing.assert_array_equal(got, want)


@gpu
def test_checkpoint_profile_times_the_gpu_kernels():
    """With device cuda the profile behind rotor runs our kernels on the GPU (its note says so)."""
    folder, graph = open_step(small_artifacts("resnet18"))
    res = plan_for_budget(graph, PlanOptions(planner="best-fit"), MemoryRequest(checkpoint="rotor"),
                          ProfiledCosts("cuda"))
    notes = res.plan.checkpoint.notes
    assert any("profile (wall clock, cuda)" in n for n in notes), notes


@gpu
def test_arena_check_on_gpu_passes_a_good_plan():
    """--check-arena on the device: poisoned dead buffers, every read inside its lifetime."""
    res = CliRunner().invoke(app, ["run", "gpt", "--batch", "2", "--device", "cuda", "--check-arena",
                                   "--no-measure", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["check_arena"] is True
