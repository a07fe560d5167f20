"""onnxplan.explain: what `explain` shows, built by the library."""

from __future__ import annotations

from types import SimpleNamespace

from onnxplan.explain import recompute_copies, stage_rows
from onnxplan.plan_records import CheckpointStage


def test_recomputed_copies_are_read_by_the_one_parser_of_copy_names():
    order = ["a", "b@rc1", "b", "b@rc2", "c@in1", "layer@2", "layer@2@rc1"]
    assert recompute_copies(order) == {"b": ["b@rc1", "b@rc2"], "layer@2": ["layer@2@rc1"]}


def test_a_stage_keeps_all_its_values_its_input_or_nothing():
    def stage(i, mode, runs, a, abar, rec=()):
        return CheckpointStage(stage=i, nodes=2, first=f"n{i}", last=f"n{i}" if i else "m0", input="",
                               output=f"o{i}", a_bytes=a, abar_bytes=abar, forward_pass=mode, runs=runs,
                               kept=(f"k{i}",), recomputed=tuple(rec), forward_seconds=0.001,
                               extra_seconds=0.001 * (runs - 1))

    stages = [stage(0, "keep all", 1, 10, 50), stage(1, "keep input", 2, 20, 70, ["r"]), stage(2, "keep nothing", 2, 30, 90)]
    rows = stage_rows(SimpleNamespace(stages=stages))
    assert [r.kept_bytes for r in rows] == [50, 10, 0]
    assert [r.span for r in rows] == ["n0 .. m0", "n1", "n2"]
    assert (rows[1].recomputed, rows[1].recomputed_bytes, rows[2].recomputed_bytes) == (("r",), 70, 0)
