"""Kernels split across our pool: per op type at 1 and 2 threads, and the step paired with the split
switched off, in one process (what a loaded machine still lets one measure).

Per model: the default plan is made once, then bound four times (threads 1 and 2, each with
ONNXPLAN_SPLIT_KERNELS on and off: onnxplan.settings.split_kernels, put in force around each
executor's binding and steps).
1. Per op type: the least over --repeat steps of each op type's summed kernel time (a clock
   around every kernel, `Executor.timed_nodes`), at 1 and 2 threads with the split on, and at 2
   threads with it off; the four executors' steps interleaved.
2. Paired step: the executors at 2 threads with the split on and off run alternately, --rounds
   rounds of --steps steps each after a warm-up; the median step of each, and of the ratios.
The load average (`os.getloadavg`) is printed before and after. Prints Markdown.

Usage: python benchmarks/kernel_threads.py [MODEL[:BATCH] ...] [--repeat 8] [--rounds 4] [--steps 4]
           [--top 12] [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import replace

from onnxplan import settings
from onnxplan.executor.prepare import Prepared, prepare
from onnxplan.executor.runner import Executor, initial_parameters, step_batches
from onnxplan.loading.request import LoadRequest
from onnxplan.threads import use_threads

__all__ = ["main"]


# wall: the step's time; cpu: the calling thread's CPU time (time.thread_time), which other
# processes on the cores disturb far less: at 2 threads, the share of a split kernel's work the
# calling thread kept (the least over steps: where the worker took its pieces).
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=["nnt-conv2d", "transformer:16", "gpt:16", "mlp:64"])
    p.add_argument("--repeat", type=int, default=8, help="steps whose least per op type is kept")
    p.add_argument("--rounds", type=int, default=4, help="alternations of the paired step")
    p.add_argument("--steps", type=int, default=4, help="steps per executor per round")
    p.add_argument("--top", type=int, default=12, help="op types shown (the slowest at 1 thread)")
    p.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                   help="cpu: the calling thread's CPU time per kernel (its share of a split kernel)")
    return p.parse_args()


def _request(model: str) -> LoadRequest:
    name, _, batch = model.partition(":")
    return LoadRequest(name, batch=int(batch)) if batch else LoadRequest(name)


class _Run:
    """One executor of the plan, bound at `threads` with the split on or off."""

    def __init__(self, prep: Prepared, threads: int, split: bool, params: dict, batches: list) -> None:
        self.threads, self.split, self.params, self.batches = threads, split, params, batches
        self._enter()
        self.ex = Executor(prep.graph, prep.plan)
        self.ex.load_state(params)
        self.step()  # warm-up (the pool, torch's first calls, the fused loop's compile)

    def _enter(self) -> None:
        """This run's threads and split in force (plain kernels read the setting as they run)."""
        settings.use(replace(settings.current(), split_kernels=self.split))
        use_threads(self.threads)

    def step(self) -> float:
        self._enter()
        t0 = time.perf_counter()
        self.ex.step(self.batches[0])
        return time.perf_counter() - t0

    def time_ops(self, least: dict[str, float], clock) -> None:
        """One step with `clock` around every kernel: `least` keeps each op type's least sum."""
        self._enter()
        _, seconds = self.ex.timed_nodes(self.batches[0], clock)
        by_op: dict[str, float] = {}
        for c in self.ex.calls:
            by_op[c.node.op_type] = by_op.get(c.node.op_type, 0.0) + seconds[c.node.name]
        for op, s in by_op.items():
            least[op] = min(least.get(op, s), s)


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f}"


def model_tables(model: str, args: argparse.Namespace) -> list[str]:
    prep = prepare(_request(model))
    params, batches = initial_parameters(prep.folder), step_batches(prep.folder, 1, 0)
    runs = {(t, s): _Run(prep, t, s, params, batches) for t in (1, 2) for s in (True, False)}
    ops: dict[tuple[int, bool], dict[str, float]] = {key: {} for key in runs}
    for _ in range(args.repeat):  # interleaved: the machine's load falls on all alike
        for key, run in runs.items():
            run.time_ops(ops[key], CLOCKS[args.clock])
    top = sorted(ops[(1, True)], key=lambda op: -ops[(1, True)][op])[:args.top]
    lines = [f"### {model} ({args.clock} clock)", "", "| op type | 1t ms | 2t ms | 2t / 1t | 2t, split off, ms | 2t on / off |",
             "|---|---|---|---|---|---|"]
    for op in top + ["(all)"]:
        one, two, off = (sum(o.values()) if op == "(all)" else o.get(op, 0.0)
                         for o in (ops[(1, True)], ops[(2, True)], ops[(2, False)]))
        lines.append(f"| {op} | {_ms(one)} | {_ms(two)} | {two / one:.2f} | {_ms(off)} | {two / off:.2f} |")
    on, off = runs[(2, True)], runs[(2, False)]
    steps_on: list[float] = []
    steps_off: list[float] = []
    ratios = []
    for _ in range(args.rounds):
        a = statistics.median(on.step() for _ in range(args.steps))
        b = statistics.median(off.step() for _ in range(args.steps))
        steps_on.append(a)
        steps_off.append(b)
        ratios.append(a / b)
    lines += ["", f"Paired step at 2 threads, {args.rounds} rounds of {args.steps} steps: split on "
              f"{' / '.join(_ms(s) for s in steps_on)} ms, off {' / '.join(_ms(s) for s in steps_off)} ms; "
              f"median on / off **{statistics.median(ratios):.2f}**", ""]
    return lines


def main() -> None:
    args = _parse()
    out = [f"load average at the start: {os.getloadavg()[0]:.1f}", ""]
    for model in args.models:
        out += model_tables(model, args)
        print("\n".join(out), flush=True)
        out = []
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
