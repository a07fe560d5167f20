"""Kernels split across the compute threads (onnxplan.kernels.parallel): the same bits as on one
thread, the declared scratch only, every element written once."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

from onnxplan import threads
from onnxplan.ir.graph import Node
from onnxplan.kernels import _xp, parallel
from tests.kernel_harness import RNG, call_kernel


def test_pieces_cover_every_row_once(split):
    assert parallel.bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert parallel.parts_for(64 * 10) == 3 and parallel.parts_for(100) == 1
    assert parallel.parts_for(10 ** 6, xp=object()) == 1  # not numpy: never split
    out = np.zeros((7, 40), np.int64)
    seen = []
    parallel.rows(out, lambda o: (seen.append(o.shape[0]), o.__iadd__(1)))
    assert sorted(seen) == [2, 2, 3] and (out == 1).all()


def test_a_failing_piece_raises_after_all_finish(split):
    done = []

    def boom():
        raise ValueError("piece 2")

    with pytest.raises(ValueError, match="piece 2"):
        parallel.run([lambda: done.append(1), boom, lambda: done.append(3)])
    assert sorted(done) == [1, 3]


def test_the_caller_runs_the_pieces_no_worker_has_started(split):
    """Every worker busy (or descheduled by the machine's other processes): the calling thread
    runs every piece itself and returns, instead of waiting for a worker to start."""
    release, started = threading.Event(), threading.Semaphore(0)

    def hold() -> None:
        started.release()
        assert release.wait(30)

    holder = threading.Thread(target=parallel.run, args=([hold, hold, hold],))
    holder.start()  # its thread and both workers (3 compute threads) each held in a piece
    ran: list[str] = []
    try:
        assert all(started.acquire(timeout=10) for _ in range(3))
        caller = threading.Thread(target=parallel.run, args=([lambda k=k: ran.append(
            threading.current_thread().name) for k in range(4)],))
        caller.start()
        caller.join(10)
        assert not caller.is_alive(), "run() waited for a worker that never started"
        assert len(ran) == 4 and set(ran) == {caller.name}
    finally:
        release.set()
        holder.join(10)


@pytest.fixture
def fresh_outcomes(monkeypatch):
    """A score of its own (no probe for 30 s), whatever the runs before left."""
    outcomes = parallel.Outcomes()
    monkeypatch.setattr(parallel, "outcomes", outcomes)
    monkeypatch.setattr(parallel, "PROBE_SECONDS", 30.0)
    return outcomes


def _stalled_run() -> None:
    """Two pieces: the caller's ends when the worker's starts, the worker's takes 100 ms (a
    descheduled worker's time slices): the run takes far longer than the caller alone would have
    (over twice, the ratio's cap, unless the worker starts 33 ms late)."""
    started = threading.Event()
    me = threading.current_thread()

    def piece():
        if threading.current_thread() is me:
            assert started.wait(10)
        else:
            started.set()
            time.sleep(0.1)

    parallel.run([piece, piece])


def test_while_splits_lose_the_caller_runs_every_piece(split, fresh_outcomes):
    """Splits that lose (stalls) raise the score over 1 (two from the start): the calling thread
    then runs every piece itself (the same pieces: the same bits); a probe hands one run out."""
    _stalled_run()
    assert fresh_outcomes.stalls == 1 and fresh_outcomes.score <= 1.0  # one stall is not enough
    _stalled_run()
    assert fresh_outcomes.stalls == 2 and fresh_outcomes.score > 1.0
    me = threading.current_thread().name
    ran: list[str] = []
    parallel.run([lambda: ran.append(threading.current_thread().name) for _ in range(6)])
    assert ran == [me] * 6
    fresh_outcomes.next_probe = 0.0  # time for a probe: the workers take pieces again
    release = threading.Event()
    ran.clear()
    parallel.run([lambda: (ran.append(threading.current_thread().name), release.wait(10)),
                  lambda: (ran.append(threading.current_thread().name), release.set())])
    assert len(ran) == 2 and set(ran) != {me}


def test_balanced_pieces_keep_the_workers(split, fresh_outcomes):
    """Pieces of 20 ms on both threads: no stall (unless the worker starts 20 ms late), the score
    falls (an idle machine keeps its workers)."""
    for _ in range(3):
        parallel.run([lambda: time.sleep(0.02), lambda: time.sleep(0.02)])
    assert fresh_outcomes.stalls == 0 and fresh_outcomes.score < parallel.SCORE_START


def test_a_waiting_thread_runs_the_pieces_of_a_run_in_flight(split, fresh_outcomes):
    """Two tasks (two nodes at once): the worker's task cuts its own work in pieces; the calling
    thread, done with its task, takes some of those pieces instead of sleeping (parallel._help).
    A fresh score: runs before may have left it over 1 (every piece on its calling thread)."""
    threads.use_threads(2)
    begun = threading.Event()
    ran: list[str] = []

    def piece() -> None:
        begun.set()
        ran.append(threading.current_thread().name)
        time.sleep(0.02)

    me = threading.current_thread().name

    def task() -> None:  # the calling thread waits until the worker's pieces are under way
        if threading.current_thread().name == me:
            assert begun.wait(10)
        else:
            parallel.run([piece for _ in range(6)])  # its pieces' futures go to the (busy) worker

    parallel.run([task, task], score=False)
    assert len(ran) == 6 and me in ran and set(ran) != {me}


def test_the_runs_inside_an_unscored_run_keep_out_of_the_score(split, fresh_outcomes):
    """A stalled split inside a task of an unscored run (a node of a pair) is not counted:
    its worker was busy with the other node. Alone, the same run is (the test above)."""
    threads.use_threads(2)
    parallel.run([_stalled_run, lambda: None], score=False)
    assert fresh_outcomes.stalls == 0 and fresh_outcomes.score == parallel.SCORE_START
    _stalled_run()
    assert fresh_outcomes.stalls == 1


def test_every_piece_runs_once_on_whichever_thread_is_free(split):
    hits = np.zeros(200, np.int64)
    for _ in range(50):
        parallel.run([lambda k=k: hits.__setitem__(k, hits[k] + 1) for k in range(200)])
    assert (hits == 50).all()


@pytest.mark.parametrize("a_shape, b_shape", [
    ((40, 40), (40, 20)),  # rows
    ((2, 60), (60, 50)),  # too few rows: columns
    ((5, 7, 40), (40, 9)),  # batch of a, b a matrix
    ((5, 7, 40), (5, 40, 9)),  # batch of both
    ((7, 40), (4, 40, 9)),  # a broadcast over b's batch
    ((4, 1, 7, 40), (3, 40, 9)),  # broadcast batch axes on both sides
    ((1, 7, 40), (5, 40, 9)),  # a's batch of 1 broadcast
])
def test_a_split_product_is_the_whole_one(split, a_shape, b_shape):
    """GEMMs cut by batch, rows or columns (BLAS at one thread per piece): numpy's product; the
    bits may differ from one call's where OpenBLAS picks another kernel for a piece's size, so
    the check is float32 tolerance (and exact for the batch split, one BLAS call per matrix)."""
    from onnxplan.kernels.matmul import _product_parts, split_matmul

    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32)
    want = np.matmul(a, b)
    got = np.full_like(want, np.nan)
    assert _product_parts(a, b, got)[0] == 3
    split_matmul(np, a, b, got)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    got_t = np.full(want.shape[:-2] + want.shape[:-3:-1], np.nan, np.float32).swapaxes(-1, -2)
    split_matmul(np, a, b, got_t)  # a strided output: each piece writes its own part
    np.testing.assert_allclose(got_t, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["add", "multiply", "power"])
def test_a_split_ufunc_is_bitwise_the_whole_one(split, name):
    a = RNG.standard_normal((33, 17)).astype(np.float32)
    b = np.abs(RNG.standard_normal((1, 17))).astype(np.float32) if name == "power" else \
        RNG.standard_normal((33, 17)).astype(np.float32)
    a = np.abs(a) if name == "power" else a
    want = getattr(np, name)(a, b)
    got = np.empty_like(want)
    parallel.ufunc(np, name, got, a, b)
    np.testing.assert_array_equal(got, want)
    parallel.ufunc(np, name, a, a, b)  # in place: each piece reads the rows it writes
    np.testing.assert_array_equal(a, want)


def test_blockwise_split_matches_and_may_overwrite(split):
    x = RNG.standard_normal((5, 4000)).astype(np.float32)
    want = np.tanh(x) * 2
    _xp.blockwise(np, lambda o, v: np.multiply(np.tanh(v), 2, out=o), x, x)
    np.testing.assert_array_equal(x, want)


@pytest.mark.parametrize("op", ["AdamWUpdate", "SGDUpdate"])
@pytest.mark.parametrize("numel", [70_001, 300_000])
def test_the_optimizer_split_is_bitwise_the_one_thread_update(op, numel, monkeypatch):
    """A parameter's update at 3 threads (real piece sizes) equals the one-thread update bit for
    bit; each part's temporaries are its own slice of the declared scratch (shared slices would
    race and differ), which the harness gives exactly."""
    p = RNG.standard_normal(numel).astype(np.float32)
    g = RNG.standard_normal(numel).astype(np.float32)
    m = (RNG.standard_normal(numel) * 0.1).astype(np.float32)
    v = (np.abs(RNG.standard_normal(numel)) * 0.1).astype(np.float32)
    lr, step = np.array([1e-3], np.float32), np.array([3], np.int64)
    if op == "AdamWUpdate":
        ins, names, outs = [lr, step, p, g, m, v], ["lr", "s", "p", "g", "m", "v"], ["p1", "m1", "v1"]
        attrs = {"weight_decay": 0.01, "adam_mode": 1}
    else:
        ins, names, outs, attrs = [lr, p, g], ["lr", "p", "g"], ["p1"], {}
    node = Node("u", op, "onnxplan", names, outs, attrs)
    monkeypatch.setattr(parallel, "MIN_ELEMS", 1 << 14)  # 3 parts, each in several chunks of its scratch

    def run(n: int) -> list[np.ndarray]:
        threads.use_threads(n)
        got = [np.full_like(p, np.nan) for _ in outs]
        call_kernel(node, [a.copy() for a in ins], got)
        return got

    before = threads.current().threads
    try:
        one = run(1)
        assert parallel.parts_for(numel) == 1
        three = run(3)
        assert parallel.parts_for(numel) == 3
    finally:
        threads.use_threads(before)
    for a, b in zip(one, three):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("x_shape,kernel,attrs", [
    ((5, 3, 12, 11), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # taps, padding zeroed
    ((4, 2, 9, 8), (3, 3), {"pads": [1, 1, 1, 1]}),  # one run per tap from a row-padded source
    ((3, 4, 10, 9), (2, 3), {"strides": [2, 1]}),  # no padding: one strided copy of X's windows
    ((1, 5, 9, 8), (3, 3), {"pads": [1, 1, 1, 1]}),  # one image: cut by channels
])
def test_split_columns_are_bitwise_the_whole_ones(split, x_shape, kernel, attrs):
    """im2col and col2im_add cut by images (or one image's channels) across 3 threads: each part
    writes its own images' columns, from its own block of the padded source, the same bits."""
    from onnxplan.ir import windows
    from onnxplan.kernels import im2col

    x = RNG.standard_normal(x_shape).astype(np.float32)
    s, p = attrs.get("strides", [1, 1]), attrs.get("pads", [0, 0, 0, 0])
    out = tuple((i + p[a] + p[a + 2] - k) // s[a] + 1 for a, (i, k) in enumerate(zip(x_shape[2:], kernel)))
    win = windows.window(attrs, x_shape[2:], out, kernel)
    cols = []
    for n in (1, 3):
        threads.use_threads(n)
        col = np.full((x_shape[1], *kernel, x_shape[0], *out), np.nan, np.float32)
        assert len(im2col.image_parts(np, x_shape[0], x_shape[1], col.size)) == n
        src = np.full(x_shape[0] * x_shape[1] * math.prod(windows.extent(win)), np.nan, np.float32)
        im2col.im2col(np, win, x, col, src.reshape(x_shape[:2] + windows.extent(win)) if windows.reads_padding(win) else None)
        dx = np.ones(x_shape, np.float32)
        im2col.col2im_add(np, win, col, dx)
        cols.append((col, dx))
    np.testing.assert_array_equal(cols[0][0], cols[1][0])
    np.testing.assert_array_equal(cols[0][1], cols[1][1])
