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

import errno
import mmap
import os
import queue
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

import onnxplan.swap.kernels  # noqa: F401  (declares the swap nodes' kernels)
from onnxplan.errors import ModelError, OnnxplanError, UsageError
from onnxplan.ir.graph import StepGraph
from onnxplan.plan import Plan

__all__ = ["SwapIOError", "SwapRuntime", "SwapStats", "SwapStore", "SwapWorker", "fs_type"]

PAGE = 4096
DIRECT_CHUNK = 512 << 10  # O_DIRECT transfers go through a bounce block this large (its RSS)
SETTLE_CHUNK = 1 << 20  # an idle worker settles this much at a time, then looks for work
_SYNC_RANGE = 1 | 2 | 4  # SYNC_FILE_RANGE_WAIT_BEFORE | WRITE | WAIT_AFTER


def _sync_file_range():
    """libc's sync_file_range (Linux), or None."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def fs_type(path: str | Path) -> str:
    """The file-system type holding `path` (from /proc/mounts; "" when unknown)."""
    path = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                inside = len(parts) > 2 and (path == parts[1] or path.startswith(parts[1].rstrip("/") + "/"))
                if inside and len(parts[1]) >= len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def _open_direct(path: str) -> int | None:
    """`path` opened again with O_DIRECT (bypassing the page cache), or None where the
    platform or the file system has no such flag (tmpfs refuses it)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_RDWR | flag)
    except OSError:
        return None


def _default_parent() -> str:
    """The temporary folder, unless it lives in RAM (tmpfs): then /var/tmp when that does not."""
    tmp = tempfile.gettempdir()
    if fs_type(tmp) in ("tmpfs", "ramfs") and os.path.isdir("/var/tmp") and \
            fs_type("/var/tmp") not in ("tmpfs", "ramfs"):
        return "/var/tmp"
    return tmp


class SwapIOError(OnnxplanError):
    """The swap file cannot be written or read: no room on --swap-dir (ENOSPC, a quota) or an
    I/O error. Exit 2: the folder is unusable; pick another with --swap-dir."""


def _io_error(exc: OSError, folder: str, what: str) -> SwapIOError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return SwapIOError(f"--swap-dir {folder}: no room for the swap file ({what}: {os.strerror(exc.errno)}); "
                           "free space or give another folder with --swap-dir")
    return SwapIOError(f"--swap-dir {folder}: swap file I/O failed ({what}: {exc.strerror or exc})")


class SwapStore:
    """Slots of bytes in one unlinked file. `slots`: slot name -> bytes."""

    def __init__(self, slots: dict[str, int], folder: str | Path | None = None, *, drop_cache: bool = True) -> None:
        if folder is not None and not Path(folder).is_dir():
            raise UsageError(f"--swap-dir {folder}: no such folder")
        own = folder is None
        where = Path(tempfile.mkdtemp(prefix="onnxplan-swap-", dir=_default_parent())) if own else Path(folder)
        try:
            fd, path = tempfile.mkstemp(prefix="onnxplan-swap-", suffix=".bin", dir=where)
        except OSError as exc:
            raise UsageError(f"--swap-dir {where}: cannot create the swap file ({exc.strerror})") from None
        dfd = _open_direct(path) if drop_cache else None
        os.unlink(path)  # the file lives as long as fd is open, and not a moment longer
        if own:
            os.rmdir(where)
        self.fd = fd
        self.folder = str(where)
        self.fs = fs_type(where)
        self.drop_cache = drop_cache
        self.offsets: dict[str, int] = {}
        self.sizes = dict(slots)
        end = 0
        for name, nbytes in slots.items():
            self.offsets[name] = end
            end += -(-nbytes // PAGE) * PAGE
        self.nbytes = end
        try:
            os.posix_fallocate(fd, 0, max(end, 1))
        except OSError as exc:  # a file system without it: a sparse file, flushes then write metadata
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                os.close(fd)
                raise _io_error(exc, self.folder, f"reserving {end} bytes") from None
            os.ftruncate(fd, end)
        self.bounce = None  # O_DIRECT: an aligned block the bytes pass through, DIRECT_CHUNK at a time
        if dfd is not None:
            self.bounce = mmap.mmap(-1, DIRECT_CHUNK)
            try:  # the file system may accept the flag and refuse the I/O (EINVAL): then buffered
                os.pwrite(dfd, memoryview(self.bounce)[:PAGE], 0)
                os.close(fd)
                self.fd = fd = dfd
            except OSError:
                os.close(dfd)
                self.bounce = None
        if drop_cache and self.bounce is None:  # no readahead: it would pull the next slots into the page cache
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        self._sync = _sync_file_range()
        self.unsettled: list[tuple[int, int, bool]] = []  # ranges (offset, bytes, written) to settle
        self.cache_policy = ("sync_file_range + posix_fadvise(DONTNEED)" if self._sync else
                             "fdatasync + posix_fadvise(DONTNEED)") if drop_cache else "page cache kept"
        if self.bounce is not None:
            self.cache_policy = f"O_DIRECT (no page cache; {DIRECT_CHUNK >> 10} KiB bounce block)"
        self._closer = weakref.finalize(self, os.close, fd)

    @property
    def direct(self) -> bool:
        return self.bounce is not None

    def _direct(self, write: bool, off: int, view: memoryview) -> None:
        """Move `view` to (write) or from the file at `off` through the bounce block."""
        bounce = memoryview(self.bounce)
        done = 0
        while done < len(view):
            k = min(DIRECT_CHUNK, len(view) - done)
            span = -(-k // PAGE) * PAGE  # whole blocks: slots are page-aligned and page-rounded
            if write:
                bounce[:k] = view[done:done + k]
                if os.pwrite(self.fd, bounce[:span], off + done) != span:
                    raise OSError(errno.EIO, "short direct write")
            else:
                if os.preadv(self.fd, [bounce[:span]], off + done) < k:
                    raise OSError(errno.EIO, "short direct read")
                view[done:done + k] = bounce[:k]
            done += k

    def _drop(self, off: int, nbytes: int, written: bool) -> None:
        if not self.drop_cache or self.direct:
            return
        nbytes = -(-nbytes // PAGE) * PAGE  # whole pages (a slot is page-rounded): DONTNEED skips a partial one
        if written and (self._sync is None or self._sync(self.fd, off, nbytes, _SYNC_RANGE) != 0):
            os.fdatasync(self.fd)
        os.posix_fadvise(self.fd, off, nbytes, os.POSIX_FADV_DONTNEED)

    def write(self, slot: str, data: np.ndarray, *, settle: bool = True) -> None:
        """Store `data` (1-D uint8, the slot's size) in `slot`; its pages then leave RAM, at
        once or (settle False) at the next settle()."""
        off, view = self.offsets[slot], memoryview(data)
        done = 0
        try:
            if self.direct:
                self._direct(True, off, view)
                return
            while done < len(view):
                done += os.pwrite(self.fd, view[done:], off + done)
        except OSError as exc:
            raise _io_error(exc, self.folder, f"writing {slot!r}") from None
        if settle:
            self._drop(off, len(view), True)
        elif self.drop_cache:
            if self._sync is not None:
                self._sync(self.fd, off, len(view), 2)  # SYNC_FILE_RANGE_WRITE: start, no wait
            self.unsettled.append((off, len(view), True))

    def settle(self, until: Callable[[], bool] | None = None) -> None:
        """Wait for the write-back of every unsettled write, drop its pages and those of the
        unsettled reads (pages still in flight when a read returned); one range at a time,
        stopping early once `until()` is true (work is waiting)."""
        while self.unsettled and not (until is not None and until()):
            off, n, written = self.unsettled.pop(0)
            if until is not None and n > SETTLE_CHUNK:  # a long write-back wait would delay the next job
                self.unsettled.insert(0, (off + SETTLE_CHUNK, n - SETTLE_CHUNK, written))
                n = SETTLE_CHUNK
            self._drop(off, n, written)

    def write_zeros(self, slot: str) -> None:
        """Fill `slot` with zero bytes, a small block at a time (no slot-sized buffer)."""
        if self.direct:
            self.bounce[:] = bytes(DIRECT_CHUNK)
            view = memoryview(self.bounce)
            try:
                for done in range(0, self.sizes[slot], DIRECT_CHUNK):
                    os.pwrite(self.fd, view[:min(DIRECT_CHUNK, -(-(self.sizes[slot] - done) // PAGE) * PAGE)],
                              self.offsets[slot] + done)
            except OSError as exc:
                raise _io_error(exc, self.folder, f"writing {slot!r}") from None
            return
        zeros = np.zeros(min(self.sizes[slot], 1 << 16), np.uint8)
        done = 0
        while done < self.sizes[slot]:
            n = min(len(zeros), self.sizes[slot] - done)
            try:
                os.pwrite(self.fd, memoryview(zeros)[:n], self.offsets[slot] + done)
            except OSError as exc:
                raise _io_error(exc, self.folder, f"writing {slot!r}") from None
            done += n
        self._drop(self.offsets[slot], self.sizes[slot], True)

    def read(self, slot: str, out: np.ndarray, *, settle: bool = True) -> None:
        """Read `slot` into `out` (1-D uint8, the slot's size), bypassing any copy; its pages
        are dropped at once and (settle False) once more at the next settle()."""
        off, view = self.offsets[slot], memoryview(out)
        if self.direct:
            self._direct(False, off, view)
            return
        done = 0
        while done < len(view):
            got = os.preadv(self.fd, [view[done:]], off + done)
            if got <= 0:
                raise OSError(f"swap store: short read of slot {slot!r}")
            done += got
        self._drop(off, len(view), False)
        if not settle and self.drop_cache:
            self.unsettled.append((off, len(view), False))

    def close(self) -> None:
        self._closer()

    @property
    def closed(self) -> bool:
        return not self._closer.alive


@dataclass
class Job:
    kind: str  # "write" | "read"
    slot: str
    view: Any  # 1-D uint8 arena bytes
    eo: int
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    seconds: float = 0.0


def _host(view: Any) -> tuple[np.ndarray, Any]:
    """A host uint8 array for `view` and how to copy it back (cupy views go through the host)."""
    if isinstance(view, np.ndarray):
        return view, None
    host = view.get()
    return host, (lambda h: view.set(h))


class SwapWorker(threading.Thread):
    """Runs store jobs one at a time, in the order they were put."""

    def __init__(self, store: SwapStore) -> None:
        super().__init__(name="onnxplan-swap-io", daemon=True)
        self.store = store
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.busy_seconds = 0.0
        self.cpu_seconds = 0.0  # the worker thread's own CPU time (copies, flushes): what competes with kernels
        # the first failure of a settle (write-back, page drop): every later job fails with it,
        # so no wait blocks on a worker that can no longer vouch for the file
        self.failure: BaseException | None = None

    def put(self, job: Job) -> Job:
        self.jobs.put(job)
        return job

    def run(self) -> None:
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
                job.error = self.failure
                job.done.set()
                continue
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                host, back = _host(job.view)
                if job.kind == "write":
                    self.store.write(job.slot, host, settle=False)
                else:
                    self.store.read(job.slot, host, settle=False)
                    if back is not None:
                        back(host)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                job.error = exc
            job.seconds = time.perf_counter() - t0
            self.busy_seconds += job.seconds
            self.cpu_seconds += time.thread_time() - c0
            job.done.set()

    def _settle(self, until: Callable[[], bool] | None = None) -> None:
        if self.failure is not None:
            return
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            self.store.settle(until)
        except BaseException as exc:  # noqa: BLE001 - handed to every later job
            self.failure = exc
        self.busy_seconds += time.perf_counter() - t0
        self.cpu_seconds += time.thread_time() - c0

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


def _shutdown(worker: SwapWorker, store: SwapStore) -> None:
    if worker.is_alive():
        worker.stop()
    store.close()


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
        self.worker = SwapWorker(self.store)
        self.worker.start()
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
        prefetched = {root for _, _, root in self.ins.values()}
        for k, c in enumerate(calls):
            name = c.node.name
            if name in self.outs:
                fn = self._swap_out(name)
            elif name in self.ins:
                fn = self._swap_in(name)
            else:
                fn = c.fn
            tr = self.binding.transient
            waits = sorted({tr[i] for i in c.node.inputs if i in tr and tr[i] in prefetched})
            if name in self.outs or name in self.ins:
                waits = []
            if waits or issue_at.get(k):
                fn = self._hooked(fn, waits, issue_at.get(k, []))
            c.fn = fn

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
        if isinstance(job.error, OnnxplanError):
            raise job.error
        if isinstance(job.error, OSError):
            raise _io_error(job.error, self.store.folder, f"{job.kind} of {job.slot!r}") from job.error
        if job.error is not None:
            raise RuntimeError(f"swap {job.kind} of {job.slot!r} failed: {job.error}") from job.error

    # ---- steps and state ---------------------------------------------------------------
    def end_step(self) -> None:
        """Every transfer of the step is done (the plan consumed them all); roll the stats."""
        for job in [*self.pending_reads.values(), *self.pending_writes.values()]:
            self._wait(job)
        self.pending_reads.clear()
        self.pending_writes.clear()
        self.stats.io_seconds = self.worker.busy_seconds - self._busy
        self._busy = self.worker.busy_seconds
        self.stats.io_cpu_seconds = self.worker.cpu_seconds - self._cpu
        self._cpu = self.worker.cpu_seconds
        self.history.append(self.stats)
        self.stats = SwapStats()

    def load_state(self, params: dict[str, np.ndarray], optimizer_state: dict[str, np.ndarray] | None = None) -> None:
        """Initial state of the evicted persistent values into their slots (their home):
        parameters from `params`, optimizer state from `optimizer_state` or zero."""
        optimizer_state = optimizer_state or {}
        self._wait(self.worker.put(Job("settle", "", None, -1)))  # the worker is idle after it
        for slot, (vclass, spec) in self.state.items():
            source = params if vclass == "parameter" else optimizer_state
            if vclass != "parameter" and slot not in source:
                self.store.write_zeros(slot)  # no slot-sized zero array: it would count in RSS
                continue
            if slot not in source:
                raise ModelError(f"no initial value for parameter {slot!r}")
            data = np.ascontiguousarray(np.asarray(source[slot]).reshape(spec.shape), dtype=spec.dtype)
            self.store.write(slot, data.reshape(-1).view(np.uint8))
        self.history.clear()
        self.stats = SwapStats()

    def parameters(self, vclass_wanted: str = "parameter") -> dict[str, np.ndarray]:
        """Evicted parameters (or values of another persistent class), read back from their slots."""
        self._wait(self.worker.put(Job("settle", "", None, -1)))
        out = {}
        for slot, (vclass, spec) in self.state.items():
            if vclass == vclass_wanted:
                data = np.empty(spec.shape, dtype=spec.dtype)
                self.store.read(slot, data.reshape(-1).view(np.uint8))
                out[slot] = data
        return out

    def summary(self) -> dict:
        """Per-step accounting of the steps since the state was loaded, and their totals."""
        steps = [s.as_dict() for s in self.history]
        total = {k: sum(s[k] for s in steps) for k in SwapStats().as_dict()}
        return {"steps": steps, "total": total, "store_bytes": self.store.nbytes, "store_fs": self.store.fs,
                "store_folder": self.store.folder, "cache": self.store.cache_policy}

    def close(self) -> None:
        self._finalizer()
