"""onnxplan: plan, run and benchmark the memory of one ONNX training step.

    import onnxplan
    step = onnxplan.load("mlp", batch=8)
    plan = onnxplan.plan(step, budget="64MiB")
    report = onnxplan.run(step, plan, steps=2, verify=True)
"""

from onnxplan._version import __version__
from onnxplan.api import Step, bench, load, plan, run, solve
from onnxplan.budget import MemoryRequest
from onnxplan.plan import Plan
from onnxplan.planning import PlanOptions
from onnxplan.run_report import RunReport

__all__ = ["MemoryRequest", "Plan", "PlanOptions", "RunReport", "Step", "__version__", "bench", "load", "plan", "run",
           "solve"]
