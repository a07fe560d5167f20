"""Peak-memory probe: run a function in a fresh interpreter and report its peak RSS increase."""

from __future__ import annotations

import ctypes
import gc
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from onnxplan import settings
from onnxplan.settings import ENV

__all__ = [
    "ProbeResult",
    "ProbeError",
    "probe_peak",
    "probe_reference",
    "mark_baseline",
    "read_memory_status",
    "METHOD_ENV",
]

METHOD_ENV = ENV["probe_method"]  # "clear_refs" (default) or "sampled" (force the fallback)
_MARKER = "ONNXPLAN-PROBE "
_CLEAR_REFS = "/proc/self/clear_refs"
_SAMPLE_SECONDS = 0.0005
_PARENT_ENV = ENV["probe_parent"]  # the parent's pid: the child ends when it changes
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProbeResult:
    """Peak RSS of the measured section: peak_rss_bytes - baseline_rss_bytes, and the target's result.

    method: "clear_refs" (kernel high-water mark reset at the baseline: exact) or "sampled"
    (VmRSS polled every 0.5 ms by a thread: a lower bound, used where clear_refs is refused).
    """

    peak_increase_bytes: int
    baseline_rss_bytes: int
    peak_rss_bytes: int
    result: dict
    method: str


class ProbeError(RuntimeError):
    """The probed child failed or printed no result; `reason` says how, without the target's
    name (a caller that names the child its own way); `returncode`: the child's exit status
    (negative: the signal that killed it; None: it was stopped or never ran)."""

    def __init__(self, message: str, reason: str = "", returncode: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message
        self.returncode = returncode


def _failure(returncode: int, stderr: str) -> str:
    """How a child that printed no result ended: killed by a signal (SIGKILL: most often the
    kernel's OOM killer or a memory cap), or its exit code and the last line it wrote."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        oom = " (out of memory? the OOM killer and memory caps send it)" if returncode == -signal.SIGKILL else ""
        return f"was killed by {name}{oom}"
    tail = (stderr.strip().splitlines() or ["no output"])[-1]
    return f"failed (exit {returncode}): {tail}"


def read_memory_status() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes, from /proc/self/status."""
    status: dict[str, int] = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                status[key] = int(value.split()[0]) * 1024  # reported in kB
    return status


class _RssSampler(threading.Thread):
    """Fallback peak tracker: polls VmRSS and keeps the maximum since the last reset."""

    def __init__(self) -> None:
        super().__init__(name="onnxplan-rss-sampler", daemon=True)
        self.peak = 0
        self._stop_event = threading.Event()

    def reset(self, rss: int) -> None:
        self.peak = rss

    def run(self) -> None:
        while not self._stop_event.wait(_SAMPLE_SECONDS):
            self.peak = max(self.peak, read_memory_status()["VmRSS"])

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return max(self.peak, read_memory_status()["VmRSS"])


class _Probe:
    """Process-wide probe state, set by mark_baseline() in the child."""

    baseline: int = 0  # VmRSS at the last mark_baseline() (the child calls it before the target)
    method: str | None = None
    sampler: _RssSampler | None = None


def _release_free_heap() -> None:
    gc.collect()
    try:  # glibc: hand freed heap pages back, so reusing them later counts as growth
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_high_water_mark() -> bool:
    if settings.current().probe_method == "sampled":
        return False
    try:
        with open(_CLEAR_REFS, "w") as handle:
            handle.write("5")  # "5": reset the peak RSS (VmHWM) to the current RSS
    except OSError:
        return False
    return True


def mark_baseline() -> None:
    """Start the measured section here: the peak is counted from the RSS at this call.

    Call it in a probe target right before creating the session or arena, after imports
    and input data. Calling it again moves the baseline (the last call wins).
    """
    _release_free_heap()
    if _reset_high_water_mark():
        _Probe.method = "clear_refs"
    else:
        _Probe.method = "sampled"
        if _Probe.sampler is None:
            _Probe.sampler = _RssSampler()
            _Probe.sampler.start()
    _Probe.baseline = read_memory_status()["VmRSS"]
    if _Probe.sampler is not None:
        _Probe.sampler.reset(_Probe.baseline)


def _peak_rss() -> int:
    if _Probe.method == "clear_refs":
        return read_memory_status()["VmHWM"]
    if _Probe.sampler is None:
        raise RuntimeError("the probe's peak RSS read before mark_baseline()")
    return _Probe.sampler.stop()


def _load_target(target: str):
    module_part, sep, func_name = target.rpartition(":")
    if not sep or not module_part or not func_name:
        raise ProbeError(f"target {target!r}: expected 'package.module:function' or 'file.py:function'")
    if module_part.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(module_part).stem, module_part)
        if spec is None or spec.loader is None:
            raise ProbeError(f"target {target!r}: {module_part} cannot be loaded as a Python module")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_part)
    return getattr(module, func_name)


def _die_with_parent() -> None:
    """The kernel kills this child when its parent dies (PR_SET_PDEATHSIG, Linux); a parent
    already gone before that was set (the child's parent pid changed) ends it at once."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    parent = settings.current().probe_parent
    if parent and os.getppid() != int(parent):
        os._exit(1)


def _child_main(argv: list[str]) -> int:
    """Child side: import the target (and its heavy imports), mark, call, print one JSON line."""
    _die_with_parent()
    target, kwargs = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    func = _load_target(target)
    mark_baseline()  # default baseline; the target may mark again right before its session
    result = func(**kwargs)
    peak = _peak_rss()
    row = {
        "peak_increase_bytes": peak - _Probe.baseline,
        "baseline_rss_bytes": _Probe.baseline,
        "peak_rss_bytes": peak,
        "result": result if result is not None else {},
        "method": _Probe.method,
    }
    print(_MARKER + json.dumps(row), flush=True)
    return 0


def probe_peak(
    target: str,
    kwargs: dict | None = None,
    timeout_s: float = 600.0,
    env: dict[str, str | None] | None = None,
    stdin: str | None = None,
) -> ProbeResult:
    """Run `target` ("pkg.module:function" or "path/file.py:function") in a fresh interpreter.

    The child imports the target's module, marks the baseline, calls function(**kwargs)
    (which may call mark_baseline() again just before its session) and reports the peak
    RSS increase over the baseline plus the function's JSON-able dict result. `env` adds to
    (a None value: removes from) this process's environment for the child. `stdin` is
    fed to the child's standard input (large inputs: no temporary file). The child dies
    with this process (a parent-death signal), so a killed parent leaves nothing running.
    """
    command = [sys.executable, "-m", "onnxplan.memprobe", target, json.dumps(kwargs or {})]
    child_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}  # None: unset
    child_env[_PARENT_ENV] = str(os.getpid())
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, env=child_env,
            input=stdin if stdin is not None else "",
        )
    except subprocess.TimeoutExpired:
        reason = f"ran past {timeout_s:g} s and was stopped"
        raise ProbeError(f"probe of {target} {reason}", reason) from None
    rows = [line for line in proc.stdout.splitlines() if line.startswith(_MARKER)]
    if proc.returncode != 0 or not rows:
        reason = _failure(proc.returncode, proc.stderr)
        raise ProbeError(f"probe of {target} {reason}", reason, proc.returncode)
    row = json.loads(rows[-1][len(_MARKER) :])
    return ProbeResult(**row)


def probe_reference(artifact_dir: str | Path, steps: int = 3, seed: int = 0) -> ProbeResult:
    """Peak RSS increase of ONNX Runtime training `steps` seeded steps on an artifact folder.

    Baseline: torch and onnxruntime imported, step data generated; measured: checkpoint
    load, session creation and the steps. result: {"losses": [...], "step_seconds": [...]}.
    """
    kwargs = {"artifact_dir": str(Path(artifact_dir).resolve()), "steps": steps, "seed": seed}
    return probe_peak("onnxplan.verification.reference:probe_target", kwargs)


if __name__ == "__main__":
    # Run through the importable module, not __main__, so targets share mark_baseline's state.
    from onnxplan.memprobe import _child_main as _main

    sys.exit(_main(sys.argv[1:]))
