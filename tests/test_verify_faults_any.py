"""The model-agnostic planted faults (tests/faults.py) on a small model of each family: each
is caught, naming the node it was planted at where it has one, and the correct run passes. The
same faults at the full-size tier: benchmarks/verify_faults_full.py (reports/verify-faults-full.md)."""

from __future__ import annotations

import pytest

from onnxplan.verification.step_check import verify_run
from tests.faults import FAULTS, prepared

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_planted_fault_is_caught_on_a_depthwise_bn_model(fault):
    pytest.importorskip("transformers")
    prep = prepared("hf-mobilenet-v2", None, **fault.replan)
    with pytest.MonkeyPatch.context() as mp:
        planted = fault.plant(mp, prep)
        assert planted is not None, f"hf-mobilenet-v2 has no victim for {fault.name}"
        v = verify_run(planted.prepared, steps=1)
    assert not v.ok, f"{fault.name}: a planted fault passed verification"
    bad = next(s for s in v.steps if not s.ok)
    if planted.node is not None:
        assert bad.first_difference is not None and bad.first_difference.node == planted.node, bad.first_difference
    if planted.kind is not None:
        assert any(c.kind == planted.kind for c in bad.failures), bad.failures


def test_the_unplanted_run_passes():
    pytest.importorskip("transformers")
    v = verify_run(prepared("hf-mobilenet-v2", None), steps=1)
    assert v.ok, v.summary()
