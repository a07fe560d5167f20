"""The ONNX Runtime reference runner trains every zoo model for 3 steps."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan.ir.load import read_step
from onnxplan.verification.reference import run_reference
from tests.zoo_small import SMALL, slow_if_large, small_artifacts


@pytest.mark.parametrize("name", slow_if_large(SMALL))
def test_reference_runs_three_steps(name):
    folder = small_artifacts(name)
    res = run_reference(folder, steps=3, seed=0)
    assert len(res.losses) == 3 and all(np.isfinite(res.losses))
    assert len(res.step_seconds) == 3 and all(s > 0 for s in res.step_seconds)
    graph = read_step(folder)
    params = [v for v in graph.values.values() if v.vclass.value == "parameter" and not v.name.endswith(".updated")]
    assert {p.name for p in params} == set(res.params)
    for p in params:
        assert res.params[p.name].shape == p.spec.shape
    # trainable parameters moved; frozen ones did not, except BatchNormalization's running
    # statistics, which ORT's BatchNormInternal kernel updates in place during training
    start = run_reference(folder, steps=0, seed=0).params
    for p in params:
        moved = not np.array_equal(start[p.name], res.params[p.name])
        running_stat = p.name.endswith((".running_mean", ".running_var"))
        assert moved == (p.trainable or running_stat), (name, p.name)
