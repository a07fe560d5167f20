"""One footing for swap transfers (onnxplan.swap.pricing): the one-worker overlap against
hand-computed cases, the priced plan, the store's measured bandwidth and its cache."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from onnxplan import settings
from onnxplan.errors import UsageError
from onnxplan.plan import PlannedSwap
from onnxplan.swap import pricing
from onnxplan.swap.pricing import TRANSFER_SECONDS, StoreRates, Transfer, io_stalls, planned_step


def test_a_hidden_write_and_a_late_read():
    """Segments of 1 s; 1 byte/s. A write of 0.5 B issued at boundary 0, due at 1: hidden. A
    read of 2 B issued at 1 (t = 1), done at t = 3, due at boundary 2 (t = 2): 1 s of stall."""
    got = io_stalls([1.0, 1.0, 1.0], [Transfer(0.5, 0, 1, write=True), Transfer(2, 1, 2)], 1.0)
    assert got == [0.0, 1.0]


def test_a_write_backlog_delays_the_read_behind_it():
    """One worker, first in, first out: a write of 1.5 B (t 0 -> 1.5) ahead of a read of 1 B
    issued at t = 1 delays it to t = 2.5; due at t = 2: 0.5 s. Without the write: hidden."""
    assert io_stalls([1.0, 1.0, 1.0], [Transfer(1.5, 0, 3, write=True), Transfer(1, 1, 2)], 1.0) == [0.0, 0.5]
    assert io_stalls([1.0, 1.0, 1.0], [Transfer(1, 1, 2)], 1.0) == [0.0]


def test_the_step_waits_for_every_transfer_at_its_end():
    """A read issued at the last boundary still costs its whole time; a stall moves the clock,
    so a second transfer due at the same point stalls only for the rest."""
    assert io_stalls([1.0], [Transfer(3, 1, 1)], 1.0) == [3.0]
    assert io_stalls([1.0, 1.0], [Transfer(2, 0, 1), Transfer(1, 0, 1)], 1.0) == [1.0, 1.0]
    with pytest.raises(ValueError):
        io_stalls([1.0], [Transfer(1, 0, 2)], 1.0)


def _hand_step(n1: float):
    """n0 makes x; n1; SwapOut(x); n2; SwapIn(x -> x2); n3 reads x2 (one swap of 100 B)."""
    def node(name, ins=(), outs=(), op="Relu", domain=""):
        return SimpleNamespace(name=name, inputs=list(ins), outputs=list(outs), op_type=op, domain=domain)

    nodes = [node("n0", (), ("x",)), node("n1"), node("out", ("x",), (), "SwapOut", "onnxplan"), node("n2"),
             node("in", (), ("x2",), "SwapIn", "onnxplan"), node("n3", ("x2",))]
    graph = SimpleNamespace(nodes=nodes)
    swap = PlannedSwap("x", 100, "temporary", "out", "in", 2, 4, last_use="n0", next_use="n3")
    secs = {"n0": 1.0, "n1": n1, "n2": 1.0, "n3": 1.0}
    return graph, [n.name for n in nodes], [swap], lambda n: secs[n.name]


def test_a_planned_step_priced_where_the_executor_issues_and_waits():
    """100 B at 100 B/s: 1 s each way. The write is issued after n0 (t = 1) and due at the
    SwapOut (t = 1 + n1); the read issued at the SwapIn (t = 2 + n1), due at n3: 1 s of stall."""
    graph, order, swaps, secs = _hand_step(1.0)
    p = planned_step(graph, order, swaps, secs, StoreRates(100.0, 1e-3))
    assert (p.compute, p.stall, p.moved) == (4.0, 1.0, 200)
    assert p.handling == pytest.approx(2 * TRANSFER_SECONDS) and p.io_cpu == pytest.approx(0.2)
    assert p.seconds == pytest.approx(5.0 + 2 * TRANSFER_SECONDS)
    assert p.cpu_seconds == pytest.approx(4.2 + 2 * TRANSFER_SECONDS)
    # the I/O thread's CPU delays the compute stream where it waits for no transfer: at 2e-2 s
    # per byte (4 s) it outweighs the 1 s stall
    p = planned_step(graph, order, swaps, secs, StoreRates(100.0, 2e-2))
    assert p.seconds == pytest.approx(4.0 + 4.0 + 2 * TRANSFER_SECONDS)
    graph, order, swaps, secs = _hand_step(0.5)  # the write is late at the SwapOut by 0.5 s
    p = planned_step(graph, order, swaps, secs, StoreRates(100.0, 0.0))
    assert p.stall == pytest.approx(0.5 + 1.0)
    p = planned_step(graph, order, [], secs, StoreRates(100.0, 0.0))
    assert (p.seconds, p.moved) == (3.5, 0)


def test_the_joint_model_prices_on_the_same_worker(monkeypatch):
    """The joint model's step_seconds is io_stalls over its segments (each forward EO, then each
    stage): a write issued after its buffer's last forward use and due where its memory is freed
    (held_until + 1), a stage's page-ins behind the stage before, an early one from its issue
    stage (here on a hand-made problem)."""
    from onnxplan.joint.evaluate import step_seconds
    from onnxplan.joint.problem import Decisions

    def buf(nbytes, held_until):
        return SimpleNamespace(nbytes=nbytes, last_forward=0, held_until=held_until)

    prob = SimpleNamespace(stages=3, node_seconds=[0.5], forward_seconds=1.0, forward_eo_seconds=[0.5, 0.5],
                           stage_seconds=[1.0, 1.0, 1.0], step_seconds=4.0, buffers=[buf(2, 2), buf(1, 1)],
                           io_cpu_per_byte=0.0)
    # at 1 B/s both writes start after EO 0 (t = 0.5) and are due at the forward pass's end
    # (t = 1.0): done at 2.5 and 3.5, 2.5 s exposed; the page-in of buffer 1 for stage 2, issued
    # as stage 1 starts, is done behind stage 1 (1 s + a 0.5 s recomputation): hidden
    d = Decisions(recompute=frozenset({(1, 0)}), keep=frozenset(), page_out=frozenset({0, 1}),
                  page_in=frozenset({(2, 1)}))
    secs, rec, stall = step_seconds(prob, d, 1.0)
    assert (rec, stall) == (0.5, 2.5)
    assert secs == pytest.approx(4.0 + 0.5 + 2.5 + 3 * TRANSFER_SECONDS)
    # at 0.4 B/s: the write (2.5 s) is 2 s late at the forward's end, the page-in (2.5 s) 1.5 s
    # late at stage 2
    d = Decisions(recompute=frozenset(), keep=frozenset(), page_out=frozenset({1}), page_in=frozenset({(2, 1)}))
    assert step_seconds(prob, d, 0.4)[2] == pytest.approx(2.0 + 1.5)
    # the same page-in for stage 3, one stage ahead (issued as stage 2 starts, t = 4): done at
    # 6.5, due at 5: 1.5 s late; issued early, as stage 1 starts (t = 3): done at 5.5, 0.5 s late
    d = Decisions(recompute=frozenset(), keep=frozenset(), page_out=frozenset({1}), page_in=frozenset({(3, 1)}))
    assert step_seconds(prob, d, 0.4)[2] == pytest.approx(2.0 + 1.5)
    early = Decisions(recompute=frozenset(), keep=frozenset(), page_out=frozenset({1}), page_in=frozenset({(3, 1)}),
                      early=frozenset({(3, 1, 1)}))
    assert step_seconds(prob, early, 0.4)[2] == pytest.approx(2.0 + 0.5)


def _two_devices(monkeypatch, *others) -> None:
    """Folders `others` (and what is inside them) kept as if on another device than the rest."""
    import os

    real = pricing.store_key

    def key(folder):
        path = os.path.realpath(folder) if folder is not None else ""
        hit = next((str(o) for o in others if path == os.path.realpath(o) or path.startswith(os.path.realpath(o) + "/")), None)
        return f"other device {hit}" if hit else real(folder)

    monkeypatch.setattr(pricing, "store_key", key)


def test_the_store_bandwidth_is_measured_once_per_store_and_can_be_given(tmp_path, monkeypatch):
    """Measured on the executor's own store in that folder, kept per store (the device), refreshed on
    request; $ONNXPLAN_SWAP_BANDWIDTH or an explicit value overrides it; a bad value is a
    one-line usage error."""
    monkeypatch.setenv("ONNXPLAN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(pricing.SWAP_BANDWIDTH_ENV, raising=False)
    settings.reload()  # the environment changed: read it again
    calls = []

    def fake(folder=None, nbytes=pricing.PROBE_BYTES, repeats=pricing.PROBE_REPEATS):
        calls.append(folder)
        return StoreRates(1e9 + len(calls), 1e-10)

    monkeypatch.setattr(pricing, "measure_store", fake)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert pricing.store_bandwidth(a) == 1e9 + 1
    assert pricing.store_bandwidth(a) == 1e9 + 1 and len(calls) == 1  # cached
    assert pricing.store_bandwidth(b) == 1e9 + 1 and len(calls) == 1  # the same file system: the same store
    _two_devices(monkeypatch, b)
    assert pricing.store_bandwidth(b) == 1e9 + 2  # another device: its own measurement
    assert pricing.store_bandwidth(a, refresh=True) == 1e9 + 3
    assert pricing.store_bandwidth(a, override=5e8) == 5e8 and len(calls) == 3
    monkeypatch.setenv(pricing.SWAP_BANDWIDTH_ENV, "2e8")
    settings.reload()  # the environment changed: read it again
    assert pricing.store_bandwidth(a) == 2e8 and len(calls) == 3
    monkeypatch.setenv(pricing.SWAP_BANDWIDTH_ENV, "fast")
    settings.reload()  # the environment changed: read it again
    with pytest.raises(UsageError, match="ONNXPLAN_SWAP_BANDWIDTH"):
        pricing.store_rates(a)


def test_the_store_is_measured_through_the_executors_store(tmp_path):
    rates = pricing.measure_store(tmp_path, nbytes=1 << 20, repeats=2)
    assert rates.bandwidth > 0 and rates.cpu_per_byte >= 0


def test_a_split_conv_gradient_costs_half_its_profiled_fused_node():
    """passes.split_grad's halves (NAME/dX, NAME/dW) are not in a profile of the unsplit step:
    each is priced as half its fused ConvGrad's measured time (one forward-sized product each),
    not at the roofline."""
    from onnxplan.checkpoint.costs import TimeModel

    tm = TimeModel(measured={"conv_grad": 2e-3})
    for name, op in (("conv_grad/dX", "ConvGradInput"), ("conv_grad/dW", "ConvGrad")):
        assert tm.node_seconds(None, SimpleNamespace(name=name, op_type=op)) == pytest.approx(1e-3)


# ---- the moving estimate: the runtime's own transfers --------------------------------------------

def test_the_moving_estimate_weighs_seconds_per_byte():
    """Weight w on the new observation, kept on seconds per byte (a transfer's time), and on
    CPU per byte: 100 B/s then 200 B/s at w = 0.25 -> 1 / (0.75/100 + 0.25/200) = 114.29 B/s."""
    got = pricing.moving_estimate(StoreRates(100.0, 1e-9), 200.0, 3e-9, weight=0.25)
    assert got.bandwidth == pytest.approx(1 / (0.75 / 100 + 0.25 / 200))
    assert got.cpu_per_byte == pytest.approx(0.75 * 1e-9 + 0.25 * 3e-9)
    assert pricing.moving_estimate(StoreRates(100.0, 0.0), 100.0, 0.0).bandwidth == pytest.approx(100.0)
    assert pricing.ESTIMATE_WEIGHT == 0.25


def test_runs_move_the_kept_estimate_of_their_store(tmp_path, monkeypatch):
    """The first run's transfers set a store's estimate; each later run moves it by
    ESTIMATE_WEIGHT; a run moving too few bytes is not counted; pricing reads the estimate
    (source "estimate"), without measuring."""
    monkeypatch.setenv("ONNXPLAN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(pricing.SWAP_BANDWIDTH_ENV, raising=False)
    settings.reload()  # the environment changed: read it again
    monkeypatch.setattr(pricing, "measure_store", lambda *a, **k: pytest.fail("measured"))
    big = pricing.MIN_OBSERVED_BYTES
    assert pricing.record_transfers(tmp_path, big - 1, 1.0, 0.1) is None
    first = pricing.record_transfers(tmp_path, big, 0.01, 0.001)
    assert first.bandwidth == pytest.approx(big / 0.01) and first.cpu_per_byte == pytest.approx(0.001 / big)
    second = pricing.record_transfers(tmp_path, big, 0.02, 0.001)
    assert second.bandwidth == pytest.approx(pricing.moving_estimate(first, big / 0.02, 0.001 / big).bandwidth)
    rates = pricing.store_rates(tmp_path)
    assert rates.bandwidth == pytest.approx(second.bandwidth) and rates.source == "estimate"
    assert rates.store == pricing.store_key(tmp_path) and rates.folder == str(tmp_path)
    import json

    entry = json.loads((tmp_path / "cache" / pricing.CACHE_NAME).read_text())[pricing.store_key(tmp_path)]
    assert entry["runs"] == 2


_RECORDER = """
import sys
from onnxplan.swap import pricing
for k in range(int(sys.argv[2])):
    pricing.record_transfers(sys.argv[1], pricing.MIN_OBSERVED_BYTES, 0.01 * (1 + k % 3), 0.001)
"""


def test_concurrent_processes_update_the_estimate_without_losing_or_corrupting_it(tmp_path):
    """Four processes record five runs each into one cache at once: the file stays whole JSON
    (written to a temporary file, renamed over it) and keeps all twenty runs (updated under a
    lock); no temporary file is left."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "ONNXPLAN_CACHE": str(tmp_path / "cache")}
    env.pop(pricing.SWAP_BANDWIDTH_ENV, None)
    procs = [subprocess.Popen([sys.executable, "-c", _RECORDER, str(tmp_path), "5"], env=env) for _ in range(4)]
    assert [p.wait(timeout=300) for p in procs] == [0] * 4
    cache = json.loads((tmp_path / "cache" / pricing.CACHE_NAME).read_text())
    assert cache[pricing.store_key(tmp_path)]["runs"] == 20
    assert sorted(f.name for f in (tmp_path / "cache").iterdir()) == [pricing.CACHE_NAME, pricing.CACHE_NAME + ".lock"]


def test_a_failed_write_of_the_cache_leaves_the_old_file_whole(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("ONNXPLAN_CACHE", str(tmp_path / "cache"))
    settings.reload()  # the environment changed: read it again
    first = pricing.record_transfers(tmp_path, pricing.MIN_OBSERVED_BYTES, 0.01, 0.001)
    path = tmp_path / "cache" / pricing.CACHE_NAME
    before = path.read_text()

    def broken(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    pricing.record_transfers(tmp_path, pricing.MIN_OBSERVED_BYTES, 0.05, 0.001)
    monkeypatch.undo()
    assert path.read_text() == before
    assert sorted(f.name for f in path.parent.iterdir()) == [pricing.CACHE_NAME, pricing.CACHE_NAME + ".lock"]
    assert first is not None


def test_a_swapped_run_updates_its_stores_estimate(tmp_path, monkeypatch):
    """Closing a swap runtime records its own transfers (bytes moved, the I/O worker's busy
    seconds) into the estimate of the store its --swap-dir lives on."""
    import json

    import numpy as np

    from onnxplan.executor.runner import Executor
    from onnxplan.planning import PlanOptions, plan_step
    from tests.graphs import linear_chain

    monkeypatch.setenv("ONNXPLAN_CACHE", str(tmp_path / "cache"))
    settings.reload()  # the environment changed: read it again
    monkeypatch.setattr(pricing, "MIN_OBSERVED_BYTES", 1)  # the chain moves a few KiB a step
    g = linear_chain()
    rng = np.random.default_rng(0)
    params = {f"W{i}": (rng.standard_normal((32, 32)) * 0.3).astype(np.float32) for i in range(5)}
    batch = {"x": rng.standard_normal((32, 32)).astype(np.float32), "labels": rng.integers(0, 32, 32)}
    res = plan_step(g, PlanOptions(planner="best-fit", swap="reduced"))
    folder = tmp_path / "swap"
    folder.mkdir()
    ex = Executor(res.graph, res.plan, swap_dir=folder)
    ex.load_state(params)
    for _ in range(2):
        ex.step(batch)
    moved = sum(s["bytes_in"] + s["bytes_out"] for s in ex.swap.summary()["steps"])
    busy = ex.swap.worker
    ex.swap.close()
    entry = json.loads((tmp_path / "cache" / pricing.CACHE_NAME).read_text())[pricing.store_key(folder)]
    assert entry["runs"] == 1 and entry["last_run"]["bytes"] == busy.bytes_moved == moved
    assert 0 <= busy.queued_seconds < busy.busy_seconds
    assert entry["bandwidth"] == pytest.approx(moved / (busy.busy_seconds - busy.queued_seconds))
    assert entry["folder"] == str(folder)


def test_run_delay_reads_the_thread_s_wait_for_a_cpu(tmp_path):
    """RunDelay: the second field of schedstat in seconds; 0 where the file is missing or odd."""
    from onnxplan.executor.swap_io import RunDelay

    stat = tmp_path / "schedstat"
    stat.write_text("123 2500000000 7\n")
    delay = RunDelay(str(stat))
    assert delay.seconds() == 2.5
    stat.write_text("garbage\n")
    assert delay.seconds() == 0.0
    delay.close()
    assert RunDelay(str(tmp_path / "missing")).seconds() == 0.0


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="Linux schedstat only")
def test_run_delay_sees_other_processes_on_the_cores():
    """Twice as many busy processes as cores: a spinning thread waits for a CPU (its run delay
    grows by a good part of the time it spins; about two thirds here)."""
    import multiprocessing
    import threading
    import time

    from onnxplan.executor.swap_io import RunDelay

    def spin(seconds: float, out: list) -> None:
        delay = RunDelay()
        d0, t0 = delay.seconds(), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            pass
        out.append(delay.seconds() - d0)
        delay.close()

    ctx = multiprocessing.get_context("spawn")
    burners = [ctx.Process(target=_burn, args=(2.0,)) for _ in range(2 * len(os.sched_getaffinity(0)))]
    for b in burners:
        b.start()
    time.sleep(0.3)  # the burners are running
    loaded: list[float] = []
    t = threading.Thread(target=spin, args=(1.0, loaded))
    t.start()
    t.join()
    for b in burners:
        b.join()
    assert loaded[0] > 0.2, loaded


def _burn(seconds: float) -> None:
    import time

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass


def test_a_plan_is_priced_for_the_swap_dir_it_will_run_with(tmp_path, monkeypatch):
    """Two folders on two stores of different bandwidths: a plan for --swap-dir X is priced at
    X's (adaptive's simulated stalls, the plan's record), not at the default folder's."""
    from onnxplan.planning import PlanOptions, plan_step
    from tests.graphs import linear_chain

    monkeypatch.setenv("ONNXPLAN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(pricing.SWAP_BANDWIDTH_ENV, raising=False)
    settings.reload()  # the environment changed: read it again
    fast, slow = tmp_path / "fast", tmp_path / "slow"
    fast.mkdir()
    slow.mkdir()
    _two_devices(monkeypatch, fast, slow)
    measured = []

    def fake(folder=None, nbytes=pricing.PROBE_BYTES, repeats=pricing.PROBE_REPEATS):
        measured.append(None if folder is None else str(folder))
        return StoreRates({str(fast): 4e9, str(slow): 2e6}.get(str(folder), 1e8), 1e-10)

    monkeypatch.setattr(pricing, "measure_store", fake)
    from onnxplan.swap import adaptive

    seen = []
    real = adaptive.store_bandwidth
    monkeypatch.setattr(adaptive, "store_bandwidth", lambda folder=None: seen.append(folder) or real(folder))
    g = linear_chain()
    plain = plan_step(g, PlanOptions(planner="best-fit")).plan
    for folder, bandwidth in ((fast, 4e9), (slow, 2e6)):
        opts = PlanOptions(planner="best-fit", swap="adaptive", budget=plain.peak_bytes - 1, swap_dir=str(folder))
        plan = plan_step(g, opts).plan
        assert plan.swaps and plan.swap.store["folder"] == str(folder)
        assert plan.swap.store["bandwidth"] == bandwidth and plan.swap.store["source"] == "measured"
        assert seen[-1] == str(folder)
    assert measured == [str(fast), str(slow)]  # never the default folder
