"""The order policies minimise the bytes the plan reports: on zoo steps (kernel scratch, odd sizes)
the peak an order policy reports for its order is the plan's lower bound for that order (64-byte
aligned buffers, scratch included; passes/lifetimes with offsets.lower_bound)."""

from __future__ import annotations

import pytest

from onnxplan.ir.load import read_step
from onnxplan.offsets import lower_bound
from onnxplan.orders import memory_model, order_nodes, peak_of_order
from onnxplan.passes.lifetimes import lifetimes
from onnxplan.pipeline import run_pipeline
from onnxplan.step_analysis import step_analysis
from tests.zoo_small import small_artifacts


@pytest.mark.parametrize("name", ["mlp", "nnt-conv2d", "transformer"])
def test_order_peak_is_the_plans_lower_bound(name):
    g = run_pipeline(read_step(small_artifacts(name)), ["realize", "interleave", "inplace"])[0]
    a = step_analysis(g)
    assert a.scratch, "the step should hold nodes with kernel scratch"
    mm = memory_model(g, a.roots)
    for policy in ("given", "nntrainer", "greedy"):
        res = order_nodes(g, policy, buffer_of=a.roots)
        bound = lower_bound(lifetimes(g, res.order).buffers)
        assert res.peak_bytes == peak_of_order(mm, res.order) == bound, policy
