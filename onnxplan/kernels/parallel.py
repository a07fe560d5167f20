"""One kernel's work split across the process's compute threads (onnxplan.threads).

numpy's ufuncs run on the calling thread; BLAS and torch's operators have pools of their own.
A numpy kernel that is large enough is cut here into `parts` independent pieces (rows of its
output, ranges of a flat array), the first run on the calling thread and the others on a small
pool of worker threads (numpy releases the interpreter lock inside its loops). Pieces write
disjoint parts of the output and read the inputs at the positions they write, so a kernel that
overwrites its input (in place) stays exact, and every element gets the arithmetic it gets on
one thread: the same bits at any thread count. Pieces allocate nothing: a kernel that needs
scratch gives each piece its own slice of the scratch it declared (see kernels/optimizer.py).

The pool's idle workers sleep (not spinning), so they never take a core from BLAS or torch: each
blocks on a lock of its own, which a run releases to wake it (one futex wake, no future, no
queue); a woken worker claims pieces of every run in flight, and the thread that finishes a run's
last piece releases the lock its caller waits on. There are as many workers as compute threads
less the calling one (more are started when that count grows; extra ones stay asleep).

When other processes keep the cores busy, a worker that took a piece may be descheduled (or hold
the interpreter lock the caller needs while descheduled) for up to a scheduler time slice: the
caller waits milliseconds for a piece of 0.1 ms (mlp b64's split products at 2 threads: 5-14 ms
steps instead of 1.1, load 4-6; reports/threads.md, session 12). So `run` keeps score of how its
splits pay off (`outcomes`): each run's time against the calling thread's alone (its own pieces'
time, scaled to all the pieces), averaged; while splits lose on average, the calling thread runs
every piece itself (the same pieces in the same arithmetic: the same bits), handing them out
again every PROBE_SECONDS to see whether the machine has freed up.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from onnxplan import settings, threads
from onnxplan.settings import Settings

__all__ = ["MIN_ELEMS", "Outcomes", "outcomes", "parts_for", "row_parts", "rows", "run", "run_elsewhere", "splits",
           "ufunc"]

# Elements per piece, for a kernel of one pass over its arrays, below which splitting does not
# pay: measured on 2 cores (a VM), a float32 multiply over 300K elements took 0.036 ms on one
# thread and 0.071 ms in two pieces (the hand-off and the wake-up of a sleeping worker), over 1M
# the same, over 4M 0.72x. A kernel of `passes` passes per element (the optimizer's ~12) splits
# from MIN_ELEMS / passes. $ONNXPLAN_PARALLEL_MIN_ELEMS lowers it (the kernel tests' small
# arrays through the split paths).
MIN_ELEMS = Settings.from_environ().parallel_min_elems  # read at import (onnxplan.settings)
_lock = threading.Lock()
# The score: an average (weight SCORE_WEIGHT a run) of each split run's time over the calling
# thread's estimated time alone, each capped at RATIO_CAP (a warm-up's slow first pieces weigh
# little); over 1, pieces run on the calling thread. On an idle machine a split of two balanced
# pieces scores ~0.5-0.8 (a worker starts its piece 0.01-0.03 ms after the caller).
SCORE_START = 0.75
SCORE_WEIGHT = 0.125
RATIO_CAP = 2.0
PROBE_SECONDS = 0.05  # while splits lose, one run is handed out this often
splits = 0  # runs of more than one piece (benchmarks count them per node)
_active: list[_Pieces] = []  # runs whose pieces were handed out, until they are all done
_unscored = threading.local()  # depth: > 0 while this thread runs a task of an unscored run


class Outcomes:
    """How this process's splits have paid off: the score, when to probe next, and the stalls
    (split runs that took longer than the calling thread alone would have)."""

    def __init__(self) -> None:
        self.score = SCORE_START
        self.next_probe = 0.0
        self.stalls = 0

    def hand_out(self) -> bool:
        """Whether this run's pieces go to the workers (splits pay, or it is time to probe)."""
        if self.score <= 1.0:
            return True
        now = time.perf_counter()
        if now < self.next_probe:
            return False
        self.next_probe = now + PROBE_SECONDS
        return True

    def note(self, took: float, own: float, ran: int, count: int) -> None:
        """A run of `count` pieces took `took` s, `ran` of them on the calling thread in `own` s."""
        if not ran or own <= 0.0:
            return  # the workers ran every piece: no estimate of the caller alone
        ratio = took / (own * count / ran)
        self.stalls += ratio > 1.0
        paid = self.score <= 1.0
        self.score += SCORE_WEIGHT * (min(ratio, RATIO_CAP) - self.score)
        if paid and self.score > 1.0:  # splits just began to lose: the first probe a while later
            self.next_probe = time.perf_counter() + PROBE_SECONDS


outcomes = Outcomes()


def parts_for(numel: int, xp=np, min_elems: int | None = None, passes: int = 1) -> int:
    """How many pieces a host kernel over `numel` elements is cut into: the compute threads,
    fewer when the pieces would be smaller than `min_elems` (MIN_ELEMS / `passes`, the kernel's
    passes over each element); 1 on a GPU."""
    min_elems = max(1, (MIN_ELEMS if min_elems is None else min_elems) // max(1, passes))
    if xp is not np or numel < 2 * min_elems:
        return 1
    return max(1, min(threads.current().compute, numel // min_elems))


class _Worker(threading.Thread):
    """A kernel worker: asleep on its own lock until a run releases it, then it claims pieces of
    every run in flight (`_active`) until none is left, and sleeps again."""

    def __init__(self, k: int) -> None:
        super().__init__(name=f"onnxplan-kernel_{k}", daemon=True)
        self._wake = threading.Lock()
        self._wake.acquire()

    def nudge(self) -> None:
        """Wake this worker (a no-op when a wake-up is pending: it looks at every run in flight)."""
        try:
            self._wake.release()
        except RuntimeError:  # released already, not yet taken: the worker is on its way
            pass

    def run(self) -> None:
        adopted = -1  # the policy's count (threads.generation) this thread last applied to itself
        while True:
            self._wake.acquire()
            if adopted != threads.generation():  # torch's thread count is per thread: set ours
                adopted = threads.generation()
                threads.adopt_in_this_thread()
            for pieces in tuple(_active):
                pieces.drain()


_pool: list[_Worker] = []


def _workers(need: int) -> list[_Worker]:
    """The workers, at least `need` of them and the compute threads less the calling one:
    started on first use, more when that count grows (none is stopped: idle ones sleep)."""
    n = max(need, threads.current().compute - 1)
    if len(_pool) < n:
        with _lock:
            while len(_pool) < n:
                worker = _Worker(len(_pool))
                worker.start()
                _pool.append(worker)
    return _pool


class _Pieces:
    """One run's pieces, claimed one at a time by whichever thread is free (the caller and the
    workers alike), and counted when done: the caller returns when every piece is done, never
    waiting for a worker that has not started (it takes that worker's pieces itself)."""

    def __init__(self, tasks: Sequence[Callable[[], None]]) -> None:
        self.tasks = tasks
        self.claims = itertools.count()  # next() is atomic under the interpreter lock
        self.lock = threading.Lock()
        self.left = len(tasks)
        self.done = threading.Lock()  # held until the last piece is done (its thread releases it)
        self.done.acquire()
        self.error: BaseException | None = None

    def drain(self) -> int:
        """Run unclaimed pieces until none is left (on whichever thread calls it); how many it ran."""
        ran = 0
        while (i := next(self.claims)) < len(self.tasks):
            ran += 1
            error = None
            try:
                self.tasks[i]()
            except BaseException as exc:  # noqa: BLE001 - re-raised by the caller once all are done
                error = exc
            with self.lock:
                self.error = self.error or error
                self.left -= 1
                if self.left == 0:
                    self.done.release()
        return ran

    def wait(self) -> None:
        """Return when every piece is done."""
        self.done.acquire()
        self.done.release()


def _without_score(task: Callable[[], None]) -> Callable[[], None]:
    """`task`, with the runs it makes itself kept out of the score (a node of a pair: its pieces
    wait for a worker busy with the other node, which says nothing of how splits pay)."""
    def run() -> None:
        _unscored.depth = getattr(_unscored, "depth", 0) + 1
        try:
            task()
        finally:
            _unscored.depth -= 1
    return run


def _help(pieces: _Pieces) -> None:
    """While `pieces` has pieces running elsewhere, run unclaimed pieces of the other runs in
    flight (a run begun on a worker: the other node of a pair, executor/interop.py) instead of
    sleeping; stop when none is left to claim."""
    while pieces.left:
        if not any(other is not pieces and other.drain() for other in tuple(_active)):
            return


def _hush_gemm_pool() -> None:
    """The GEMM pool's workers (kernels/gemm_calls.py) that spin for their next job sleep now:
    this pool's workers need the cores."""
    from onnxplan.kernels import gemm_calls

    gemm = gemm_calls.pool()
    if gemm is not None:
        gemm.hush()


def run(tasks: Sequence[Callable[[], None]], score: bool = True) -> None:
    """Run every task on this thread and the pool's workers, each task on whichever thread
    claims it first; return when all are done (the first failure is raised, after all have
    finished). A worker the scheduler has not started yet (other processes busy on the cores)
    costs nothing: this thread runs the pieces it would have run, so a step never waits a time
    slice for a descheduled thread (as OpenBLAS's and OpenMP's static splits do:
    reports/threads.md, session 10); it waits only for pieces already begun elsewhere. While
    splits have been losing (the module's docstring), it runs every piece itself. `score=False`:
    tasks of unlike sizes (two nodes at once: executor/interop.py) whose run says nothing of
    how splits pay (the estimate of the calling thread alone assumes like pieces), nor do the
    runs the tasks make themselves."""
    global splits
    score = score and not getattr(_unscored, "depth", 0)
    if len(tasks) <= 1:
        for task in tasks:
            task()
        return
    splits += 1
    pieces = _Pieces(tasks if score else [_without_score(task) for task in tasks])
    if not outcomes.hand_out():  # splits have been losing: every piece here
        pieces.drain()
    else:
        helpers = min(len(tasks) - 1, max(1, threads.current().compute - 1))
        _hush_gemm_pool()
        _active.append(pieces)  # list.append and remove are atomic under the interpreter lock
        for worker in _workers(helpers)[:helpers]:
            worker.nudge()
        start = time.perf_counter()
        ran = pieces.drain()
        own_end = time.perf_counter()
        _help(pieces)  # a worker that has not started finds no piece left when it does
        pieces.wait()
        _active.remove(pieces)
        if score:
            outcomes.note(time.perf_counter() - start, own_end - start, ran, len(tasks))
    if pieces.error is not None:
        raise pieces.error


def run_elsewhere(run_with: Callable[[int], tuple[float, float, int, int]]) -> None:
    """A split run on a pool outside this module (kernels/gemm_calls.py): `run_with(helpers)` runs
    it with up to that many helper threads beside the calling one (none while splits have been
    losing: the module's docstring) and returns (seconds taken, the calling thread's own seconds,
    pieces it ran, pieces); scored as `run` scores its runs."""
    global splits
    splits += 1
    hand_out = outcomes.hand_out()
    took, own, ran, count = run_with(max(1, threads.current().compute - 1) if hand_out else 0)
    if hand_out and not getattr(_unscored, "depth", 0):
        outcomes.note(took, own, ran, count)


def row_parts(xp, rows: int, width: int, passes: int = 1, min_rows: int = 1) -> list[tuple[int, int]]:
    """(lo, hi) ranges of `rows` rows of `width` elements, one per part for the compute threads
    (parts_for, a kernel of `passes` passes per element), each of `min_rows` rows or more; one
    range when small or where ONNXPLAN_SPLIT_KERNELS=0 (the row-wise kernels that settings
    switches: softmax, the norms, a convolution's chunk)."""
    parts = parts_for(rows * width, xp, passes=passes) if settings.current().split_kernels else 1
    return bounds(rows, max(1, min(parts, rows // max(1, min_rows))))


def bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous (lo, hi) ranges covering range(n), as equal as can be."""
    return [(n * k // parts, n * (k + 1) // parts) for k in range(parts)]


def rows(out, fn: Callable[..., None], *ins, xp=np, min_elems: int | None = None) -> None:
    """fn(out_rows, *in_rows) over pieces of out's first axis; inputs of another shape are
    broadcast to out's (scalars passed as they are). One piece when out is small or has too
    few rows."""
    parts = parts_for(out.size, xp, min_elems) if out.ndim else 1
    parts = min(parts, out.shape[0]) if out.ndim else 1
    if parts <= 1:
        fn(out, *ins)
        return
    views = [x if not hasattr(x, "shape") or x.shape == out.shape else xp.broadcast_to(x, out.shape) for x in ins]

    def piece(lo: int, hi: int) -> Callable[[], None]:
        return lambda: fn(out[lo:hi], *(v[lo:hi] if hasattr(v, "shape") else v for v in views))

    run([piece(lo, hi) for lo, hi in bounds(out.shape[0], parts)])


def ufunc(xp, name: str, out, *ins, **kwargs) -> None:
    """xp.<name>(*ins, out=out, **kwargs), cut into pieces of out's rows when it is large."""
    op = getattr(xp, name)
    if parts_for(out.size, xp) <= 1:  # one piece: called as it is, ~4 us sooner than through rows
        op(*ins, out=out, **kwargs)
        return
    rows(out, lambda o, *xs: op(*xs, out=o, **kwargs), *ins, xp=xp)
