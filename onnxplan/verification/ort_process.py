"""ONNX Runtime's side of a verified step in a child process, so that its memory goes with it.

ONNX Runtime keeps about 2 GB of GPT-2 small's training run in its process after the run,
session dropped or not, and every later run peaks 4.4 GB over that (reports/real-size.md, "What
`run --verify` holds"); in our process that sat beside our own step. Here each job is a fresh
interpreter (onnxplan.memprobe.probe_peak: it dies with this process, and its peak RSS is
read back): it reads the state before the step and the step's data from the verification's
store (verification/store.py, where the parent wrote them), runs the training model, writes
what the comparison reads to the store and exits:

- `step`: ONNX Runtime's step from that state (loss, every gradient, the loss node's inputs,
  the running statistics, the random values it drew);
- `noise`: in a second child, its run again from the state with every float input moved one
  ulp at random and the first run's random values (the step's rounding noise: StepVerifier's
  tolerances), compared with the first run's there (ONNX Runtime keeps ~2 GB of its first
  run in a process, and a second run in the same process peaks 4.4 GB over that);
- `explain`: the step with every intermediate value exposed (a failure's explanation).

The parent meanwhile holds only its state (the arena's pages are given back between verified
steps), so its arena and ONNX Runtime are never both at their peak. The child gets the
parent's thread count (onnxplan.threads). A child that fails is one line (OrtProcessError): its
own user error with its exit code; an internal error (exit EXIT_BUG in the child); killed (the
OOM killer or a memory cap: SIGKILL); or past CHILD_TIMEOUT_S, never a hang.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onnxplan.errors import EXIT_BUG, EXIT_FAILURE, OnnxplanError
from onnxplan.memprobe import ProbeError, probe_peak
from onnxplan.verification.store import TensorStore

__all__ = ["CHILD_TIMEOUT_S", "OrtJob", "OrtProcess", "OrtProcessError", "StepOutcome"]

# ONNX Runtime's runs go to child processes from this many bytes of the step's persistent state
# (parameters, optimizer state): below, what ONNX Runtime keeps after a run is small beside the
# machine, and a child's start (~2.7 s: torch and ONNX Runtime imported, twice a verified step)
# would be most of a small model's verification. Below it the same jobs run in this process, on
# the same store (the same protocol: what the child would read and write)
CHILD_FROM_BYTES = 256 << 20
# one job's wall-clock limit: GPT-2 small's two training runs take ~1-2 min at 2 threads on a
# loaded machine; a child past this is killed and the verification fails with one line
CHILD_TIMEOUT_S = 3600.0
_TARGET = "onnxplan.verification.ort_process:"
_JOB_FILE = "job.json"
_NUDGE_SEED = 12345


class OrtProcessError(OnnxplanError):
    """ONNX Runtime's side of the verification failed in its process (killed, timed out, an
    internal error: exit_code EXIT_BUG; or its own user error, with that error's exit code)."""

    exit_code = EXIT_FAILURE


@dataclass(frozen=True)
class OrtJob:
    """What a child reads: the artifact folder, the store, the thread count, the static shapes
    ConvGrad's repair needs (ort_step.explicit_conv_grad_pads), the parameters in the state's
    order (the order the noise run nudges them in) and the step's inputs in the batch's."""

    folder: str
    store: str
    threads: int
    shapes: dict[str, list[int]]
    params: list[str]
    batch: list[str]


@dataclass
class StepOutcome:
    """What a child's ONNX Runtime step found; the tensors are in the store (`grad:P`,
    `loss:K`, `running:R`, `random:NODE`; `value:NAME` for an explained step)."""

    loss: float
    loss_floor: float  # norm_floors.loss_floor on the loss node's inputs
    noise: dict[Any, float]  # "loss" and (kind, name) -> the nudged run's relative error
    random: list[str]  # random nodes whose draws are stored
    running: list[str]  # running statistics whose new values are stored
    loss_inputs: list[int]  # indices of the loss node's inputs that are stored
    values: list[str] = field(default_factory=list)  # exposed intermediates (explain)
    peak_rss_bytes: int = 0  # the child's peak RSS
    ort_threads: int = 0  # the intra-op threads the child's sessions got (onnxplan.threads)


class OrtProcess:
    """ONNX Runtime's training model of `folder`, run in a child per job on `store`'s tensors."""

    def __init__(self, folder: str | Path, store: TensorStore, shapes: Mapping[str, tuple[int, ...]],
                 threads: int, state_bytes: int | None = None) -> None:
        """`state_bytes`: the step's persistent bytes; below CHILD_FROM_BYTES the jobs run in
        this process (None: always in a child)."""
        self.folder, self.store, self.threads = str(Path(folder).resolve()), store, int(threads)
        self.shapes = {k: [int(d) for d in v] for k, v in shapes.items()}
        self.in_child = state_bytes is None or state_bytes >= CHILD_FROM_BYTES
        self.peak_rss_bytes = 0  # the largest child's peak RSS so far (0: none ran in a child)

    def step(self, params: list[str], batch: list[str]) -> StepOutcome:
        """ONNX Runtime's step, then its noise run in a second child: ONNX Runtime keeps ~2 GB
        of its first run in a process and a second run there peaks 4.4 GB over that (GPT-2
        small), so each run gets a fresh process (the second peak is then the first's)."""
        out = self._run("step_target", params, batch)
        noise = self._run("noise_target", params, batch)
        out.noise = {"loss": abs(noise.loss - out.loss) / max(abs(out.loss), 1e-12), **noise.noise}
        return out

    def explain(self, params: list[str], batch: list[str]) -> StepOutcome:
        return self._run("explain_target", params, batch)

    def _run(self, target: str, params: list[str], batch: list[str]) -> StepOutcome:
        job = OrtJob(self.folder, str(self.store.root), self.threads, self.shapes, params, batch)
        path = self.store.root / _JOB_FILE
        path.write_text(json.dumps(asdict(job)))
        if not self.in_child:
            from onnxplan.threads import current

            out = dict(_result(str(path), _WORK[target], lambda threads: current()))
            return self._outcome(out, 0)
        try:
            res = probe_peak(_TARGET + target, {"job": str(path)}, timeout_s=CHILD_TIMEOUT_S)
        except ProbeError as exc:
            err = OrtProcessError(f"ONNX Runtime's side of the verification (its own process) {exc.reason}")
            err.exit_code = EXIT_BUG if exc.returncode == EXIT_BUG else EXIT_FAILURE
            raise err from None
        self.peak_rss_bytes = max(self.peak_rss_bytes, res.peak_rss_bytes)
        return self._outcome(dict(res.result), res.peak_rss_bytes)

    @staticmethod
    def _outcome(out: dict, peak_rss_bytes: int) -> StepOutcome:
        if "error" in out:
            err = OrtProcessError(out["error"])
            err.exit_code = int(out["exit_code"])
            raise err
        noise = {tuple(k) if isinstance(k, list) else k: v for k, v in out.pop("noise")}
        return StepOutcome(noise=noise, peak_rss_bytes=peak_rss_bytes, **out)


# ---- the child's side ----------------------------------------------------------------------


def step_target(job: str) -> dict:
    """probe_peak's target in the child: ONNX Runtime's step."""
    return _in_child(job, _step)


def noise_target(job: str) -> dict:
    """probe_peak's target in the child: ONNX Runtime's noise run (after step_target's)."""
    return _in_child(job, _noise)


def explain_target(job: str) -> dict:
    """probe_peak's target in the child: ONNX Runtime's step with every intermediate exposed."""
    return _in_child(job, _explain)


def _result(path: str, work: Callable[[OrtJob], dict], threads: Callable[[int], Any]) -> dict:
    """`work` on the job at `path`, its pools sized by `threads(job.threads)` (a ThreadSettings):
    a user error comes back as the result (its line and exit code)."""
    try:
        job = OrtJob(**json.loads(Path(path).read_text()))
        settings = threads(job.threads)
        return {**work(job), "ort_threads": settings.ort_intra}
    except OnnxplanError as exc:
        return {"error": str(exc), "exit_code": exc.exit_code}


def _in_child(path: str, work: Callable[[OrtJob], dict]) -> dict:
    """_result in the child, every pool sized for the job; anything but a user error is a bug:
    its traceback on stderr, exit EXIT_BUG."""
    from onnxplan.threads import use_threads

    try:
        return _result(path, work, use_threads)
    except Exception:  # noqa: BLE001 - an internal error: the parent reports its last line
        traceback.print_exc()
        sys.exit(EXIT_BUG)


def _inputs(job: OrtJob, store: TensorStore) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    return ({p: store.get("state:" + p) for p in job.params}, {n: store.get("batch:" + n) for n in job.batch})


def _training_step(job: OrtJob):
    from onnxplan.verification.ort_step import OrtTrainingStep

    return OrtTrainingStep(job.folder, {k: tuple(v) for k, v in job.shapes.items()})


def _put_all(store: TensorStore, prefix: str, items: Iterable[tuple[str, np.ndarray]]) -> list[str]:
    names = []
    for name, value in items:
        store.put(prefix + name, value)
        names.append(name)
    return names


def _step(job: OrtJob) -> dict:
    from onnxplan.verification.norm_floors import loss_floor

    store = TensorStore.attach(job.store)
    ort = _training_step(job)
    params, batch = _inputs(job, store)
    first = ort.run(params, batch)
    params.clear()
    floor = loss_floor(ort.loss_node, first.loss_inputs) if ort.loss_node is not None else 0.0
    _put_all(store, "grad:", first.grads.items())
    loss_inputs = [k for k, x in enumerate(first.loss_inputs) if x is not None]
    _put_all(store, "loss:", ((str(k), first.loss_inputs[k]) for k in loss_inputs))
    return {"loss": first.loss, "loss_floor": floor, "noise": [], "loss_inputs": loss_inputs,
            "random": _put_all(store, "random:", first.random.items()),
            "running": _put_all(store, "running:", first.running.items())}


def _nudge(items: dict[str, np.ndarray], rng: np.random.Generator) -> None:
    """Every float tensor of `items` moved by one ulp up or down at random, in place of its
    entry, in the dict's order (x * (1 ± 2^-23), seeded by the caller)."""
    for k, v in items.items():
        if v.dtype.kind == "f":
            sign = rng.integers(0, 2, v.shape, dtype=np.int8) * 2 - 1
            items[k] = (v * (1 + sign.astype(v.dtype) * v.dtype.type(2 ** -23))).astype(v.dtype)


def _noise(job: OrtJob) -> dict:
    """ONNX Runtime against itself from the state with every float input and parameter moved
    by one ulp up or down at random, with the same random values (the first run's, from the
    store): the error a change at rounding level makes in each tensor of this step. (A
    coherent nudge, every element the same way, would scale pre-activations and never flip a
    sign.) Its gradients and running statistics are compared with the first run's one at a
    time (read from the store); its loss is returned (the caller compares it)."""
    from onnxplan.verification.compare import rel_norm_error

    store = TensorStore.attach(job.store)
    ort = _training_step(job)
    params, batch = _inputs(job, store)
    rng = np.random.default_rng(_NUDGE_SEED)
    _nudge(params, rng)
    _nudge(batch, rng)
    given = {n: store.get("random:" + n) for n in ort.random_of if "random:" + n in store}
    other = ort.run(params, batch, given=given)
    params.clear()
    out: list[tuple[Any, float]] = []
    for p in list(other.grads):
        out.append((("gradient", p), rel_norm_error(other.grads.pop(p), store.get("grad:" + p))))
    out += [(("running", r), rel_norm_error(v, store.get("running:" + r))) for r, v in other.running.items()]
    return {"loss": other.loss, "loss_floor": 0.0, "noise": out, "loss_inputs": [], "random": [], "running": []}


def _explain(job: OrtJob) -> dict:
    store = TensorStore.attach(job.store)
    ort = _training_step(job)
    params, batch = _inputs(job, store)
    step = ort.run(params, batch, expose_all=True)
    params.clear()
    _put_all(store, "grad:", step.grads.items())
    return {"loss": step.loss, "loss_floor": 0.0, "noise": [], "loss_inputs": [], "running": [],
            "random": _put_all(store, "random:", step.random.items()),
            "values": _put_all(store, "value:", ((k, v) for k, v in step.values.items() if isinstance(v, np.ndarray)))}


# what each child target runs (OrtProcess runs the same in this process below CHILD_FROM_BYTES)
_WORK: dict[str, Callable[[OrtJob], dict]] = {"step_target": _step, "noise_target": _noise, "explain_target": _explain}
