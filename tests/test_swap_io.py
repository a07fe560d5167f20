"""Swap execution: the file-backed store, the I/O worker, and swapped runs equal to unswapped ones."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from onnxplan.errors import UnsupportedOpError
from onnxplan.executor.runner import Executor, run_plan
from onnxplan.executor.swap_io import SwapIOError, SwapStore, fs_type
from onnxplan.planning import PlanOptions, plan_step
from tests.graphs import linear_chain, three_steps
from tests.zoo_small import SMALL, small_artifacts

POLICIES = [("on-demand", {}), ("reduced", {}), ("proactive", {"lookahead": 1}),
            ("proactive", {"lookahead": 4}), ("window", {})]


# ---- the store ------------------------------------------------------------------------------

def test_store_round_trip_is_bit_identical(tmp_path):
    rng = np.random.default_rng(0)
    sizes = {"a": 10_000, "b": 3, "c": 1 << 20}
    store = SwapStore(sizes, tmp_path)
    data = {k: rng.integers(0, 256, n, dtype=np.uint8) for k, n in sizes.items()}
    for k, v in data.items():
        store.write(k, v)
    for k, v in data.items():
        out = np.zeros_like(v)
        store.read(k, out)
        assert np.array_equal(out, v)
    floats = rng.standard_normal(2500).astype(np.float32)
    floats[3] = np.float32("nan")
    floats[4] = -0.0
    store.write("a", floats.view(np.uint8))
    back = np.empty(2500, np.float32)
    store.read("a", back.view(np.uint8))
    assert back.tobytes() == floats.tobytes()  # NaN payloads and signed zeros too
    store.close()
    assert store.closed


def test_store_leaves_no_file_behind(tmp_path):
    store = SwapStore({"a": 4096}, tmp_path)
    assert list(tmp_path.iterdir()) == []  # unlinked at once: the open descriptor keeps it
    store.write("a", np.ones(4096, np.uint8))
    assert list(tmp_path.iterdir()) == []
    own = SwapStore({"a": 4096})
    assert not os.path.exists(own.folder)  # its temporary folder is gone too
    own.close()


def test_killed_run_leaves_no_file_behind(tmp_path):
    code = ("import sys, time, numpy as np\n"
            "from onnxplan.executor.swap_io import SwapStore\n"
            "s = SwapStore({'a': 1 << 20}, sys.argv[1])\n"
            "s.write('a', np.ones(1 << 20, np.uint8))\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGKILL)
    finally:
        p.wait(timeout=30)
    assert list(tmp_path.iterdir()) == []


def _resident_pages(fd: int, nbytes: int) -> int:
    """Pages of the file [0, nbytes) in the page cache (mmap + mincore, read-only, no touch)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    addr = libc.mmap(None, nbytes, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
    assert addr not in (None, ctypes.c_void_p(-1).value)
    try:
        vec = ctypes.create_string_buffer((nbytes + 4095) // 4096)
        assert libc.mincore(addr, nbytes, vec) == 0
        return sum(b & 1 for b in vec.raw)
    finally:
        libc.munmap(addr, nbytes)


def test_store_pages_leave_the_page_cache(tmp_path):
    if fs_type(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip("a tmpfs file is its page cache")
    n = 8 << 20
    kept = SwapStore({"a": n}, tmp_path, drop_cache=False)
    kept.write("a", np.ones(n, np.uint8))
    assert _resident_pages(kept.fd, n) > 0  # without the advice the bytes stay in RAM
    store = SwapStore({"a": n}, tmp_path)
    store.write("a", np.ones(n, np.uint8))
    assert _resident_pages(store.fd, n) == 0
    out = np.empty(n, np.uint8)
    store.read("a", out)
    assert _resident_pages(store.fd, n) == 0 and out.all()


@pytest.mark.parametrize("direct", [True, False])
def test_direct_and_buffered_stores_round_trip_and_keep_nothing_cached(tmp_path, monkeypatch, direct):
    """O_DIRECT through the bounce block (odd sizes, several blocks) and the buffered fallback
    (a file system without O_DIRECT) store the same bytes and leave no page of them in RAM."""
    from onnxplan.swap import store as swap_io

    if not direct:
        monkeypatch.setattr(swap_io, "_open_direct", lambda path: None)
    rng = np.random.default_rng(3)
    sizes = {"a": 3 * swap_io.DIRECT_CHUNK + 17, "b": 5, "c": swap_io.DIRECT_CHUNK}
    store = SwapStore(sizes, tmp_path)
    if direct and not store.direct:
        pytest.skip(f"no O_DIRECT on {fs_type(tmp_path)}")
    assert store.direct == direct and ("O_DIRECT" in store.cache_policy) == direct
    data = {k: rng.integers(0, 256, n, dtype=np.uint8) for k, n in sizes.items()}
    for k, v in data.items():
        store.write(k, v)
    store.write_zeros("b")
    data["b"][:] = 0
    for k, v in data.items():
        out = np.empty_like(v)
        store.read(k, out)
        assert np.array_equal(out, v), k
    if fs_type(tmp_path) not in ("tmpfs", "ramfs"):
        assert _resident_pages(store.fd, store.nbytes) == 0
    store.close()


def test_worker_settles_written_pages_when_idle(tmp_path):
    """The worker starts a write's write-back at once and drops its pages when it is idle."""
    if fs_type(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip("a tmpfs file is its page cache")
    from onnxplan.executor.swap_io import Job, SwapWorker

    n = 8 << 20
    store = SwapStore({"a": n, "b": n}, tmp_path)
    worker = SwapWorker(store)
    worker.start()
    try:
        data = np.arange(n, dtype=np.uint64).astype(np.uint8)
        w = worker.put(Job("write", "a", data, 0))
        out = np.zeros(n, np.uint8)
        r = worker.put(Job("read", "a", out, 1))  # in EO order: after the write
        r.done.wait(10)
        assert w.done.is_set() and np.array_equal(out, data)
        deadline = time.time() + 10
        while _resident_pages(store.fd, 2 * n) and time.time() < deadline:
            time.sleep(0.01)
        assert _resident_pages(store.fd, 2 * n) == 0 and not store.unsettled
    finally:
        worker.stop()
        store.close()


# ---- the worker inside the executor --------------------------------------------------------

@pytest.fixture(scope="module")
def chain_case():
    g = linear_chain()
    rng = np.random.default_rng(0)
    params = {f"W{i}": (rng.standard_normal((32, 32)) * 0.3).astype(np.float32) for i in range(5)}
    batch = {"x": rng.standard_normal((32, 32)).astype(np.float32), "labels": rng.integers(0, 32, 32)}
    return g, params, batch


def _same(a, b) -> bool:
    return a[0] == b[0] and set(a[1]) == set(b[1]) and all(np.array_equal(a[1][k], b[1][k]) for k in a[1])


@pytest.mark.parametrize("policy, kw", POLICIES)
def test_swapped_chain_equals_unswapped(chain_case, policy, kw, tmp_path):
    g, params, batch = chain_case
    base = three_steps(g, PlanOptions(planner="best-fit"), params, batch)
    got = three_steps(g, PlanOptions(planner="best-fit", swap=policy, **kw), params, batch, swap_dir=tmp_path)
    assert _same(got, base)
    s = got[2].swap.summary()
    assert len(s["steps"]) == 3 and s["total"]["reads"] > 0
    assert s["total"]["bytes_in"] == 3 * sum(x.bytes for x in got[2].plan.swaps)
    assert s["total"]["bytes_out"] == 3 * sum(x.bytes for x in got[2].plan.swaps if x.write)
    checked = three_steps(g, PlanOptions(planner="best-fit", swap=policy, **kw), params, batch, check_arena=True)
    assert _same(checked, base)


def _slow(monkeypatch, method: str, seconds: float) -> None:
    original = getattr(SwapStore, method)

    def slow(self, slot, data, **kw):
        time.sleep(seconds)
        return original(self, slot, data, **kw)

    monkeypatch.setattr(SwapStore, method, slow)


def test_late_prefetch_stalls_and_never_reads_stale_bytes(chain_case, monkeypatch):
    g, params, batch = chain_case
    base = three_steps(g, PlanOptions(planner="best-fit"), params, batch)
    _slow(monkeypatch, "read", 0.02)
    got = three_steps(g, PlanOptions(planner="best-fit", swap="proactive"), params, batch, poison=True)
    assert _same(got, base)
    total = got[2].swap.summary()["total"]
    assert total["stalls"] >= total["reads"] // 2 and total["stall_seconds"] >= 0.02 * total["reads"] / 2


def test_late_write_holds_the_memory_until_done(chain_case, monkeypatch):
    g, params, batch = chain_case
    base = three_steps(g, PlanOptions(planner="best-fit"), params, batch)
    _slow(monkeypatch, "write", 0.02)
    got = three_steps(g, PlanOptions(planner="best-fit", swap="reduced"), params, batch, poison=True)
    assert _same(got, base)
    assert got[2].swap.summary()["total"]["stalls"] > 0


def test_io_failure_is_reported(chain_case, monkeypatch):
    g, params, batch = chain_case

    def broken(self, slot, data, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(SwapStore, "write", broken)
    res = plan_step(g, PlanOptions(planner="best-fit", swap="reduced"))
    ex = Executor(res.graph, res.plan)
    monkeypatch.undo()
    ex.load_state(params)
    monkeypatch.setattr(SwapStore, "write", broken)
    with pytest.raises(Exception, match="No space left"):
        ex.step(batch)


def test_failed_settle_fails_later_waits_instead_of_hanging(chain_case, monkeypatch):
    """A write-back that fails between steps (EIO from fdatasync / sync_file_range) reaches the
    next step's first wait as a one-line swap error; before, the worker thread died with it and
    every later wait blocked forever."""
    import threading

    g, params, batch = chain_case
    res = plan_step(g, PlanOptions(planner="best-fit", swap="reduced"))
    ex = Executor(res.graph, res.plan)
    ex.load_state(params)
    ex.step(batch)

    def broken(self, until=None):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(SwapStore, "settle", broken)
    outcome = []

    def second_step():
        try:
            ex.step(batch)
            outcome.append(None)
        except Exception as exc:  # noqa: BLE001 - inspected below
            outcome.append(exc)

    t = threading.Thread(target=second_step, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "a wait hung on the swap worker"
    assert isinstance(outcome[0], SwapIOError) and "Input/output error" in str(outcome[0])
    assert "\n" not in str(outcome[0])


# ---- every zoo model, every policy: bit-identical to the same plan without swap -----------------

@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMALL))
def test_zoo_swapped_runs_equal_unswapped(name, tmp_path):
    folder = small_artifacts(name)
    try:
        base = run_plan(folder, PlanOptions(planner="best-fit"), steps=3)
    except UnsupportedOpError as exc:
        pytest.skip(f"executor kernel missing (not a swap issue): {exc}")
    for policy, kw in POLICIES:
        got = run_plan(folder, PlanOptions(planner="best-fit", swap=policy, **kw), steps=3, swap_dir=tmp_path)
        assert got.plan.swaps, (name, policy)
        assert got.losses == base.losses, (name, policy, kw)
        assert set(got.params) == set(base.params)
        for k in base.params:
            assert np.array_equal(got.params[k], base.params[k]), (name, policy, kw, k)
        assert got.swap is not None and got.swap["total"]["reads"] > 0
        assert list(tmp_path.iterdir()) == []


def test_an_open_swap_runtime_switches_threads_often_and_restores_the_interval(chain_case):
    """While a runtime is open the interpreter lock changes hands every SWITCH_SECONDS (the
    I/O worker is not kept waiting by the compute thread); the user's interval comes back when
    the last open runtime closes."""
    import gc
    import sys

    from onnxplan.executor import swap_io
    from onnxplan.executor.runner import Executor
    from onnxplan.planning import plan_step

    g, params, batch = chain_case
    gc.collect()  # the runtimes of earlier tests' executors (never closed) close when collected
    assert swap_io._switch_holds == 0, "a swap runtime of an earlier test is still open"
    before = sys.getswitchinterval()
    res = plan_step(g, PlanOptions(planner="best-fit", swap="proactive"))
    a = Executor(res.graph, res.plan)
    b = Executor(res.graph, res.plan)
    assert sys.getswitchinterval() == pytest.approx(min(before, swap_io.SWITCH_SECONDS))
    a.swap.close()
    assert sys.getswitchinterval() == pytest.approx(min(before, swap_io.SWITCH_SECONDS))  # b is still open
    b.swap.close()
    b.swap.close()  # closing twice changes nothing
    assert sys.getswitchinterval() == pytest.approx(before)


def _calls_in_a_thread(calls, guard_seconds: float = 60.0) -> list:
    """Run `calls` one after the other in a thread, each one's exception (or None) kept; the
    join's timeout only guards against a hang (the test then fails instead of blocking)."""
    import threading

    outcome: list = []

    def body():
        for call in calls:
            try:
                call()
                outcome.append(None)
            except Exception as exc:  # noqa: BLE001 - inspected by the test
                outcome.append(exc)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(guard_seconds)
    assert not t.is_alive(), f"a wait hung on the swap worker after {len(outcome)} calls"
    return outcome


@pytest.mark.parametrize("method, nth", [("write", 3), ("read", 2), ("settle", 2)])
def test_a_failed_transfer_or_flush_fails_every_later_wait(chain_case, monkeypatch, method, nth):
    """The store fails on its Nth write, read or settle (the flush of the written pages, run
    when the worker is idle at the end of a step): the step that waits for it raises the store's
    error in one line, and so does every later wait (the next steps, reading the state back),
    chained to the worker's exception. Before, a failed write or read failed only its own wait:
    the next step ran on, reading a slot the failed write never filled."""
    g, params, batch = chain_case
    res = plan_step(g, PlanOptions(planner="best-fit", swap="reduced"))
    ex = Executor(res.graph, res.plan)
    ex.load_state(params)
    injected = OSError(5, "Input/output error")
    original, count = getattr(SwapStore, method), []

    def failing(self, *args, **kw):
        count.append(1)
        if len(count) == nth:
            raise injected
        return original(self, *args, **kw)

    monkeypatch.setattr(SwapStore, method, failing)
    outcome = _calls_in_a_thread([lambda: ex.step(batch)] * 4 + [ex.parameters])
    assert len(count) >= nth, "the failure was never injected"
    first = next(k for k, exc in enumerate(outcome) if exc is not None)
    assert first < 4, outcome
    for exc in outcome[first:]:
        assert isinstance(exc, SwapIOError), repr(exc)
        assert "Input/output error" in str(exc) and "\n" not in str(exc)
        assert exc.__cause__ is injected
    for exc in outcome[first + 1:]:
        assert "refused" in str(exc)
    ex.swap.close()


@pytest.fixture
def switch_interval():
    """The interval before the test (no runtime of an earlier test still open), put back after it."""
    import gc

    from onnxplan.executor import swap_io

    gc.collect()  # the runtimes of earlier tests' executors (never closed) close when collected
    assert swap_io._switch_holds == 0, "a swap runtime of an earlier test is still open"
    before = sys.getswitchinterval()
    yield before
    sys.setswitchinterval(before)


def test_the_interval_comes_back_when_closing_fails_after_a_failed_step(chain_case, monkeypatch, switch_interval):
    """A step fails on the swap file, then closing the runtime fails too (the file cannot be
    closed): the interval comes back all the same. Before, a failing close skipped the restore."""
    from onnxplan.executor import swap_io

    g, params, batch = chain_case
    res = plan_step(g, PlanOptions(planner="best-fit", swap="reduced"))
    ex = Executor(res.graph, res.plan)
    ex.load_state(params)

    def broken(self, *args, **kw):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(SwapStore, "write", broken)
    with pytest.raises(SwapIOError):
        ex.step(batch)
    monkeypatch.setattr(SwapStore, "close", broken)
    with pytest.raises(OSError):
        ex.swap.close()
    monkeypatch.undo()
    assert sys.getswitchinterval() == switch_interval and swap_io._switch_holds == 0


def test_an_interval_set_while_a_runtime_is_open_is_left_alone(chain_case, switch_interval):
    """Someone else sets the interval while runtimes are open: closing them does not put the
    one saved before them back over it. Before, the last close overwrote it."""
    from onnxplan.executor import swap_io

    g, _, _ = chain_case
    res = plan_step(g, PlanOptions(planner="best-fit", swap="reduced"))
    a, b = Executor(res.graph, res.plan), Executor(res.graph, res.plan)
    theirs = 2 * switch_interval + 1e-3
    sys.setswitchinterval(theirs)
    a.swap.close()
    b.swap.close()
    assert sys.getswitchinterval() == pytest.approx(theirs) and swap_io._switch_holds == 0


def test_an_executor_failing_to_build_leaves_no_runtime_open(chain_case, monkeypatch, switch_interval):
    """The executor opens its swap runtime last: a constructor that fails before (a node without
    a kernel) leaves the interval as it was, even while its error is held (a REPL keeps the last
    one). Before, the runtime opened first stayed open with the error's frames."""
    from onnxplan.executor import runner, swap_io

    g, _, _ = chain_case
    res = plan_step(g, PlanOptions(planner="best-fit", swap="reduced"))

    def missing(node, opset):
        raise UnsupportedOpError(f"no kernel for {node.op_type}")

    monkeypatch.setattr(runner, "find_kernel", missing)
    with pytest.raises(UnsupportedOpError) as held:
        Executor(res.graph, res.plan)
    assert held.value is not None
    assert swap_io._switch_holds == 0 and sys.getswitchinterval() == switch_interval
