"""The price of a budget's candidates against what they measured (reports/price.md): the FLOP
estimate's calibration (checkpoint.costs.CPU_NUMPY) and the ranking of recompute and swap."""

from __future__ import annotations

from dataclasses import replace

import pytest

from onnxplan.budget import fit_budget
from onnxplan.checkpoint.costs import CPU_NUMPY, Machine, TimeModel
from onnxplan.planning import PlanOptions, plan_step
from onnxplan.swap import pricing

# the plain plans' steps, measured: each node's least of 9 node-timed steps at one thread over two
# runs (benchmarks/calibrate_costs.py, load 3.5-3.8; reports/price/calibration-run*.json), summed
MEASURED_PLAIN_MS = {("transformer", 16): 19.9, ("gpt", 16): 25.1}
# transformer b16 at persistent + f x arena: the least of 5 interleaved whole steps in one process
# at one thread, load 0.4 (benchmarks/price_probe.py; reports/price/probe-before-idle.json); the
# store moved the swapped bytes at 1.5-2.0 GB/s in those rounds (io busy time)
MEASURED_MS = {0.9: {"recompute": 22.4, "swap": 28.0}, 0.75: {"recompute": 24.7, "swap": 29.8},
               0.6: {"recompute": 23.9, "swap": 35.7}}
STORE_BANDWIDTH = 2e9  # the fastest of those rounds: swap's transfers priced as cheap as they ran


def test_the_roofline_takes_each_kinds_rate_and_the_ops_factor():
    m = Machine("toy", matmul_flops=1e9, elementwise_flops=1e8, bandwidth=1e9, call_seconds=1e-6,
                conv_flops=5e8, conv_grad_flops=2.5e8, op_factor={"MaxPool": 4.0})
    assert m.seconds(1e9, 0, "Gemm", "matmul") == pytest.approx(1 + 1e-6)
    assert m.seconds(1e9, 0, "Conv", "conv") == pytest.approx(2 + 1e-6)
    assert m.seconds(1e9, 0, "ConvGrad", "conv_grad") == pytest.approx(4 + 1e-6)
    assert m.seconds(1e8, 0, "Relu", "elementwise") == pytest.approx(1 + 1e-6)
    assert m.seconds(1e8, 3e9, "MaxPool", "elementwise") == pytest.approx(12 + 1e-6)  # bytes bound, x4
    plain = Machine("plain", 1e9, 1e8, 1e9, 0.0)  # no conv rates: the product rate
    assert plain.seconds(1e9, 0, "Conv", "conv") == plain.seconds(1e9, 0, "ConvGrad", "conv_grad") == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("model,batch", list(MEASURED_PLAIN_MS))
def test_the_estimate_prices_the_measured_plain_step(model, batch):
    """Within 25% of the measured step (the estimate it replaced said 149 and 186 ms: 7x)."""
    import onnxplan

    step = onnxplan.load(model, batch=batch)
    out = plan_step(step.graph, PlanOptions())
    predicted = TimeModel(CPU_NUMPY).step_seconds(out.graph) * 1e3
    assert predicted == pytest.approx(MEASURED_PLAIN_MS[model, batch], rel=0.25)


@pytest.mark.slow
def test_the_price_ranks_recompute_and_swap_as_they_measured(monkeypatch):
    """transformer b16 at three budgets: recompute ran 20-33% faster than swap; the price says
    recompute is the cheaper of the two at each, even with the store priced at the fastest it ran,
    and the budget layer never chooses swap there (joint-quick, weighed too since session 13 and not
    in that measurement, may win: measured 1-4% faster than recompute at these budgets,
    reports/decision.md)."""
    import onnxplan

    monkeypatch.setenv(pricing.SWAP_BANDWIDTH_ENV, str(STORE_BANDWIDTH))
    step = onnxplan.load("transformer", batch=16)
    plain = plan_step(step.graph, PlanOptions()).plan
    for f, measured in MEASURED_MS.items():
        budget = plain.persistent_bytes + int(f * plain.arena_bytes)
        out, _ = fit_budget(step.graph, replace(PlanOptions(), budget=budget))
        predicted = {c.strategy: c.predicted_step_seconds for c in out.plan.strategy.candidates
                     if c.fits and c.strategy in measured}
        assert min(predicted, key=predicted.get) == min(measured, key=measured.get) == "recompute", (f, predicted)
        assert out.plan.strategy.chosen in ("recompute", "joint-quick"), (f, out.plan.strategy.chosen)
