"""ONNX's own node conformance cases for every op our kernels implement (tests/conformance.py): each
passes, or equals ONNX Runtime where we follow it on purpose (ORT_FOLLOWED, checked against ORT's
output, which must differ from ONNX's there), or is refused at plan time with one documented line
(REFUSALS). No case may fail or error: there is no expected-failure list."""

from __future__ import annotations

import pytest

from tests import conformance

CASES = conformance.cases()


def test_the_cases_cover_every_implemented_op_with_cases():
    ops = {c.model.graph.node[0].op_type for c in CASES}
    assert len(CASES) >= 1000 and len(ops) >= 130, (len(CASES), len(ops))
    assert set(conformance.ORT_FOLLOWED) <= {c.name for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_conformance(case):
    outcome, message = conformance.run_case(case)
    if outcome == "refused":
        op = case.model.graph.node[0].op_type
        assert "\n" not in message
        assert any(p in message for p in conformance.REFUSALS.get(op, ())), f"undocumented refusal: {message}"
        pytest.skip(f"refused at plan time: {message}")
    assert outcome in ("pass", "ort"), f"{outcome}: {message}"
