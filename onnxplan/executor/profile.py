"""A short profile of our kernels: seconds per node of the step (the profiled cost model of
onnxplan.budget; planning itself never runs kernels).

A profile is kept twice: in this process (one per key) and on disk, in
$ONNXPLAN_CACHE/profiles/ (one JSON file per key), so every later command and candidate
planned for the same step reuses it instead of running the kernels again. The key is the
graph's fingerprint (its content, not the model's name: batch, --dim, optimizer and loss are
in it), inplace, order, steps, clock, device and thread count, plus what else decides the
kernels' times: the onnxplan, numpy and torch versions, the kernel switches
(ONNXPLAN_TORCH_KERNELS, ONNXPLAN_BIND_KERNELS, ONNXPLAN_PARALLEL_MIN_ELEMS), the OpenMP wait
policy and the processor (or GPU) model. Files are written whole (a temporary file renamed
over), so a reader never sees half of one; an unreadable one is a miss. Only a completed
profile is stored (never a fallback to the FLOP estimate). ONNXPLAN_PROFILE_CACHE=off
neither reads nor writes the disk cache (a fresh profile every process)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from onnxplan import settings
from onnxplan.checkpoint.costs import TimeModel
from onnxplan.device import array_module
from onnxplan.errors import OnnxplanError
from onnxplan.executor.runner import Executor
from onnxplan.ir.graph import StepGraph
from onnxplan.planning import PlanOptions, plan_step
from onnxplan.threads import resolve_threads, use_threads

__all__ = ["DEFAULT_CLOCK", "PROFILE_CACHE_ENV", "profile_cache_path", "profile_times", "step_data"]

PROFILE_CACHE_ENV = settings.ENV["profile_cache"]  # "off" (or 0): no disk cache of profiles
_FORMAT = 3  # the disk entry's layout: bump when it (or how a profile is measured) changes
# (3: the thread policy's BLAS and torch at 1 thread, GEMMs split by kernels.parallel)
# a step whose first run (its arena touched beforehand) takes at least this long is profiled from
# that run alone: its kernels take milliseconds each, so one timing is as good as the least of
# several, and the step's own costs (feeding, the loop) are a negligible part of it. A real-size
# model (ResNet-50 at batch 16: ~6-11 s a step) is then profiled in one step instead of 2 + 2 x steps.
LONG_STEP = 0.5

DEFAULT_CLOCK = "wall"  # what planning profiles with; benchmarks on shared machines set "cpu"


def step_data(graph: StepGraph, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the planned shapes: small random floats, zero indices and labels (timing
    does not depend on the values)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in graph.inputs:
        spec = graph.values[name].known_spec
        if np.issubdtype(np.dtype(spec.dtype), np.floating):
            out[name] = rng.standard_normal(spec.shape).astype(spec.dtype)
        else:
            out[name] = np.zeros(spec.shape, dtype=spec.dtype)
    return out


def _stand_in(graph: StepGraph, name: str) -> np.ndarray:
    """A parameter's stand-in of the usual scale (zeros would make the gradients denormal,
    and denormal arithmetic is many times slower): ones for vectors (scales, variances),
    normal(0, 1 / sqrt(largest dimension)) otherwise."""
    spec = graph.values[name].known_spec
    if not np.issubdtype(np.dtype(spec.dtype), np.floating):
        return np.zeros(spec.shape, spec.dtype)
    if len(spec.shape) <= 1:
        return np.ones(spec.shape, spec.dtype)
    rng = np.random.default_rng(len(name))
    return (rng.standard_normal(spec.shape) / np.sqrt(max(spec.shape))).astype(spec.dtype)


def profile_times(graph: StepGraph, *, steps: int = 3, inplace: bool = True, order: str = "auto",
                  clock: str | None = None, device: str = "cpu", threads: int | None = None) -> tuple[TimeModel, str]:
    """Plan `graph` (after realize / interleave) without recomputation as the step will be
    planned (`order`; best-fit offsets: kernel times depend on where their buffers lie and
    on the allocator's state, so the profiled plan should be the one that runs), run two
    warm-up steps and `steps` timed steps with a clock around every kernel; the least seconds of each
    node (what the kernel costs when nothing else competes for the machine), scaled so that
    they add up to the fastest whole step (the step's own costs spread over its nodes); a step of
    LONG_STEP seconds or more is profiled from its first run alone, unscaled. `clock`:
    "wall", or "cpu" (this process's CPU time: robust on a shared machine with one BLAS
    thread). `device`: where the kernels run (cuda: CuPy, wall clock, the device synchronised
    around every kernel). `threads`: the thread count the run will use (onnxplan.threads; None:
    every available core): the kernels are timed at it, and profiles are cached per graph
    (its fingerprint) and thread count, in this process and on disk (see the module's
    docstring: a later process reuses the profile without running a kernel). Returns (time model,
    note); a step our kernels cannot run falls back to the FLOP estimate, and the note says why."""
    xp = array_module(device)
    clock = "wall" if xp is not np else (clock or DEFAULT_CLOCK)  # a GPU's time is not this process's CPU
    sync = (lambda: None) if xp is np else xp.cuda.Device().synchronize
    order = "auto" if order == "ilp" else order
    n_threads = resolve_threads(threads)
    key = (graph.fingerprint(), inplace, steps, clock, order, device, n_threads)
    if key in _CACHE:
        return _CACHE[key]
    disk = profile_cache_path(key, xp)
    cached = _read_entry(disk)
    if cached is not None:
        _CACHE[key] = cached
        return cached
    use_threads(n_threads)
    try:
        out = plan_step(graph, PlanOptions(order=order, planner="best-fit", inplace=inplace))
        skip = _no_room(out.plan.peak_bytes + sum(graph.values[i].nbytes for i in graph.inputs), xp)
        if skip:  # never allocate what does not fit: the plan may be exactly what makes it fit
            return TimeModel(), f"profile skipped ({skip}); FLOP estimate used"
        ex = Executor(out.graph, out.plan, xp=xp)
        params = {p: np.asarray(graph.initializers[p]) if p in graph.initializers else _stand_in(graph, p)
                  for p in ex.classes["parameter"]}
        ex.load_state(params)
        batch = {k: v for k, v in step_data(out.graph).items() if k in ex.feeds}
        ex.arena.data.fill(0)  # the arena's first touches now, not inside the first kernels' times
        tick = time.process_time if clock == "cpu" else time.perf_counter
        first = ex.timed_nodes(batch, tick)[1]  # a warm-up (BLAS start-up, the allocator's state)...
        sync()
        long_step = sum(first.values()) >= LONG_STEP  # ... or, for a long step, the profile itself
        samples: dict[str, list[float]] = {name: [s] for name, s in first.items()} if long_step else {}
        whole: list[float] = []
        if not long_step:
            ex.step(batch)
        for _ in range(0 if long_step else max(1, steps)):
            for name, s in ex.timed_nodes(batch, tick)[1].items():
                samples.setdefault(name, []).append(s)
            sync()
            t0 = tick()
            ex.step(batch)  # the same step untimed inside: what a step costs in full
            sync()
            whole.append(tick() - t0)
    except (OnnxplanError, KeyError, ValueError, RuntimeError, MemoryError) as exc:
        return TimeModel(), f"profile failed ({type(exc).__name__}: {exc}); FLOP estimate used"
    measured = {name: min(ts) for name, ts in samples.items()}  # the fastest: others share the machine
    # the step's own costs (feeding, the loop, write-backs) spread over the nodes in proportion
    scale = min(whole) / max(sum(measured.values()), 1e-12) if whole else 1.0
    measured = {name: t * scale for name, t in measured.items()}
    for _, n in ex.views:
        measured[n.name] = 0.0
    total = sum(measured.values())
    _CACHE[key] = (TimeModel(measured=measured, source="profile"),
                   f"profile ({clock} clock, {device}, {n_threads} threads): {len(measured)} nodes, {total * 1e3:.1f} ms per step")
    _write_entry(disk, measured, _CACHE[key][1])
    return _CACHE[key]


def _disk_key(key: tuple, xp) -> dict:
    """Everything a profile's times depend on: `key` (fingerprint, inplace, steps, clock, order,
    device, threads) and the versions, kernel switches and processor that ran the kernels."""
    from importlib.metadata import PackageNotFoundError, version

    from onnxplan._version import __version__
    from onnxplan.kernels import _torch, parallel
    from onnxplan.threads import WAIT_POLICY_ENV

    def pkg(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "-"

    fingerprint, inplace, steps, clock, order, device, threads = key
    return {"format": _FORMAT, "onnxplan": __version__, "numpy": np.__version__, "torch": pkg("torch"),
            "fingerprint": fingerprint, "inplace": inplace, "steps": steps, "clock": clock, "order": order,
            "device": device, "threads": threads, "processor": _processor(xp),
            "kernels": {"torch": _torch.enabled(), "bind": settings.current().bind_kernels,
                        "native": settings.current().native_kernels,
                        "parallel_min_elems": parallel.MIN_ELEMS,
                        "omp_wait_policy": os.environ.get(WAIT_POLICY_ENV, "default")}}


def _processor(xp) -> str:
    """The model of what runs the kernels: the GPU's name (cuda), else the CPU's (/proc/cpuinfo)."""
    if xp is not np:
        with contextlib.suppress(Exception):
            props = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)
            name = props["name"]
            return name.decode() if isinstance(name, bytes) else str(name)
        return "gpu ?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{platform.machine()} {line.partition(':')[2].strip()}"
    return f"{platform.machine()} {platform.processor()}"


def profile_cache_path(key: tuple, xp=np) -> Path | None:
    """The disk cache's file for a profile's `key` (profile_times' in-process key); None when
    the cache is turned off (ONNXPLAN_PROFILE_CACHE=off)."""
    if not settings.current().profile_cache:
        return None
    from onnxplan.loading.artifacts import default_cache_dir

    text = json.dumps(_disk_key(key, xp), sort_keys=True)
    return default_cache_dir() / "profiles" / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.json"


def _read_entry(path: Path | None) -> tuple[TimeModel, str] | None:
    """A stored profile, or None (none stored, turned off, or unreadable: a miss)."""
    if path is None:
        return None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        entry = json.loads(path.read_text())
        measured = {str(k): float(v) for k, v in entry["measured"].items()}
        if entry["format"] == _FORMAT and measured:
            return TimeModel(measured=measured, source="profile"), f"{entry['note']} (cached {entry['made']})"
    return None


def _write_entry(path: Path | None, measured: dict[str, float], note: str) -> None:
    """Store a profile at `path` whole (a temporary file renamed over it); a cache folder that
    cannot be written is skipped silently (the profile is only not reused)."""
    if path is None:
        return
    import tempfile

    entry = {"format": _FORMAT, "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "note": note,
             "measured": measured}
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f)
            os.replace(tmp, path)
        except OSError:
            os.unlink(tmp)
            raise


def _no_room(need: int, xp) -> str:
    """Why a profile run of `need` bytes (its plain plan and step data) cannot run here: more
    than the memory available (host: MemAvailable or the cgroup's room; GPU: its free memory);
    "" when it fits or availability is unknown."""
    from onnxplan.hostmem import available_bytes
    from onnxplan.sizes import format_bytes

    room = available_bytes() if xp is np else int(xp.cuda.Device().mem_info[0])
    if room is None or need <= room:
        return ""
    return f"the plain step needs {format_bytes(need)}, more than the {format_bytes(room)} available"


_CACHE: dict[tuple, tuple[TimeModel, str]] = {}  # one profile per graph and process
