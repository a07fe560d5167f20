"""The typed records of the plan file, the bench results and the gate: their SCHEMA pages are
generated from them, a malformed file is refused in one line naming the field's path, and what
the project commits still loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onnxplan.errors import ModelError
from onnxplan.schema_doc import PAGES

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted(PAGES), ids=lambda p: p.name)
def test_the_committed_schema_pages_are_generated_from_the_records(path):
    assert path.read_text() == PAGES[path](), f"{path} is stale: run python -m onnxplan.schema_doc"


def test_every_committed_bench_results_file_loads():
    from onnxplan.bench.results import load_results

    checked = 0
    for path in sorted((ROOT / "reports").glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            continue  # JSON lines and other reports
        if isinstance(doc, dict) and doc.get("kind") == "onnxplan-bench":
            load_results(path)
            checked += 1
    assert checked >= 2  # the gate's baseline and the zoo's bench at least


def _plan_json() -> dict:
    from onnxplan.plan import Plan, PlannedBuffer
    from onnxplan.plan_records import CheckpointRecord

    stage = {"stage": 1, "nodes": 1, "first": "a", "last": "a", "input": "", "output": "a", "a_bytes": 64,
             "abar_bytes": 64, "forward_pass": "keep all", "runs": 1, "kept": ["a"], "recomputed": [],
             "forward_seconds": 0.5, "extra_seconds": 0.0, "not_recomputable": ""}
    plan = Plan("m", ("a",), (PlannedBuffer("a", 64, "activation", 0, 0, 0),), 128, 64, 192, "greedy-size",
                "given", 0.1, ("realize",), checkpoint=CheckpointRecord("sqrt", stages=(stage,)))
    return json.loads(plan.dumps())


def test_a_plan_round_trips_and_its_records_are_typed():
    from onnxplan.plan import Plan
    from onnxplan.plan_records import CheckpointStage

    d = _plan_json()
    plan = Plan.from_json(d)
    assert isinstance(plan.checkpoint.stages[0], CheckpointStage) and plan.checkpoint.stages[0].abar_bytes == 64
    assert json.loads(plan.dumps()) == d


@pytest.mark.parametrize("edit, where", [
    (lambda d: d["checkpoint"]["stages"][0].pop("abar_bytes"), "checkpoint.stages[0].abar_bytes: field required"),
    (lambda d: d["buffers"][0].update(bytes="many"), "buffers[0].bytes: input should be a valid integer"),
    (lambda d: d["swap"].update(swaps=None), "swap.swaps: input should be a valid integer"),
    (lambda d: d.pop("solver"), "malformed plan: solver: field required"),
])
def test_a_malformed_plan_names_the_field_path(edit, where):
    from onnxplan.plan import Plan

    d = _plan_json()
    edit(d)
    with pytest.raises(ModelError, match="^malformed plan: ") as err:
        Plan.from_json(d)
    assert where in str(err.value) and "\n" not in str(err.value)


def test_a_record_item_with_a_key_its_type_lacks_is_refused():
    """A producer adding a key to a joint round (a dict) must add the field: the data is not dropped."""
    from pydantic import ValidationError

    from onnxplan.plan_records import JointRecord

    rnd = {"model_budget_bytes": 1, "estimate_bytes": 1, "placed_peak_bytes": 1, "status": "OPTIMAL", "gap": None,
           "solve_seconds": 0.0, "warm_start": "none", "recompute_seconds": 0.0, "stall_seconds": 0.0,
           "page_ins": 0, "page_ins_not_lowered": []}
    assert JointRecord(rounds=(rnd,)).rounds[0].status == "OPTIMAL"
    with pytest.raises(ValidationError, match="new_key"):
        JointRecord(rounds=({**rnd, "new_key": 1},))


def test_a_malformed_results_row_names_the_field_path(tmp_path):
    from onnxplan.bench.results import dumps_results, load_results, new_results

    doc = new_results({})
    doc["rows"] = [{"model": "mlp", "strategy": "auto", "planned_peak_bytes": 10, "lower_bound_bytes": 5,
                    "fits_budget": "perhaps"}]
    (tmp_path / "r.json").write_text(dumps_results(doc))
    with pytest.raises(ModelError, match=r"r.json: rows\[0\].fits_budget: input should be a valid boolean"):
        load_results(tmp_path / "r.json")
