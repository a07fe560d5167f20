"""Every pass a plan's pass list can name, listed once, with what each requires and ensures; and
the runner of a pass list (`run_pipeline`). Nothing registers on import.

Properties: "realized" (realize: the loaded step as the executor runs it), "interleaved"
(optimizer updates split per parameter), "split-grad" (ConvGrad in dW and dX halves), "split"
(nodes in chunks over pieces: passes/split.py; "split:" + the JSON of its splits),
"recomputed" (a recompute schedule applied; its code indexes the graph it was made on, so it runs
before the in-place passes), "inplace" (outputs aliased to dying inputs; "inplace-state": the state
updates only).
"""

from __future__ import annotations

from onnxplan.checkpoint.dag import DAG_PREFIX, dag_recompute_pass
from onnxplan.checkpoint.recompute import recompute_pass
from onnxplan.ir.graph import StepGraph
from onnxplan.passes._infra import Pass, PassFamily, PassFn, PassResult, PassTable, run_passes
from onnxplan.passes.inplace import inplace, inplace_state
from onnxplan.passes.interleave import interleave
from onnxplan.passes.realize import realize
from onnxplan.passes.split import split_pass
from onnxplan.passes.split_grad import split_grad

__all__ = ["PASSES", "find_pass", "run_pipeline"]


def _recompute(code: str) -> PassFn:
    """The recompute pass of a schedule code: on the whole graph ("dag.") or on the chain."""
    return dag_recompute_pass(code) if code.startswith(DAG_PREFIX) else recompute_pass(code)


PASSES = PassTable.of([
    Pass("realize", realize, ensures=("realized",)),
    Pass("interleave", interleave, requires=("realized",), ensures=("interleaved",)),
    Pass("split-grad", split_grad, requires=("realized",), ensures=("split-grad",)),
    PassFamily("split", split_pass, requires=("realized",), ensures=("split",)),
    PassFamily("recompute", _recompute, requires=("realized",), ensures=("recomputed",)),
    Pass("inplace", inplace, requires=("realized",), ensures=("inplace",)),
    Pass("inplace-state", inplace_state, requires=("realized",), ensures=("inplace-state",)),
])


def find_pass(name: str) -> PassFn | None:
    """The rewrite a pipeline name stands for ("NAME" or "NAME:ARG"), or None."""
    p = PASSES.find(name)
    return None if p is None else p.fn


def run_pipeline(graph: StepGraph, names: list[str],
                 table: PassTable = PASSES) -> tuple[StepGraph, list[tuple[str, PassResult]]]:
    """Run the named passes of `table` (every pass of the step) in order: onnxplan.passes.run_passes."""
    return run_passes(graph, names, table)
