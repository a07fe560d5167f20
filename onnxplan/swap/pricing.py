"""One footing for the price of swap transfers, shared by the swap module's prediction, the
adaptive policy and the joint model:

- **the bandwidth of the swap store itself** (onnxplan.swap.store.SwapStore, O_DIRECT
  where the file system allows it): a slot written (flushed, dropped from the page cache, as
  the store settles it) and read back, timed; bytes/s of the round trip (2 x bytes / (write
  seconds + read seconds)). Kept per store (the device the folder lives on, store_key) next to
  the artifact cache (<cache>/swap-bandwidth.json): measured once, then moved by every swapped
  run's own transfers (record_transfers: an exponentially weighted estimate, ESTIMATE_WEIGHT);
  a plan is priced for the folder it will run with (PlanOptions.swap_dir, `--swap-dir`) and
  records the rates (SwapRecord.store); $ONNXPLAN_SWAP_BANDWIDTH (bytes/s) or an explicit
  value overrides it (tests, reproducible plans);
- **one I/O worker** running the transfers first in, first out, as the executor's swap
  runtime does: a write is issued after the buffer's last use and must be done where its
  memory is reused, a read (page-in) is issued at its SwapIn and must be done before its first
  reader; the compute waits (stalls) only when a transfer is late (io_stalls);
- **the I/O thread's CPU**: every byte goes through the store's bounce block (a copy) and a
  system call per block, at the CPU per byte measured with the bandwidth; it is CPU time of
  the process, beside the compute stream;
- **the executor's handling of each transfer** (TRANSFER_SECONDS: the job, the hand-offs
  between the compute thread and the worker), on the compute stream.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from onnxplan import settings
from onnxplan.files import write_atomic
from onnxplan.settings import ENV

__all__ = ["PROBE_BYTES", "SWAP_BANDWIDTH_ENV", "TRANSFER_SECONDS", "StepPrice", "StoreRates", "Transfer", "io_cpu_seconds",
           "io_stalls", "measure_store", "measure_store_bandwidth", "moving_estimate", "plan_transfers", "planned_step",
           "price_outcome", "record_transfers", "store_bandwidth", "store_key", "store_rates", "transfer_seconds"]

SWAP_BANDWIDTH_ENV = ENV["swap_bandwidth"]
PROBE_BYTES = 16 << 20  # bytes the measurement moves each way, per round trip
PROBE_REPEATS = 5
CACHE_NAME = "swap-bandwidth.json"
# the kept estimate of a store moves this far towards each run's own transfers (record_transfers):
# a run counts a quarter, the last ~4 runs most (the store's bandwidth moved 2x within an hour
# on a shared disk; a single slow run moves the estimate by at most a quarter of its time)
ESTIMATE_WEIGHT = 0.25
MIN_OBSERVED_BYTES = 4 << 20  # a run moving less is not counted: its time is per-job overhead
COPY_BANDWIDTH = 5e9  # bytes/s of the bounce-block copy (onnxplan.checkpoint.costs.CPU_NUMPY's memory bandwidth)
CALL_SECONDS = 2e-5  # one pwrite/preadv of a bounce block (system call, O_DIRECT setup)
# CPU of the executor per transfer beyond moving its bytes (the job, the worker's wake-up and the
# compute thread's hand-offs with it under the GIL, the hooks): measured on transformer b16's swap
# plans (21-140 transfers a step, 18-48 MB; CPU step minus the plain CPU step minus the bytes at
# the store's measured CPU per byte: 0.06-0.12 ms per transfer, median 0.095), counted on the
# compute stream
TRANSFER_SECONDS = 9e-5


def transfer_seconds(nbytes: int, bandwidth: float) -> float:
    """Seconds the I/O worker takes to move `nbytes` (either way) at `bandwidth` bytes/s."""
    return nbytes / bandwidth


def io_cpu_seconds(nbytes: int) -> float:
    """CPU seconds of the I/O thread moving `nbytes` once through the store's bounce block."""
    from onnxplan.swap.store import DIRECT_CHUNK

    return nbytes / COPY_BANDWIDTH + -(-nbytes // DIRECT_CHUNK) * CALL_SECONDS


@dataclass(frozen=True)
class Transfer:
    """One transfer of the I/O worker, placed on the boundaries of a step's compute segments
    (boundary t: before segment t runs; len(segments): the step's end): issued at boundary
    `issue` (a write issued after segment a is issued at a + 1), done before segment `wait`
    runs."""

    nbytes: int
    issue: int
    wait: int
    write: bool = False


def io_stalls(seconds: Sequence[float] | np.ndarray, transfers: Sequence[Transfer], bandwidth: float) -> list[float]:
    """Seconds the compute stream waits for each transfer: segments of `seconds` run one after
    the other; one worker moves the transfers first in, first out at `bandwidth`. At each
    boundary, in this order: the writes issued there are queued, the writes due there waited
    for, the reads issued there queued, the reads due there waited for. Everything is done by
    the step's end. Transfers of one kind at one boundary queue in the order given."""
    n = len(seconds)
    at: dict[tuple[int, int], list[int]] = {}  # (boundary, phase) -> transfer indices
    for i, tr in enumerate(transfers):
        if not 0 <= tr.issue <= n or not 0 <= tr.wait <= n:
            raise ValueError(f"transfer {i} outside the step's {n + 1} boundaries: {tr}")
        at.setdefault((tr.issue, 0 if tr.write else 2), []).append(i)
        at.setdefault((min(tr.wait, n), 1 if tr.write else 3), []).append(i)
    ends: dict[int, float] = {}
    stalls = [0.0] * len(transfers)
    now = free = 0.0
    for t in range(n + 1):
        for phase in range(4):
            for i in at.get((t, phase), ()):
                if phase in (0, 2):
                    free = max(now, free) + transfer_seconds(transfers[i].nbytes, bandwidth)
                    ends[i] = free
                elif i in ends and ends[i] > now:
                    stalls[i] += ends[i] - now
                    now = ends[i]
        if t == n:
            for i in sorted(ends, key=ends.__getitem__):
                if ends[i] > now:
                    stalls[i] += ends[i] - now
                    now = ends[i]
            break
        now += seconds[t]
    return stalls


def plan_transfers(graph, order: Sequence[str], swaps) -> list[Transfer]:
    """The transfers of a planned step (its order with swap nodes, its PlannedSwaps) on the
    boundaries of its nodes, where the executor's swap runtime issues and waits for them: a
    read at its SwapIn node, waited for before the first node after it that reads the paged-in
    value; a write right after the buffer's last use, waited for at its SwapOut."""
    eo = {name: t for t, name in enumerate(order)}
    nodes = {nd.name: nd for nd in graph.nodes}
    n = len(order)
    out = []
    for s in swaps:
        if s.write:
            issue = eo[s.last_use] + 1 if s.last_use in eo and eo[s.last_use] < s.out_eo else s.out_eo
            out.append(Transfer(s.bytes, issue, s.out_eo, write=True))
        value = nodes[s.in_node].outputs[0]
        first = next((t for t in range(s.in_eo + 1, n) if value in nodes[order[t]].inputs), n)
        out.append(Transfer(s.bytes, s.in_eo, first))
    out.sort(key=lambda tr: (tr.issue, not tr.write))
    return out


@dataclass(frozen=True)
class StepPrice:
    """A planned step's predicted seconds: `compute` (every node but the swap nodes, once, in
    one stream), `handling` (TRANSFER_SECONDS per transfer, on the compute stream), `stall`
    (what the compute waits for late transfers), `io_cpu` (the I/O thread's CPU moving the
    bytes). seconds (wall): compute + handling + the larger of stall and io_cpu: the I/O
    thread's copies and system calls, under the one interpreter lock and on a machine of few
    cores, delay the compute stream (measured: transformer b16's early-paging plans ran +6%
    over the plain step where compute + handling + stall said +3% and their CPU +6%), except
    while the compute stream waits for a transfer anyway; cpu_seconds: compute + handling +
    io_cpu (the process's CPU time)."""

    compute: float
    stall: float
    io_cpu: float
    moved: int  # bytes written and read
    handling: float = 0.0

    @property
    def seconds(self) -> float:
        return self.compute + self.handling + max(self.stall, self.io_cpu)

    @property
    def cpu_seconds(self) -> float:
        return self.compute + self.handling + self.io_cpu


def planned_step(graph, order: Sequence[str], swaps, node_seconds: Callable, rates: StoreRates | None = None) -> StepPrice:
    """The price of a planned step (`order` with its swap nodes, `swaps` its PlannedSwaps):
    `node_seconds(node)` per node, the transfers where the executor issues and waits for them
    (plan_transfers) on one I/O worker at the store's rates (None: store_rates())."""
    nodes = {nd.name: nd for nd in graph.nodes}
    from onnxplan.passes.split import is_piece_node
    from onnxplan.swap.insert import is_swap_node

    pieces = [nodes[name] for name in order if is_piece_node(nodes[name])]
    if pieces:  # the split pass's transfers run on the compute stream, each at its node
        rates = rates or store_rates()
    piece_bytes = {nd.name: int(nd.attrs["nbytes"]) for nd in pieces}
    seconds = [0.0 if is_swap_node(nodes[name]) else
               transfer_seconds(piece_bytes[name], rates.bandwidth) + io_cpu_seconds(piece_bytes[name])
               if rates is not None and name in piece_bytes else node_seconds(nodes[name]) for name in order]
    if not swaps:
        return StepPrice(sum(seconds), 0.0, 0.0, 0)
    rates = rates or store_rates()
    transfers = plan_transfers(graph, order, swaps)
    moved = sum(tr.nbytes for tr in transfers)
    stall = sum(io_stalls(seconds, transfers, rates.bandwidth))
    return StepPrice(sum(seconds), stall, moved * rates.cpu_per_byte, moved, TRANSFER_SECONDS * len(transfers))


def price_outcome(outcome, times, rates: StoreRates | None = None) -> StepPrice:
    """THE price of a planned outcome (a PlanOutcome: its graph, plan.order, plan.swaps), the one
    every budget decision compares: planned_step with `times.node_seconds(graph, node)` per node
    (a TimeModel: a profile or the FLOP estimate; a recomputed copy costs its original) and the
    swaps' transfers at `rates` (None: the store the plan records, SwapRecord.store, else
    store_rates())."""
    g, plan = outcome.graph, outcome.plan
    if rates is None and plan.swap.store is not None:
        rates = StoreRates.of_record(plan.swap.store)
    return planned_step(g, plan.order, plan.swaps, lambda n: times.node_seconds(g, n), rates)


# -- the store's bandwidth --------------------------------------------------------------------

@dataclass(frozen=True)
class StoreRates:
    """The swap store as measured: bytes/s of a transfer, CPU seconds per byte moved (the I/O
    thread's: the bounce-block copy and the system calls); for the rates store_rates gives, the
    folder they are for (None: the default folder), the store they were kept under (store_key)
    and where they come from: "override" ($ONNXPLAN_SWAP_BANDWIDTH or a value given),
    "measured" (the probe, measure_store) or "estimate" (the moving estimate, record_transfers)."""

    bandwidth: float
    cpu_per_byte: float
    folder: str | None = None
    store: str = ""
    source: str = ""

    def record(self) -> dict:
        """What a plan records of the rates it was priced with (SwapRecord.store)."""
        return {"folder": self.folder, "store": self.store, "bandwidth": self.bandwidth,
                "cpu_per_byte": self.cpu_per_byte, "source": self.source}

    @classmethod
    def of_record(cls, d: dict) -> StoreRates:
        return cls(float(d["bandwidth"]), float(d["cpu_per_byte"]), d.get("folder"), d.get("store", ""),
                   d.get("source", ""))


def measure_store(folder: str | Path | None = None, nbytes: int = PROBE_BYTES, repeats: int = PROBE_REPEATS) -> StoreRates:
    """Round trips through the swap store the executor uses (in `folder`; None: its default
    temporary folder): `nbytes` written and settled (flushed, out of the page cache), then read
    back, `repeats` times after one warm-up; the median bandwidth (2 * nbytes / (write + read
    seconds)) and the median CPU of this thread per byte moved (a shared disk varies a lot)."""
    from onnxplan.swap.store import SwapStore

    store = SwapStore({"probe": nbytes}, folder)
    rates, cpus = [], []
    try:
        data = np.full(nbytes, 7, np.uint8)
        back = np.empty_like(data)
        store.write("probe", data)  # warm the slot's blocks once (allocation, first touch)
        for _ in range(max(1, repeats)):
            t0, c0 = time.perf_counter(), time.thread_time()
            store.write("probe", data)
            store.read("probe", back)
            t1, c1 = time.perf_counter(), time.thread_time()
            rates.append(2 * nbytes / max(t1 - t0, 1e-9))
            cpus.append((c1 - c0) / (2 * nbytes))
    finally:
        store.close()
    return StoreRates(float(np.median(rates)), float(np.median(cpus)))


def measure_store_bandwidth(folder: str | Path | None = None, nbytes: int = PROBE_BYTES) -> float:
    """Bytes/s of a round trip through the swap store (measure_store)."""
    return measure_store(folder, nbytes).bandwidth


def store_key(folder: str | Path | None) -> str:
    """The key the rates of the store in `folder` (None: the executor's default folder) are kept
    under: the device its file system lives on (every folder of one file system shares a disk
    and its rates), with the file-system type; the resolved folder where it cannot be stat'ed."""
    from onnxplan.swap.store import default_parent, fs_type

    path = os.path.realpath(default_parent() if folder is None else folder)
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return path
    return f"dev {os.major(dev)}:{os.minor(dev)} {fs_type(path) or '?'}"


def _cache_path() -> Path:
    return settings.current().cache_dir / CACHE_NAME


def _read_cache(path: Path) -> dict:
    with contextlib.suppress(OSError, ValueError):
        cached = json.loads(path.read_text())
        if isinstance(cached, dict):
            return cached
    return {}


def _cached_rates(entry) -> StoreRates | None:
    if isinstance(entry, dict):
        with contextlib.suppress(KeyError, TypeError, ValueError):
            rates = StoreRates(float(entry["bandwidth"]), float(entry["cpu_per_byte"]))
            if rates.bandwidth > 0 and rates.cpu_per_byte >= 0:
                return rates
    return None


@contextlib.contextmanager
def _locked_cache():
    """The cache file's contents to update under an exclusive lock (a lock file beside it):
    concurrent processes update one after the other, none loses another's update; the file is
    replaced by a complete new one (a temporary file renamed over it), so no reader ever sees a
    half-written file. Nothing is written when the folder cannot be (a read-only cache)."""
    path = _cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_name(path.name + ".lock"), "a")
    except OSError:
        yield {}
        return
    with lock:
        with contextlib.suppress(ImportError, OSError):
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
        cached = _read_cache(path)
        yield cached
        with contextlib.suppress(OSError):
            write_atomic(path, json.dumps(cached, indent=1, sort_keys=True) + "\n")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def moving_estimate(old: StoreRates, bandwidth: float, cpu_per_byte: float, weight: float = ESTIMATE_WEIGHT) -> StoreRates:
    """`old` moved towards an observation (`bandwidth` bytes/s, `cpu_per_byte`) by `weight`:
    exponentially weighted on seconds per byte (what a transfer's time is proportional to, so
    the estimate of a transfer's time is the weighted mean of the observed times), and on CPU
    seconds per byte."""
    seconds_per_byte = (1 - weight) / old.bandwidth + weight / bandwidth
    return StoreRates(1 / seconds_per_byte, (1 - weight) * old.cpu_per_byte + weight * cpu_per_byte)


def record_transfers(folder: str | Path | None, nbytes: int, seconds: float, cpu_seconds: float) -> StoreRates | None:
    """A swap runtime's own transfers through the store in `folder` (None: the default folder):
    `nbytes` moved (written and read) in `seconds` of the I/O worker's busy time (its write-backs
    included, as the probe's round trips include them; the swap runtime passes it less what the
    worker waited for a CPU, executor.swap_io.RunDelay, as the probe runs on a free core) and
    `cpu_seconds` of its CPU. Moves the
    kept estimate of that store (store_key) by ESTIMATE_WEIGHT towards them (the first
    observation of a store is its estimate) and returns it; runs moving less than
    MIN_OBSERVED_BYTES are not counted (None): their time is the jobs' overhead, not the disk's."""
    if nbytes < MIN_OBSERVED_BYTES or not seconds > 0:
        return None
    seen = StoreRates(nbytes / seconds, max(cpu_seconds, 0.0) / nbytes)
    key = store_key(folder)
    with _locked_cache() as cached:
        entry = cached.get(key)
        old = _cached_rates(entry)
        rates = seen if old is None else moving_estimate(old, seen.bandwidth, seen.cpu_per_byte)
        runs = (entry.get("runs", 0) if isinstance(entry, dict) and isinstance(entry.get("runs", 0), int) else 0) + 1
        cached[key] = {**(entry if isinstance(entry, dict) else {}), "bandwidth": rates.bandwidth,
                       "cpu_per_byte": rates.cpu_per_byte, "folder": str(folder or ""), "runs": runs,
                       "updated": _now(), "last_run": {"bytes": nbytes, "seconds": seconds,
                                                       "bandwidth": seen.bandwidth}}
    return rates


def store_rates(folder: str | Path | None = None, *, override: float | None = None,
                refresh: bool = False) -> StoreRates:
    """The swap store in `folder` (None: the executor's default folder): the bandwidth
    `override` if given, else $ONNXPLAN_SWAP_BANDWIDTH (bytes/s), both with the modelled CPU
    cost (io_cpu_seconds); else the kept estimate of that folder's store (store_key: measured
    once, then moved by every swapped run's own transfers, record_transfers), else measured now
    (measure_store) and kept. `refresh`: measure again (the measurement becomes the estimate)."""
    folder = None if folder is None else str(folder)
    if override is None:
        env = settings.current().swap_bandwidth
        if env:
            from onnxplan.errors import UsageError

            try:
                override = float(env)
            except ValueError:
                override = 0.0
            if not override > 0:
                raise UsageError(f"invalid ${SWAP_BANDWIDTH_ENV} {env!r}: expected bytes/s > 0 (e.g. 2e8)")
    if override is not None:
        if not override > 0:
            raise ValueError(f"swap bandwidth must be > 0 bytes/s, got {override}")
        return StoreRates(float(override), io_cpu_seconds(PROBE_BYTES) / PROBE_BYTES, folder, "", "override")
    key = store_key(folder)
    entry = _read_cache(_cache_path()).get(key)
    rates = None if refresh else _cached_rates(entry)
    if rates is not None:
        source = "estimate" if isinstance(entry, dict) and entry.get("runs") else "measured"
        return replace(rates, folder=folder, store=key, source=source)
    rates = measure_store(folder)
    with _locked_cache() as cached:
        cached[key] = {"bandwidth": rates.bandwidth, "cpu_per_byte": rates.cpu_per_byte, "folder": str(folder or ""),
                       "measured": _now()}
    return replace(rates, folder=folder, store=key, source="measured")


def store_bandwidth(folder: str | Path | None = None, *, override: float | None = None,
                    refresh: bool = False) -> float:
    """Bytes/s of the swap store in `folder` (store_rates)."""
    return store_rates(folder, override=override, refresh=refresh).bandwidth
