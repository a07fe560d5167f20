"""onnxplan: plan, run and benchmark the memory of one ONNX training step.

    import onnxplan
    step = onnxplan.load("mlp", batch=8)
    plan = onnxplan.plan(step, budget="64MiB")
    report = onnxplan.run(step, plan, steps=2, verify=True)
"""

from onnxplan import threads as _threads

_threads.prepare_process()  # before anything loads an OpenMP runtime (torch): idle workers sleep

from onnxplan._version import __version__  # noqa: E402
from onnxplan.api import Step, bench, load, plan, run, solve  # noqa: E402
from onnxplan.budget import MemoryRequest  # noqa: E402
from onnxplan.plan import Plan  # noqa: E402
from onnxplan.planning import PlanOptions  # noqa: E402
from onnxplan.run_report import RunReport  # noqa: E402

__all__ = ["MemoryRequest", "Plan", "PlanOptions", "RunReport", "Step", "__version__", "bench", "load", "plan", "run",
           "solve"]
