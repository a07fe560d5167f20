"""Graph rewrites of the step, composable by name: importing this package registers realize,
interleave, inplace, inplace-state and split-grad (onnxplan.checkpoint.recompute registers recompute:<schedule>)."""

from onnxplan.passes import inplace, interleave, realize, split_grad
from onnxplan.passes._infra import (PASS_FACTORIES, PASSES, PassError, PassResult, find_pass, register_pass,
                                    register_pass_factory, run_pipeline)

__all__ = ["PASSES", "PASS_FACTORIES", "PassError", "PassResult", "find_pass", "inplace", "interleave", "realize",
           "register_pass", "register_pass_factory", "run_pipeline", "split_grad"]
