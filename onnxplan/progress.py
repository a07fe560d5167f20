"""Progress of long work on stderr, in every mode: a bar on a terminal, plain lines otherwise.

    with Progress("bench", total=12) as p:
        p.update("mlp auto: planning")        # the current item
        p.update("mlp auto: done", advance=1)
        p.finish("12 rows")                   # the closing line (lines mode: when it spoke)

On a terminal (stderr) a rich bar (with a total) or spinner shows the current item and is
erased when done. Otherwise (CI logs, pipes) plain lines `onnxplan: LABEL: [k/N] ITEM (T s)`:
nothing for the first QUIET_SECONDS (quick work stays silent), then a line when the item
changes (at most one per 5 s) and a heartbeat every EVERY_SECONDS while it does not, and a
closing line. Work started inside other work (an ILP solve while `run` plans) shows as the
outer bar's item on a terminal, and as its own lines otherwise.

ONNXPLAN_PROGRESS selects the mode: auto (default), bar, lines, off.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING

from onnxplan import settings
from onnxplan.settings import ENV

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress

__all__ = ["MODE_ENV", "Progress"]

MODE_ENV = ENV["progress"]
QUIET_SECONDS = 5.0
EVERY_SECONDS = 10.0
_MIN_GAP = 5.0  # item changes print at most this often
_active: list[Progress] = []  # bars showing now (one live display at a time)


def _mode() -> str:
    mode = settings.current().progress
    if mode == "auto":
        stream = sys.stderr
        return "bar" if stream is not None and stream.isatty() else "lines"
    return mode if mode in ("bar", "lines", "off") else "lines"


class Progress:
    """One piece of long work (see the module docstring). `enabled` False: silent."""

    def __init__(self, label: str, total: int | None = None, *, enabled: bool = True) -> None:
        self.label, self.total = label, total
        self.mode = _mode() if enabled else "off"
        self.done = 0
        self.item = ""
        self.spoke = False
        self._start = self._last = time.monotonic()
        self._printed_item: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: RichProgress | None = None
        self._outer: Progress | None = None

    # ---- lifecycle -------------------------------------------------------
    def __enter__(self) -> Progress:
        if self.mode == "bar":
            if _active:  # nested: the outer bar shows this work as its item
                self._outer = _active[-1]
                self._outer_item = self._outer.item
            else:
                self._start_bar()
                _active.append(self)
        elif self.mode == "lines":
            self._thread = threading.Thread(target=self._heartbeat, name="onnxplan-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        if self._bar is not None:
            self._bar.stop()
            _active.remove(self)
        elif self._outer is not None:
            self._outer.update(self._outer_item)

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        columns = [SpinnerColumn(), TextColumn("{task.description}")]
        if self.total is not None:
            columns += [BarColumn(), MofNCompleteColumn()]
        self._bar = RichProgress(*columns, TimeElapsedColumn(), console=Console(stderr=True), transient=True)
        self._task = self._bar.add_task(self.label, total=self.total)
        self._bar.start()

    # ---- reporting -------------------------------------------------------
    def update(self, item: str | None = None, advance: int = 0) -> None:
        """Set the current item and/or count `advance` more items done."""
        with self._lock:
            if item is not None:
                self.item = item
            self.done += advance
        if self.mode == "bar":
            if self._bar is not None:
                self._bar.update(self._task, advance=advance, description=self._text())
            elif self._outer is not None:
                self._outer.update(f"{self._outer_item} | {self._text()}")
        elif self.mode == "lines":
            now = time.monotonic()
            if (now - self._start >= QUIET_SECONDS and now - self._last >= _MIN_GAP
                    and self.item != self._printed_item):
                self._line()

    def finish(self, summary: str) -> None:
        """The closing line: printed in lines mode when this work spoke before."""
        if self.mode == "lines" and self.spoke:
            self._emit(f"{summary} ({time.monotonic() - self._start:.0f} s)")

    def _text(self) -> str:
        count = f"{self.done}/{self.total} " if self.total is not None else ""
        return f"{self.label}: {count}{self.item}".rstrip(": ")

    def _line(self) -> None:
        with self._lock:
            self._printed_item = self.item
            text = self._text()
        self._emit(f"{text} ({time.monotonic() - self._start:.0f} s)", prefix=False)

    def _emit(self, text: str, prefix: bool = True) -> None:
        self._last = time.monotonic()
        self.spoke = True
        line = f"onnxplan: {self.label}: {text}" if prefix else f"onnxplan: {text}"
        try:
            print(line, file=sys.stderr, flush=True)
        except (OSError, ValueError):  # stderr closed: progress is not worth a crash
            pass

    def _heartbeat(self) -> None:
        while not self._stop.wait(0.5):
            now = time.monotonic()
            if now - self._start < QUIET_SECONDS:
                continue
            if now - self._last >= EVERY_SECONDS or (self.item != self._printed_item and now - self._last >= _MIN_GAP):
                self._line()


def solve_cp_sat(solver, model, what: str):
    """`solver.solve(model)` (OR-tools CP-SAT) under a Progress named `what`: the time limit
    while it runs, then the status and the gap between the solution and the proven bound."""
    limit = solver.parameters.max_time_in_seconds
    with Progress(what) as progress:
        progress.update(f"CP-SAT solving, time limit {limit:.1f} s" if limit < float("inf") else "CP-SAT solving")
        status = solver.solve(model)
        name = solver.status_name(status).lower()
        if name in ("optimal", "feasible"):
            obj, bound = solver.objective_value, solver.best_objective_bound
            name += f", gap {abs(obj - bound) / max(abs(obj), 1e-9):.1%}"
        elif name == "unknown":
            name = "no solution within the time limit"
        progress.finish(name)
    return status
