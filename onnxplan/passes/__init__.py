"""Graph rewrites of the step (realize, interleave, split-grad, inplace, inplace-state) and the
pass infrastructure. Nothing registers on import: onnxplan.pipeline lists every pass a pipeline
can name, with what each requires and ensures, and runs pipelines."""

from onnxplan.passes._infra import Pass, PassError, PassFamily, PassResult, PassTable, run_passes

__all__ = ["Pass", "PassError", "PassFamily", "PassResult", "PassTable", "run_passes"]
