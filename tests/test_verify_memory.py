"""What `run --verify` holds beside the run (issue 26, Deliver 4), asserted on the objects held, not
on RSS: ONNX Runtime's training runs happen in a child process (verification/ort_process.py),
whose failures are one line each; ONNX Runtime's gradients come back from the store one tensor
at a time where they are compared; the state before the step is never copied whole; and a
wrong step still fails, on our side or on ONNX Runtime's."""

from __future__ import annotations

import time
import weakref
from pathlib import Path

import numpy as np
import pytest

from onnxplan.errors import EXIT_BUG, EXIT_FAILURE, ModelError
from onnxplan.executor.prepare import Prepared
from onnxplan.executor.runner import Executor, initial_parameters, step_batches
from onnxplan.loading import open_step
from onnxplan.loading.request import LoadRequest
from onnxplan.planning import PlanOptions, plan_step
from onnxplan.verification import ort_process, ort_step, step_check
from onnxplan.verification.ort_process import OrtProcess, OrtProcessError
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


@pytest.fixture(autouse=True)
def _ort_in_a_child(monkeypatch):
    """These tests are about the child processes: every model, however small, gets them."""
    monkeypatch.setattr(ort_process, "CHILD_FROM_BYTES", 0)


def test_verify_holds_one_tensor_of_ort_at_a_time(monkeypatch, mlp_adamw):
    """ONNX Runtime's training runs happen in a child process per step, before our step (never
    in this process: no training session here); every tensor read back from the store (ONNX
    Runtime's gradients, the state before the step) is dropped before the next is read, but
    for an update group's gradient while its state is read (groups of one parameter here); no
    optimizer session is alive when the next is made; the whole state is never copied."""
    monkeypatch.setattr(step_check, "UPDATE_GROUP_BYTES", 1)  # each parameter's update alone
    reads, sessions = _Held(), _Held()
    seen: dict = {"reads": 0, "sessions_at_new": [], "order": []}
    real_get, real_session, real_child = TensorStore.get, ort_step._session, OrtProcess.step

    def get(self, name):
        # at most the group's gradient (a group of one parameter) stays while its state is read
        assert reads.alive() <= 1, f"reading {name!r} while {reads.alive()} earlier reads are alive"
        seen["reads"] += 1
        out = real_get(self, name)
        reads.add(out)
        return out

    def session(model):
        seen["sessions_at_new"].append(sessions.alive())
        s = real_session(model)
        sessions.add(s)
        return s

    def in_this_process(self, *args, **kwargs):
        raise AssertionError("ONNX Runtime's training model ran in the verifying process")

    def child(self, *args, **kwargs):
        seen["order"].append("ort")
        return real_child(self, *args, **kwargs)

    def whole_state_copy(self, names=None):
        raise AssertionError("the verification copied the whole state")

    real_step = Executor.step

    def step(self, batch):
        seen["order"].append("ours")
        return real_step(self, batch)

    monkeypatch.setattr(TensorStore, "get", get)
    monkeypatch.setattr(ort_step.OrtTrainingStep, "run", in_this_process)
    monkeypatch.setattr(OrtProcess, "step", child)
    monkeypatch.setattr(ort_step, "_session", session)
    monkeypatch.setattr(Executor, "step", step)
    for method in ("parameters", "optimizer_state"):
        real = getattr(Executor, method)
        monkeypatch.setattr(Executor, method, lambda self, names=None, real=real: (
            whole_state_copy(self) if names is None else real(self, names)))
    v = step_check.verify_run(mlp_adamw, steps=2)
    assert v.ok, v.summary()
    assert seen["order"] == ["ort", "ours", "ort", "ours"]  # ONNX Runtime's process first, then ours
    assert v.ort_peak_rss_bytes > 0  # the child's peak, read back
    params = len(mlp_adamw.graph.optimizer["params"])
    # per step in this process: each gradient where compared and by the optimizer; each
    # parameter's state before the step (itself and two moments) by the optimizer
    assert seen["reads"] == 2 * (2 * params + 3 * params)
    # sessions here: the optimizer's only, made once per step and released after its updates
    assert seen["sessions_at_new"] == [0, 0]


def test_ort_values_come_from_its_process(monkeypatch, mlp_adamw):
    """Both ways: ONNX Runtime's gradients as its process wrote them are what we are compared
    with: one of them made 50% larger in the store after the child wrote it fails, naming it."""
    real_child = OrtProcess.step
    last = mlp_adamw.graph.optimizer["params"][-1]

    def tampered(self, *args, **kwargs):
        out = real_child(self, *args, **kwargs)
        self.store.put("grad:" + last, self.store.get("grad:" + last) * np.float32(1.5))
        return out

    assert step_check.verify_run(mlp_adamw, steps=1).ok
    monkeypatch.setattr(OrtProcess, "step", tampered)
    v = step_check.verify_run(mlp_adamw, steps=1)
    assert not v.ok
    assert any(c.kind == "gradient" and c.name == last for c in v.steps[0].failures), v.steps[0].failures


def test_the_child_gets_our_thread_count(mlp_adamw):
    """The children's ONNX Runtime sessions get this process's threads (onnxplan.threads), 1 or 2."""
    from onnxplan.threads import current, use_threads

    before = current().threads
    try:
        for n in (1, 2):
            use_threads(n)
            v = step_check.StepVerifier(mlp_adamw.graph, mlp_adamw.plan, mlp_adamw.folder)
            try:
                v.start(initial_parameters(mlp_adamw.folder))
                v._keep_state(step_batches(mlp_adamw.folder, 1, 0)[0])
                out = v.ort_process.step(v._param_names, list(step_batches(mlp_adamw.folder, 1, 0)[0]))
            finally:
                v.close()
            assert out.ort_threads == n
    finally:
        use_threads(before)


def _child_file(tmp_path: Path, body: str) -> str:
    """A target file for OrtProcess's child (memprobe's `file.py:function` form)."""
    path = tmp_path / "child.py"
    path.write_text("import os, signal, sys, time\n\n\ndef step_target(job):\n    " + body + "\n")
    return f"{path}:"


def _process(tmp_path: Path, folder: Path) -> OrtProcess:
    return OrtProcess(folder, TensorStore(tmp_path), {}, 1)


def test_a_killed_child_is_one_line(monkeypatch, tmp_path, mlp_adamw):
    monkeypatch.setattr(ort_process, "_TARGET", _child_file(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)"))
    with pytest.raises(OrtProcessError) as err:
        _process(tmp_path, mlp_adamw.folder).step([], [])
    assert "was killed by SIGKILL (out of memory?" in str(err.value) and "\n" not in str(err.value)
    assert err.value.exit_code == EXIT_FAILURE


def test_a_child_past_its_time_is_stopped(monkeypatch, tmp_path, mlp_adamw):
    monkeypatch.setattr(ort_process, "_TARGET", _child_file(tmp_path, "time.sleep(120)"))
    monkeypatch.setattr(ort_process, "CHILD_TIMEOUT_S", 3.0)
    t0 = time.monotonic()
    with pytest.raises(OrtProcessError, match="ran past 3 s and was stopped"):
        _process(tmp_path, mlp_adamw.folder).step([], [])
    assert time.monotonic() - t0 < 60


def test_an_internal_error_in_the_child_is_one_line_and_exit_4(tmp_path, mlp_adamw):
    """A bug in the child (here: a parameter the store does not hold): its last line, EXIT_BUG."""
    with pytest.raises(OrtProcessError) as err:
        _process(tmp_path, mlp_adamw.folder).step(["no.such.parameter"], [])
    assert "failed (exit 4): KeyError: 'state:no.such.parameter'" in str(err.value)
    assert err.value.exit_code == EXIT_BUG


def test_a_user_error_in_the_child_keeps_its_line_and_exit_code(tmp_path):
    """ONNX Runtime's side refusing the folder (no training model): the child's own ModelError."""
    with pytest.raises(OrtProcessError) as err:
        _process(tmp_path, tmp_path).step([], [])
    assert "training_model.onnx: not found" in str(err.value)
    assert err.value.exit_code == ModelError.exit_code


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


_RUN_THEN_COUNT = """
import gc, importlib, sys
import onnxplan.ort
if sys.argv[2] == "plain":  # the import as it was: on the caller's stack
    onnxplan.ort.import_training = lambda: importlib.import_module("onnxruntime.training")
from onnxplan.executor.runner import Executor, run_plan
assert "onnxruntime.training" not in sys.modules
run_plan(sys.argv[1], steps=1, warmup=1)
gc.collect()
print("executors alive:", sum(isinstance(o, Executor) for o in gc.get_objects()))
"""


@pytest.mark.parametrize("how", ["thread", "plain"])
def test_the_run_leaves_no_executor_behind(mlp_adamw, how):
    """Both ways: importing onnxruntime.training stores an exception whose traceback holds the
    importing stack's frames; imported first inside run_plan (initial_parameters), the finished
    run's executor (its arena and state region: 2.9 GB of GPT-2 small) stayed alive until the
    process ended. Imported on a thread of its own (onnxplan.ort.import_training) nothing
    stays; imported plainly, the executor does."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _RUN_THEN_COUNT, str(mlp_adamw.folder), how],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    alive = int(proc.stdout.strip().splitlines()[-1].split(":")[1])
    assert alive == (0 if how == "thread" else 1), proc.stdout


def test_a_small_model_verifies_with_ort_in_this_process(monkeypatch, mlp_adamw):
    """Below CHILD_FROM_BYTES of state ONNX Runtime's jobs run in this process (no child started),
    through the same store: the run verifies, and both ways, a gradient made 50% larger in the
    store after ONNX Runtime wrote it fails, naming it."""
    monkeypatch.setattr(ort_process, "CHILD_FROM_BYTES", 1 << 40)

    def no_child(*args, **kwargs):
        raise AssertionError("a child process was started for a small model")

    monkeypatch.setattr(ort_process, "probe_peak", no_child)
    v = step_check.verify_run(mlp_adamw, steps=1)
    assert v.ok, v.summary()
    assert v.ort_peak_rss_bytes == 0
    real_step, last = OrtProcess.step, mlp_adamw.graph.optimizer["params"][-1]

    def tampered(self, *args, **kwargs):
        out = real_step(self, *args, **kwargs)
        self.store.put("grad:" + last, self.store.get("grad:" + last) * np.float32(1.5))
        return out

    monkeypatch.setattr(OrtProcess, "step", tampered)
    v = step_check.verify_run(mlp_adamw, steps=1)
    assert not v.ok
    assert any(c.kind == "gradient" and c.name == last for c in v.steps[0].failures), v.steps[0].failures


def test_a_full_disk_is_one_line_not_a_bug(tmp_path, monkeypatch):
    """numpy's short write (no errno) while verification stores a tensor: a TensorStoreError
    (exit 2, the folder named) and no partial file left; a store with room keeps the tensor."""
    from onnxplan.errors import EXIT_USAGE
    from onnxplan.verification.store import TensorStoreError

    store = TensorStore(tmp_path)
    x = np.arange(6, dtype=np.float32)
    store.put("kept", x)
    np.testing.assert_array_equal(store.get("kept"), x)

    def short_write(path, array, allow_pickle=False):
        with open(path, "wb") as f:
            f.write(b"\x93NUMPY")
        raise OSError("2359296 requested and 524256 written")

    monkeypatch.setattr(np, "save", short_write)
    with pytest.raises(TensorStoreError) as info:
        store.put("grad:w", x)
    assert info.value.exit_code == EXIT_USAGE
    assert "--swap-dir" in str(info.value) and "\n" not in str(info.value)
    assert "grad:w" not in store and "kept" in store
    store.close()
