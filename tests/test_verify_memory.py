"""What `run --verify` holds beside the run (issue 26, Deliver 4), asserted on the objects held, not
on RSS: no ONNX Runtime session outlives its run; ONNX Runtime's gradients are out of memory
while our step runs and come back one tensor at a time where they are compared; the state
before the step is never copied whole; and a wrong step still fails."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

from onnxplan.executor.prepare import Prepared
from onnxplan.executor.runner import Executor
from onnxplan.loading import open_step
from onnxplan.loading.request import LoadRequest
from onnxplan.planning import PlanOptions, plan_step
from onnxplan.verification import ort_step, step_check
from onnxplan.verification.store import TensorStore

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def mlp_adamw() -> Prepared:
    folder, graph = open_step(LoadRequest("mlp", 2, "adamw"))
    outcome = plan_step(graph, PlanOptions())
    return Prepared(folder, outcome.graph, outcome.plan)


class _Held:
    """Weak references to what was handed out, to count what is still alive."""

    def __init__(self) -> None:
        self.refs: list[weakref.ref] = []

    def add(self, obj: object) -> None:
        self.refs.append(weakref.ref(obj))

    def alive(self) -> int:
        return sum(r() is not None for r in self.refs)


def test_verify_holds_one_tensor_of_ort_at_a_time(monkeypatch, mlp_adamw):
    """Every tensor read back from the store (ONNX Runtime's gradients, the state before the
    step) is dropped before the next is read, but for an update group's gradient while its state
    is read (groups of one parameter here); ONNX
    Runtime's gradients as its run returned them are gone before our step's first node runs;
    no training session is alive when the next is made; the whole state is never copied."""
    monkeypatch.setattr(step_check, "UPDATE_GROUP_BYTES", 1)  # each parameter's update alone
    reads, outputs, sessions = _Held(), _Held(), _Held()
    seen = {"reads": 0, "sessions_at_new": [], "outputs_at_step": []}
    real_get, real_run, real_session = TensorStore.get, ort_step.OrtTrainingStep.run, ort_step._session

    def get(self, name):
        # at most the group's gradient (a group of one parameter) stays while its state is read
        assert reads.alive() <= 1, f"reading {name!r} while {reads.alive()} earlier reads are alive"
        seen["reads"] += 1
        out = real_get(self, name)
        reads.add(out)
        return out

    def run(self, *args, **kwargs):
        step = real_run(self, *args, **kwargs)
        for g in step.grads.values():
            outputs.add(g)
        return step

    def session(model):
        seen["sessions_at_new"].append(sessions.alive())
        s = real_session(model)
        sessions.add(s)
        return s

    def whole_state_copy(self, names=None):
        raise AssertionError("the verification copied the whole state")

    real_step = Executor.step

    def step(self, batch):
        seen["outputs_at_step"].append(outputs.alive())
        return real_step(self, batch)

    monkeypatch.setattr(TensorStore, "get", get)
    monkeypatch.setattr(ort_step.OrtTrainingStep, "run", run)
    monkeypatch.setattr(ort_step, "_session", session)
    monkeypatch.setattr(Executor, "step", step)
    for method in ("parameters", "optimizer_state"):
        real = getattr(Executor, method)
        monkeypatch.setattr(Executor, method, lambda self, names=None, real=real: (
            whole_state_copy(self) if names is None else real(self, names)))
    v = step_check.verify_run(mlp_adamw, steps=2)
    assert v.ok, v.summary()
    params = len(mlp_adamw.graph.optimizer["params"])
    # per step: each gradient where compared, in the noise and by the optimizer; each parameter's
    # state before the step (itself and two moments) by the optimizer
    assert seen["reads"] == 2 * (3 * params + 3 * params)
    assert seen["outputs_at_step"] == [0, 0]  # ORT's gradients are on disk while our step runs
    # sessions: two training runs per step (each made after the previous one was dropped), the
    # optimizer's, made once per step and released after its updates
    assert seen["sessions_at_new"] == [0, 0, 0, 0, 0, 0]


def test_a_wrong_gradient_still_fails_with_ort_values_streamed(monkeypatch, mlp_adamw):
    """The gradients compared as they reach the optimizer: one of ours 50% off is named."""
    last = mlp_adamw.graph.optimizer["grads"][-1]
    hooks_wrap = step_check._Hooks.wrap

    def wrap(self, node, fn):
        inner = hooks_wrap(self, node, fn)

        def run(ctx, inputs, outputs):
            for k, name in enumerate(node.inputs):
                if name == last and inputs[k] is not None:
                    inputs[k] *= np.float32(1.5)
            inner(ctx, inputs, outputs)
        return run

    monkeypatch.setattr(step_check._Hooks, "wrap", wrap)
    v = step_check.verify_run(mlp_adamw, steps=1)
    assert not v.ok
    failed = v.steps[0].failures
    assert any(c.kind == "gradient" and c.name == mlp_adamw.graph.optimizer["params"][-1] for c in failed), failed
