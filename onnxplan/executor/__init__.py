"""The arena-backed executor: run a plan's training step in one preallocated buffer."""

from onnxplan.executor.arena import Arena
from onnxplan.executor.check_arena import ArenaCheckError
from onnxplan.executor.measure import measure_run
from onnxplan.executor.prepare import Prepared, adopt_plan, prepare
from onnxplan.executor.runner import Executor, KernelError, RunResult, run_plan

__all__ = ["Arena", "ArenaCheckError", "Executor", "KernelError", "Prepared", "RunResult", "adopt_plan",
           "measure_run", "prepare", "run_plan"]

