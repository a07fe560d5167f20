"""The peak-memory probe: a known allocation, the fallback sampler, and ONNX Runtime's training step."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan.memprobe import (
    METHOD_ENV,
    ProbeError,
    mark_baseline,
    probe_peak,
    probe_reference,
)
from onnxplan.verification.reference import run_reference
from tests.zoo_small import small_artifacts

MIB = 1 << 20


def allocate_and_touch(mib: int = 200, hold_seconds: float = 0.0) -> dict:
    """Probe target: a fresh array of `mib` MiB, every page written."""
    import time

    scratch = np.zeros(1 << 20)  # allocated before the mark: must not count
    del scratch
    mark_baseline()
    array = np.empty(mib * MIB, dtype=np.uint8)
    array.fill(1)
    time.sleep(hold_seconds)
    return {"checksum": int(array[:: 1 << 12].sum())}


def fail_loudly() -> dict:
    raise ValueError("target failed on purpose")


@pytest.mark.slow
@pytest.mark.parametrize("method", ["clear_refs", "sampled"])
def test_known_allocation_is_measured(method):
    hold = 0.05 if method == "sampled" else 0.0  # the sampler needs the peak to last a few polls
    got = probe_peak(f"{__file__}:allocate_and_touch", {"mib": 200, "hold_seconds": hold},
                     env={METHOD_ENV: method})
    assert got.method == method
    assert got.result == {"checksum": 200 * MIB >> 12}
    assert got.peak_rss_bytes - got.baseline_rss_bytes == got.peak_increase_bytes
    assert got.peak_increase_bytes == pytest.approx(200 * MIB, rel=0.03)


def test_failing_target_is_a_probe_error():
    with pytest.raises(ProbeError, match="target failed on purpose"):
        probe_peak(f"{__file__}:fail_loudly")
    with pytest.raises(ProbeError, match="expected"):
        probe_peak("no_function_here")


@pytest.fixture(scope="module")
def mlp_artifacts():
    """The zoo's mlp (784-256-128-10, CE, AdamW) at a small batch."""
    return small_artifacts("mlp")


def test_reference_probe(mlp_artifacts):
    got = probe_reference(mlp_artifacts, steps=3, seed=0)
    assert got.method == "clear_refs"
    params_bytes = 4 * (784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10)
    # at least parameters, gradients and two AdamW moments; well under a runaway figure
    assert 4 * params_bytes < got.peak_increase_bytes < 512 * MIB
    assert len(got.result["step_seconds"]) == 3
    # the child ran exactly the steps run_reference runs here
    assert got.result["losses"] == run_reference(mlp_artifacts, steps=3, seed=0).losses
