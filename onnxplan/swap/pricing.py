"""One footing for the price of swap transfers, shared by the swap module's prediction, the
adaptive policy and the joint model:

- **the bandwidth of the swap store itself** (onnxplan.swap.store.SwapStore, O_DIRECT
  where the file system allows it): a slot written (flushed, dropped from the page cache, as
  the store settles it) and read back, timed; bytes/s of the round trip (2 x bytes / (write
  seconds + read seconds)). Measured once per store folder and cached next to the artifact
  cache (<cache>/swap-bandwidth.json); $ONNXPLAN_SWAP_BANDWIDTH (bytes/s) or an explicit
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["PROBE_BYTES", "SWAP_BANDWIDTH_ENV", "TRANSFER_SECONDS", "StoreRates", "Transfer", "io_cpu_seconds", "io_stalls",
           "measure_store", "measure_store_bandwidth", "StepPrice", "plan_transfers", "planned_step", "store_bandwidth",
           "store_rates", "transfer_seconds"]

SWAP_BANDWIDTH_ENV = "ONNXPLAN_SWAP_BANDWIDTH"
PROBE_BYTES = 16 << 20  # bytes the measurement moves each way, per round trip
PROBE_REPEATS = 5
CACHE_NAME = "swap-bandwidth.json"
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


def io_stalls(seconds: Sequence[float], transfers: Sequence[Transfer], bandwidth: float) -> list[float]:
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
            for i in sorted(ends, key=ends.get):
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
    from onnxplan.swap.insert import is_swap_node

    seconds = [0.0 if is_swap_node(nodes[name]) else node_seconds(nodes[name]) for name in order]
    if not swaps:
        return StepPrice(sum(seconds), 0.0, 0.0, 0)
    rates = rates or store_rates()
    transfers = plan_transfers(graph, order, swaps)
    moved = sum(tr.nbytes for tr in transfers)
    stall = sum(io_stalls(seconds, transfers, rates.bandwidth))
    return StepPrice(sum(seconds), stall, moved * rates.cpu_per_byte, moved, TRANSFER_SECONDS * len(transfers))


# -- the store's bandwidth --------------------------------------------------------------------

@dataclass(frozen=True)
class StoreRates:
    """The swap store as measured: bytes/s of a transfer, CPU seconds per byte moved (the I/O
    thread's: the bounce-block copy and the system calls)."""

    bandwidth: float
    cpu_per_byte: float


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


def _store_key(folder: str | Path | None) -> str:
    if folder is None:
        from onnxplan.swap.store import default_parent

        folder = default_parent()
    return os.path.realpath(folder)


def _cache_path() -> Path:
    from onnxplan.artifacts import default_cache_dir

    return default_cache_dir() / CACHE_NAME


def store_rates(folder: str | Path | None = None, *, override: float | None = None,
                refresh: bool = False) -> StoreRates:
    """The swap store in `folder` (None: the executor's default folder): the bandwidth
    `override` if given, else $ONNXPLAN_SWAP_BANDWIDTH (bytes/s), both with the modelled CPU
    cost (io_cpu_seconds); else the cached measurement of that folder, else measured now
    (measure_store) and cached. `refresh`: measure again."""
    if override is None:
        env = os.environ.get(SWAP_BANDWIDTH_ENV, "").strip()
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
        return StoreRates(float(override), io_cpu_seconds(PROBE_BYTES) / PROBE_BYTES)
    key = _store_key(folder)
    path = _cache_path()
    cached: dict = {}
    with contextlib.suppress(OSError, ValueError):
        cached = json.loads(path.read_text())
    got = cached.get(key) if isinstance(cached, dict) else None
    if not refresh and isinstance(got, dict):
        with contextlib.suppress(KeyError, TypeError, ValueError):
            rates = StoreRates(float(got["bandwidth"]), float(got["cpu_per_byte"]))
            if rates.bandwidth > 0 and rates.cpu_per_byte >= 0:
                return rates
    rates = measure_store(folder)
    cached = cached if isinstance(cached, dict) else {}
    cached[key] = {"bandwidth": rates.bandwidth, "cpu_per_byte": rates.cpu_per_byte,
                   "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cached, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    return rates


def store_bandwidth(folder: str | Path | None = None, *, override: float | None = None,
                    refresh: bool = False) -> float:
    """Bytes/s of the swap store in `folder` (store_rates)."""
    return store_rates(folder, override=override, refresh=refresh).bandwidth
