"""`run --verify` passes on correct runs: zoo models, both optimizers, plain and with every swap
and checkpoint policy. CI runs the mlp through every policy; the slow set adds a BatchNorm CNN,
a transformer and a causal decoder (the full matrix: benchmarks/verify_matrix.py)."""

from __future__ import annotations

import pytest

from onnxplan.budget import MemoryRequest, plan_for_budget
from onnxplan.executor.prepare import Prepared
from onnxplan.loading import open_step
from onnxplan.loading.request import LoadRequest
from onnxplan.planning import PlanOptions
from onnxplan.verification.step_check import verify_run

SWAPS = ("on-demand", "reduced", "proactive", "window")
CHECKPOINTS = ("sqrt", "chen", "rotor")
POLICIES = ("plain", *SWAPS, *CHECKPOINTS)


def _verify(model: str, batch: int, optimizer: str, policy: str, steps: int = 2):
    folder, graph = open_step(LoadRequest(model, batch, optimizer))
    swap = policy if policy in SWAPS else None
    res = plan_for_budget(graph, PlanOptions(), MemoryRequest(swap=swap,
                                                             checkpoint=policy if policy in CHECKPOINTS else None))
    if swap:
        assert res.plan.swaps, f"{policy} planned no swap"
    return verify_run(Prepared(folder, res.graph, res.plan), steps=steps)


@pytest.mark.parametrize("policy,optimizer", [(p, "adamw") for p in POLICIES] + [("plain", "sgd"), ("rotor", "sgd"),
                                                                                ("proactive", "sgd")])
def test_mlp_verifies_under_every_policy(policy, optimizer):
    v = _verify("mlp", 2, optimizer, policy)
    assert v.ok, v.summary()
    assert len(v.steps) == 2


@pytest.mark.slow
@pytest.mark.parametrize("model,batch,policy", [(m, 2, p) for m in ("transformer", "gpt") for p in POLICIES]
                         + [("resnet18", 4, p) for p in ("plain", "proactive", "rotor")])
def test_zoo_verifies_under_every_policy(model, batch, policy):
    """CI's share of the matrix (CI time): the transformer and the causal decoder under every
    policy, the BatchNorm CNN plain, swapped and recomputed."""
    v = _verify(model, batch, "adamw", policy)
    assert v.ok, v.summary()
