"""A prefetch read only through views must land before its bytes are reused (swap + split).

GPT-2's LM head split under swap (h-split7's reproduction at the bench scale): log_prob's
piece 5 is swapped in at one EO, viewed (Reshape: no call of its own), and swapped out again; no
call reads the value itself, so a wait keyed by the readers' value names never waited for the
read, and a late read landed over the bytes the plan gives the next buffer there: wte's gradient
16x off ONNX Runtime's. Reads are slowed here so that every read is late: the run must still
match ONNX Runtime (fails with the wait keyed by name: executor/swap_io.SwapRuntime._overlapping).
"""

from __future__ import annotations

import time

import pytest

from onnxplan import api
from onnxplan.budget.attempt import attempt
from onnxplan.passes.split import SplitSpec
from onnxplan.planning import PlanOptions
from onnxplan.swap.store import SwapStore

pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

HEAD = "/inner/lm_head/"
LOSS = "onnx::SoftmaxCrossEntropyLoss::23"
SPLITS = (
    SplitSpec(HEAD + "MatMul", 8), SplitSpec(HEAD + "MatMul_Grad/FusedMatMul_0", 8),
    SplitSpec(HEAD + "MatMul_Grad/Gemm_5", 8), SplitSpec(HEAD + "MatMul_Grad/Reshape_4", 8),
    SplitSpec(HEAD + "Transpose", 1), SplitSpec(HEAD + "Transpose_Grad/Transpose_0", 1),
    SplitSpec("onnx::AdamWOptimizer::25/inner.transformer.wte.weight", 7),
    SplitSpec(LOSS, 8), SplitSpec(LOSS + "_Grad/SoftmaxCrossEntropyLossGrad_0", 8),
    SplitSpec("onnx::loss.Reshape::17", 4), SplitSpec("onnx::loss.Reshape::17_Grad/Reshape_1", 8),
)


def test_a_late_prefetch_read_only_through_views_lands_before_its_bytes_are_reused(monkeypatch):
    step = api.load("hf-gpt2-lm@bench")
    plan = attempt(step.graph, PlanOptions(splits=SPLITS, swap="proactive", budget=16 << 20)).plan
    assert plan.swaps and plan.splits
    read = SwapStore.read

    def late(self, slot, data, **kw):
        time.sleep(0.01)
        return read(self, slot, data, **kw)

    monkeypatch.setattr(SwapStore, "read", late)
    report = api.run(step, plan, steps=1, warmup=0, verify=True)
    assert report.verified, report.worst
