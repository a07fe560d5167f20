"""The split pass's chunk ops priced by the cost model the budget layer uses (checkpoint/costs.py's
CHUNK_OPS): K chunks cost the whole node's work plus the calls and transfers of K pieces, so a
plan with K chunks is predicted dearer than the unsplit plan, and dearer with K (issue 28,
Deliver 3: "more chunks = more calls and transfers")."""

from __future__ import annotations

import pytest

from onnxplan.checkpoint.costs import TimeModel, node_flops, work_kind
from onnxplan.passes.split import SplitSpec, base_node
from onnxplan.planning import PlanOptions, plan_step
from onnxplan.swap.pricing import StoreRates, price_outcome

DW = "layer0.ff1.matmul_Grad/Gemm_5"  # a weight gradient over rows: onnxplan.GemmAdd chunks
TABLE = "tok_emb_Grad/GatherGrad_1"  # the embedding's gradient: onnxplan.GatherGradRows chunks
RATES = StoreRates(bandwidth=2e9, cpu_per_byte=1e-10)


@pytest.fixture(scope="module")
def transformer():
    from onnxplan.ir.load import read_step
    from tests.zoo_small import small_artifacts

    return read_step(small_artifacts("transformer"))


def _chunk_seconds(out, node: str) -> float:
    times = TimeModel()
    return sum(times.node_seconds(out.graph, n) for n in out.graph.nodes if base_node(n.name) == node and n.name != node)


def test_a_chunk_is_priced_as_the_op_it_computes_a_part_of(transformer):
    whole = plan_step(transformer, PlanOptions())
    times = TimeModel()
    for node in (DW, TABLE):
        alone = times.node_seconds(whole.graph, whole.graph.node(node))
        split = plan_step(transformer, PlanOptions(splits=(SplitSpec(node, 4),)))
        chunk = split.graph.node(f"{node}#1")
        assert chunk.domain == "onnxplan"
        assert work_kind(chunk) == work_kind(whole.graph.node(node))  # GemmAdd a product, not elementwise
        flops = sum(node_flops(split.graph, n) for n in split.graph.nodes if base_node(n.name) == node)
        assert flops >= node_flops(whole.graph, whole.graph.node(node)) > 0
        assert _chunk_seconds(split, node) > alone  # the same work and three more calls


def test_a_split_plan_is_predicted_dearer_than_the_unsplit_one_and_dearer_with_k(transformer):
    times = TimeModel()
    prices = [price_outcome(plan_step(transformer, PlanOptions()), times, RATES).seconds]
    for k in (2, 4, 8):
        out = plan_step(transformer, PlanOptions(splits=(SplitSpec(DW, k), SplitSpec(TABLE, k))))
        assert len(out.plan.splits) == 2
        prices.append(price_outcome(out, times, RATES).seconds)
    assert prices == sorted(prices) and len(set(prices)) == len(prices), prices
