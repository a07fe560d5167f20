"""Swap I/O: a file-backed swap store and a background worker moving bytes in EO order.

The store is one file, unlinked right after it is created (its folder too, when it is a
temporary one), so a killed run leaves nothing behind. Bytes move with pwrite / preadv
between the file and the arena's own views, never through mmap: mapped file pages would
count in RSS. Where the file system allows it the file is opened with O_DIRECT: the bytes go
through one page-aligned bounce block (DIRECT_CHUNK, the only memory the store adds) straight
to the device and back, with no page cache at all, which costs the I/O thread about a third
of the CPU of the buffered path below (a copy into the cache, its write-back and its drop) and
halves the transfer time on this project's machine. Otherwise (tmpfs, no O_DIRECT), so that
the page cache neither hides swapped bytes in RAM nor inflates the figures, written pages are flushed (sync_file_range, waiting for the write-back; fdatasync
where libc lacks it) and dropped with posix_fadvise(DONTNEED); read pages are dropped right
after the read. The worker starts a write's write-back at once but settles it (waits and
drops) only when it has no job waiting, a MiB at a time, looking for work in between, so
a prefetch waits for at most one MiB's write-back (a settle job, as before reading the
state back, settles everything). The file's blocks are allocated
up front (posix_fallocate), so a flush writes data only, no metadata, and read-ahead is off
(POSIX_FADV_RANDOM), so a read brings no neighbouring slot into the page cache.

The worker runs jobs in the order the executor issues them, which is EO order: a write
starts right after the swapped buffer's last use before the gap, a read (prefetch) at its
SwapIn node. The executor waits only when a job is late: at a SwapOut node for its write
(the memory is reused after it), before the first node that reads a prefetched buffer for
its read. Each wait that blocks counts as a stall, with its seconds.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import onnxplan.swap.kernels  # noqa: F401  (declares the swap nodes' kernels)
from onnxplan.errors import OnnxplanError
from onnxplan.ir.graph import StepGraph
from onnxplan.passes.lifetimes import SCRATCH_PREFIX
from onnxplan.plan import Plan
from onnxplan.swap.store import DIRECT_CHUNK, PAGE, SETTLE_CHUNK, SwapIOError, SwapStore, _io_error, fs_type  # noqa: F401  (the store, re-exported for the runtime's users)

__all__ = ["SwapIOError", "SwapRuntime", "SwapStats", "SwapStore", "SwapWorker", "fs_type"]

@dataclass
class Job:
    kind: str  # "write" | "read"
    slot: str
    view: Any  # 1-D uint8 arena bytes
    eo: int
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    failed: str = ""  # what failed, when error is set: this job, or the earlier failure that refused it
    seconds: float = 0.0

    @property
    def what(self) -> str:
        return "settle of the written pages" if self.kind == "settle" else f"{self.kind} of {self.slot!r}"


def _host(view: Any) -> tuple[np.ndarray, Any]:
    """A host uint8 array for `view` and how to copy it back (cupy views go through the host)."""
    if isinstance(view, np.ndarray):
        return view, None
    host = view.get()
    return host, (lambda h: view.set(h))


SCHEDSTAT = "/proc/thread-self/schedstat"  # Linux: the calling thread's CPU time, run-queue wait, slices


class RunDelay:
    """Seconds the thread that made it has waited, runnable, for a CPU (Linux's run delay: the
    second field of `path`, in ns; read from the thread it measures). 0 where the kernel does
    not say. The swap store's kept estimate learns from transfers less this wait: on a machine
    other processes load, a transfer's wall time holds their turns on the cores, not the disk's."""

    def __init__(self, path: str = SCHEDSTAT) -> None:
        try:
            self.fd: int | None = os.open(path, os.O_RDONLY)
        except OSError:
            self.fd = None

    def seconds(self) -> float:
        if self.fd is None:
            return 0.0
        try:
            return int(os.pread(self.fd, 128, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class SwapWorker(threading.Thread):
    """Runs store jobs one at a time, in the order they were put."""

    def __init__(self, store: SwapStore) -> None:
        super().__init__(name="onnxplan-swap-io", daemon=True)
        self.store = store
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.busy_seconds = 0.0
        self.cpu_seconds = 0.0  # the worker thread's own CPU time (copies, flushes): what competes with kernels
        # the first failure of a transfer or a settle (write-back, page drop) and what failed:
        # every later job fails with it, so no wait blocks on a worker that can no longer vouch
        # for the file, and no step runs on the bytes of a transfer that did not happen
        self.failure: BaseException | None = None
        self.failed = ""
        self.bytes_moved = 0  # by the transfers done: with busy_seconds, the store's bandwidth as this run saw it
        self.queued_seconds = 0.0  # of busy_seconds, waited for a CPU (RunDelay: other processes' load)
        self._delay: RunDelay | None = None

    def put(self, job: Job) -> Job:
        self.jobs.put(job)
        return job

    def run(self) -> None:
        self._delay = RunDelay()
        try:
            self._serve()
        finally:
            self._delay.close()

    def _serve(self) -> None:
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:  # idle: settle the written pages until work comes, then wait for it
                self._settle(until=lambda: not self.jobs.empty())
                job = self.jobs.get()
            if job is None:
                self._settle()
                return
            if job.kind == "settle":
                self._settle()
            if job.kind == "settle" or self.failure is not None:
                job.error, job.failed = self.failure, self.failed
                job.done.set()
                continue
            t0, c0, q0 = time.perf_counter(), time.thread_time(), self._queued()
            try:
                host, back = _host(job.view)
                if job.kind == "write":
                    self.store.write(job.slot, host, settle=False)
                else:
                    self.store.read(job.slot, host, settle=False)
                    if back is not None:
                        back(host)
                self.bytes_moved += host.size
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, and to every later job
                job.error, job.failed = exc, job.what
                self.failure, self.failed = exc, job.what
            job.seconds = time.perf_counter() - t0
            self.busy_seconds += job.seconds
            self.cpu_seconds += time.thread_time() - c0
            self.queued_seconds += self._queued() - q0
            job.done.set()

    def _queued(self) -> float:
        return 0.0 if self._delay is None else self._delay.seconds()

    def _settle(self, until: Callable[[], bool] | None = None) -> None:
        if self.failure is not None:
            return
        t0, c0, q0 = time.perf_counter(), time.thread_time(), self._queued()
        try:
            self.store.settle(until)
        except BaseException as exc:  # noqa: BLE001 - handed to every later job
            self.failure, self.failed = exc, "the write-back of the written pages"
        self.busy_seconds += time.perf_counter() - t0
        self.cpu_seconds += time.thread_time() - c0
        self.queued_seconds += self._queued() - q0

    def stop(self) -> None:
        self.jobs.put(None)
        self.join()


@dataclass
class SwapStats:
    """Swap accounting of one step."""

    bytes_out: int = 0
    bytes_in: int = 0
    writes: int = 0
    reads: int = 0
    stalls: int = 0  # waits that blocked: a late prefetch or a late write
    stall_seconds: float = 0.0
    io_seconds: float = 0.0  # the worker's busy time
    io_cpu_seconds: float = 0.0  # the worker thread's CPU time

    def as_dict(self) -> dict:
        return dict(self.__dict__)


# While a swap runtime is open the interpreter switches threads every SWITCH_SECONDS (default
# 5 ms): the I/O worker takes the interpreter lock back after each system call of a transfer,
# and with the default a compute thread running Python code between kernels kept it waiting
# (transformer b16, a paging plan moving 13 MB a step: the worker's busy time 10.4-12.9 ms ->
# 6.7-7.2 ms a step, its stalls 1.2-2.4 -> 0.5-0.8 ms at 0.2 ms). The interval is the whole
# interpreter's (CPython has no per-thread one), so it is held, not set: every open runtime holds
# it (counted, under a lock: runtimes may open and close on several threads), the first hold
# saves the interval and lowers it (never raises it), and the last release, at close (also when
# a step failed, when closing fails, or when the runtime is collected unclosed), puts the saved
# value back, unless someone else set another interval meanwhile: theirs stays.
SWITCH_SECONDS = 2e-4
_switch_lock = threading.Lock()
_switch_holds = 0  # open runtimes
_switch_saved = 0.0  # the interval before the first hold
_switch_ours = 0.0  # the interval the first hold set (as the interpreter reports it back)


def _switch_begin() -> None:
    global _switch_holds, _switch_saved, _switch_ours
    with _switch_lock:
        if _switch_holds == 0:
            _switch_saved = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_saved, SWITCH_SECONDS))
            _switch_ours = sys.getswitchinterval()
        _switch_holds += 1


def _switch_end() -> None:
    global _switch_holds
    with _switch_lock:
        if _switch_holds == 0:
            return
        _switch_holds -= 1
        if _switch_holds == 0 and sys.getswitchinterval() == _switch_ours:
            sys.setswitchinterval(_switch_saved)


def _shutdown(worker: SwapWorker, store: SwapStore) -> None:
    try:
        if worker.is_alive():
            worker.stop()
    finally:
        try:
            store.close()
        finally:
            _switch_end()


class SwapRuntime:
    """A plan's swaps bound to its arena: the store, the worker, and the hooks the executor's
    calls run through (see the module docstring). `sync`: every prefetch is waited for at its
    SwapIn node (what --check-arena needs, as it checksums a node's outputs right after it)."""

    def __init__(self, graph: StepGraph, plan: Plan, binding: Any, arena: Any, *,
                 folder: str | Path | None = None, sync: bool = False) -> None:
        planned = {b.name: b for b in plan.buffers}
        self.binding = binding
        self.eo = {name: t for t, name in enumerate(plan.order)}
        self.sync = sync
        nodes = {n.name: n for n in graph.nodes}

        def view(value: str, nbytes: int) -> Any:
            return arena.bytes(planned[binding.transient[value]].offset, nbytes)

        # arena byte range [lo, hi) of every planned buffer (prefetch waits go by overlap: attach)
        self.spans = {b.name: (b.offset, b.offset + b.bytes) for b in plan.buffers}
        self.outs: dict[str, tuple[str, Any, bool, str]] = {}  # node -> slot, bytes, write, last use
        self.ins: dict[str, tuple[str, Any, str]] = {}  # node -> slot, bytes, arena buffer
        self.state: dict[str, tuple[str, Any]] = {}  # evicted persistent slot -> class, spec
        for s in plan.swaps:
            out_node, in_node = nodes[s.out_node], nodes[s.in_node]
            self.outs[s.out_node] = (s.value, view(out_node.inputs[0], s.bytes), s.write, s.last_use)
            self.ins[s.in_node] = (s.value, view(in_node.outputs[0], s.bytes),
                                   binding.transient[in_node.outputs[0]])
            if s.wraps:
                self.state[s.value] = (s.vclass, graph.values[s.value].spec)
        self.store = SwapStore({s.value: s.bytes for s in plan.swaps}, folder)
        self.folder = None if folder is None else str(folder)  # as asked (None: the default folder)
        self.worker = SwapWorker(self.store)
        self.worker.start()
        _switch_begin()
        self._finalizer = weakref.finalize(self, _shutdown, self.worker, self.store)
        self.pending_reads: dict[str, Job] = {}
        self.pending_writes: dict[str, Job] = {}
        self.stats = SwapStats()
        self.history: list[SwapStats] = []
        self._busy = 0.0
        self._cpu = 0.0

    # ---- binding the executor's calls ------------------------------------------------------
    def attach(self, calls: list) -> None:
        """Bind the swap nodes' calls; hook the others: wait for a pending prefetch before a
        node reads its buffer, issue each write right after the swapped buffer's last use."""
        import bisect

        call_eo = [self.eo[c.node.name] for c in calls]
        index = {c.node.name: k for k, c in enumerate(calls)}
        issue_at: dict[int, list[str]] = {}
        last_in: dict[str, int] = {}  # slot -> call index of its latest SwapIn so far
        for k, c in enumerate(calls):
            name = c.node.name
            if name in self.ins:
                last_in[self.ins[name][0]] = k
            elif name in self.outs:
                slot, _, write, last = self.outs[name]
                if write and last:
                    at = max(bisect.bisect_right(call_eo, self.eo[last]) - 1, last_in.get(slot, -1))
                    if 0 <= at < index[name]:
                        issue_at.setdefault(at, []).append(name)
        prefetched = sorted({root for _, _, root in self.ins.values()})
        for k, c in enumerate(calls):
            name = c.node.name
            if name in self.outs:
                fn = self._swap_out(name)
            elif name in self.ins:
                fn = self._swap_in(name)
            else:
                fn = c.fn
            waits = [] if name in self.outs or name in self.ins else self._overlapping(c.node, prefetched)
            if waits or issue_at.get(k):
                fn = self._hooked(fn, waits, issue_at.get(k, []))
            c.fn = fn

    def _overlapping(self, node, prefetched: list[str]) -> list[str]:
        """The prefetched buffers whose arena bytes `node` touches (an input, an output or its
        scratch): their pending reads must land before it runs. By bytes, not by name: a read
        whose value only views read (no call of their own) would otherwise land late, over the
        bytes of whatever the plan puts there next (GPT-2's split LM head under swap)."""
        tr, spans = self.binding.transient, self.spans
        touched = [spans[tr[v]] for v in (*node.inputs, *node.outputs) if v in tr]
        if SCRATCH_PREFIX + node.name in spans:
            touched.append(spans[SCRATCH_PREFIX + node.name])
        return [root for root in prefetched
                if any(lo < spans[root][1] and spans[root][0] < hi for lo, hi in touched)]

    def _hooked(self, fn, waits: list[str], issues: list[str]):
        def run(ctx, inputs, outputs):
            for root in waits:
                job = self.pending_reads.pop(root, None)
                if job is not None:
                    self._wait(job)
            fn(ctx, inputs, outputs)
            for name in issues:
                self._issue_write(name)
        return run

    def _swap_out(self, name: str):
        def run(ctx, inputs, outputs):
            if self.outs[name][2]:  # the memory is reused after this node: the write must be done
                job = self.pending_writes.pop(name, None) or self._issue_write(name, keep=False)
                self._wait(job)
        return run

    def _swap_in(self, name: str):
        slot, view, root = self.ins[name]

        def run(ctx, inputs, outputs):
            job = self.worker.put(Job("read", slot, view, self.eo[name]))
            self.stats.reads += 1
            self.stats.bytes_in += view.size
            if self.sync:
                self._wait(job)
            else:
                self.pending_reads[root] = job
        return run

    def _issue_write(self, name: str, keep: bool = True) -> Job:
        slot, view, _, _ = self.outs[name]
        job = self.worker.put(Job("write", slot, view, self.eo[name]))
        self.stats.writes += 1
        self.stats.bytes_out += view.size
        if keep:
            self.pending_writes[name] = job
        return job

    def _wait(self, job: Job) -> None:
        if not job.done.is_set():
            t0 = time.perf_counter()
            while not job.done.wait(0.5):
                if not self.worker.is_alive():  # cannot happen (the worker catches all); never hang
                    job.error = job.error or RuntimeError("the swap I/O worker stopped")
                    break
            self.stats.stalls += 1
            self.stats.stall_seconds += time.perf_counter() - t0
        if job.error is None:
            return
        if job.failed in ("", job.what):  # this job failed
            if isinstance(job.error, OnnxplanError):
                raise job.error
            what = job.what
        else:  # refused after an earlier failure: a new error naming both, chained to the worker's
            what = f"{job.failed}; the {job.what} after it is refused"
            if isinstance(job.error, OnnxplanError):  # the store's own line (SwapIOError): keep its words
                raise SwapIOError(f"{job.error}; the {job.what} after it is refused") from job.error
        if isinstance(job.error, OSError):
            raise _io_error(job.error, self.store.folder, what) from job.error
        raise RuntimeError(f"swap {what} failed: {job.error}") from job.error

    # ---- steps and state ---------------------------------------------------------------
    def end_step(self) -> None:
        """Every transfer of the step is done (the plan consumed them all); roll the stats. A
        failed transfer raises, after the pending jobs are dropped and the stats rolled."""
        pending = [*self.pending_reads.values(), *self.pending_writes.values()]
        self.pending_reads.clear()
        self.pending_writes.clear()
        try:
            for job in pending:
                self._wait(job)
        finally:
            self._roll_stats()

    def _roll_stats(self) -> None:
        self.stats.io_seconds = self.worker.busy_seconds - self._busy
        self._busy = self.worker.busy_seconds
        self.stats.io_cpu_seconds = self.worker.cpu_seconds - self._cpu
        self._cpu = self.worker.cpu_seconds
        self.history.append(self.stats)
        self.stats = SwapStats()

    def load_state(self, params: Mapping[str, np.ndarray], optimizer_state: Mapping[str, np.ndarray] | None = None) -> None:
        """Initial state of the evicted persistent values into their slots (their home):
        parameters from `params`, optimizer state from `optimizer_state` or zero."""
        optimizer_state = optimizer_state or {}
        self._wait(self.worker.put(Job("settle", "", None, -1)))  # the worker is idle after it
        self.store.write_state(self.state, params, optimizer_state)
        self.history.clear()
        self.stats = SwapStats()

    def parameters(self, vclass_wanted: str = "parameter", names=None) -> dict[str, np.ndarray]:
        """Evicted parameters (or values of another persistent class; only those in `names` when
        given), read back from their slots."""
        self._wait(self.worker.put(Job("settle", "", None, -1)))
        return self.store.read_state(self.state, vclass_wanted, names)

    def summary(self) -> dict:
        """Per-step accounting of the steps since the state was loaded, and their totals."""
        steps = [s.as_dict() for s in self.history]
        total = {k: sum(s[k] for s in steps) for k in SwapStats().as_dict()}
        return {"steps": steps, "total": total, "store_bytes": self.store.nbytes, "store_fs": self.store.fs,
                "store_folder": self.store.folder, "cache": self.store.cache_policy}

    def close(self) -> None:
        """Stop the worker, close the store (its file goes), give the switch interval back; then
        the store's kept bandwidth estimate learns from this runtime's own transfers
        (onnxplan.swap.pricing.record_transfers: its busy time less what it waited for a CPU,
        RunDelay), unless one failed. A runtime collected unclosed records nothing."""
        if not self._finalizer.alive:
            return
        self._finalizer()
        w = self.worker
        if w.failure is None and w.bytes_moved:
            from onnxplan.swap.pricing import record_transfers

            record_transfers(self.folder, w.bytes_moved, w.busy_seconds - w.queued_seconds, w.cpu_seconds)
