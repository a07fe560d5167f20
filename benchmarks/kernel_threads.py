"""Kernels split across our pool: per op type at 1 and 2 threads, and the step paired with the split
switched off, in one process (what a loaded machine still lets one measure).

Per model: the default plan is made once, then bound four times (threads 1 and 2, each with
ONNXPLAN_SPLIT_KERNELS on and off: onnxplan.settings.split_kernels, put in force around each
executor's binding and steps).
1. Per op type: the least over --repeat steps of each op type's summed kernel time (a clock
   around every kernel, `Executor.timed_nodes`), at 1 and 2 threads with the split on, and at 2
   threads with it off; the four executors' steps interleaved. "split at 2t": the share of the
   op type's 1-thread time in nodes that cut their work into pieces for our pool at 2 threads
   (counted in one step: kernels.parallel's count, read as the clock of `timed_nodes`); what is not split runs
   on one thread at 2 (Amdahl: the step at 2 threads is at least the unsplit time plus half the
   split time, printed under the table as "serial share" and "Amdahl 2t / 1t"). These two do not
   depend on the machine's load (a count, and 1-thread times).
2. Paired steps: the executors at 1 thread, 2 threads, 2 threads with the split off and 2 threads
   without two nodes at once (the four above are bound with ONNXPLAN_INTEROP on, the fifth with
   it off, the default: executor/interop.py) run in turn, --rounds rounds of --steps steps each after a warm-up; each round's
   median step, the median of the rounds' ratios 2t / 1t, split on / off and pairs on / off, and
   the least steps. The per-op table times every node alone (`timed_nodes`: no pairs).
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
from onnxplan.kernels import parallel
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

    def __init__(self, prep: Prepared, threads: int, split: bool, params: dict, batches: list,
                 interop: str = "all") -> None:
        self.threads, self.split, self.params, self.batches = threads, split, params, batches
        self._enter()
        with settings.override(interop=interop):
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

    def node_seconds(self, clock) -> dict[str, float]:
        self._enter()
        return self.ex.timed_nodes(self.batches[0], clock)[1]

    def time_nodes(self, least: dict[str, float], clock) -> None:
        """One step with `clock` around every kernel: `least` keeps each node's least time."""
        for name, sec in self.node_seconds(clock).items():
            least[name] = min(least.get(name, sec), sec)


def _split_nodes(run: _Run) -> set[str]:
    """The nodes that cut their work into pieces for the pool in one step of `run`
    (kernels.parallel's count of runs of more than one piece, read as the clock of
    `timed_nodes`; whether the pieces then ran on one thread or two)."""
    splits = run.node_seconds(lambda: float(parallel.splits))
    return {name for name, n in splits.items() if n > 0}


def _pairs(run: _Run) -> int:
    """How many pairs of nodes the executor runs at once (executor/interop.py)."""
    return 0 if run.ex.paired is None else len(run.ex.calls) - len(run.ex.paired)


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f}"


def _by_op(runs: dict, least: dict[str, float], only: set[str] | None = None) -> dict[str, float]:
    """Per op type, the sum of its nodes' least times (of the nodes in `only`, where given)."""
    calls = next(iter(runs.values())).ex.calls
    out: dict[str, float] = {}
    for c in calls:
        if only is None or c.node.name in only:
            out[c.node.op_type] = out.get(c.node.op_type, 0.0) + least[c.node.name]
    return out


def _op_table(model: str, args: argparse.Namespace, runs: dict) -> list[str]:
    nodes: dict[tuple[int, bool], dict[str, float]] = {key: {} for key in runs if key != "no pairs"}
    for _ in range(args.repeat):  # interleaved: the machine's load falls on all alike
        for key in nodes:
            runs[key].time_nodes(nodes[key], CLOCKS[args.clock])
    ops = {key: _by_op(runs, least) for key, least in nodes.items()}
    split_names = _split_nodes(runs[(2, True)])
    split = _by_op(runs, nodes[(1, True)], split_names)
    top = sorted(ops[(1, True)], key=lambda op: -ops[(1, True)][op])[:args.top]
    lines = [f"### {model} ({args.clock} clock)", "",
             "| op type | 1t ms | share of 1t | split at 2t | 2t ms | 2t / 1t | 2t, split off, ms | 2t on / off |",
             "|---|---|---|---|---|---|---|---|"]
    total = sum(ops[(1, True)].values())
    for op in top + ["(all)"]:
        one, two, off, cut = (sum(o.values()) if op == "(all)" else o.get(op, 0.0)
                              for o in (ops[(1, True)], ops[(2, True)], ops[(2, False)], split))
        lines.append(f"| {op} | {_ms(one)} | {one / total:.0%} | {cut / one:.0%} | {_ms(two)} | {two / one:.2f} | "
                     f"{_ms(off)} | {two / off:.2f} |")
    serial = (total - sum(split.values())) / total
    ex = runs[(2, True)].ex
    paired = {ex.calls[k].node.name for pair in ex.pairs for k in pair} - split_names
    alone = sum(nodes[(1, True)][name] for name in paired) / total
    lines += ["", f"Serial share at 2 threads (1t time of the nodes that do not split): **{serial:.0%}**; "
              f"Amdahl 2t / 1t >= {serial + (1 - serial) / 2:.2f}. Of it, in pairs (two nodes at once, "
              f"{len(ex.pairs)} pairs): {alone:.0%}; serial share less the paired nodes "
              f"**{serial - alone:.0%}**", ""]
    return lines


def _paired_steps(args: argparse.Namespace, runs: dict) -> list[str]:
    """1 thread, 2 threads, 2 threads with the split off and with pairs off, interleaved round by round."""
    keys = [(1, True), (2, True), (2, False), "no pairs"]
    steps: dict[tuple[int, bool] | str, list[float]] = {key: [] for key in keys}
    stalls = parallel.outcomes.stalls
    for _ in range(args.rounds):
        for key in keys:
            steps[key].append(statistics.median(runs[key].step() for _ in range(args.steps)))
    two_one = [b / a for a, b in zip(steps[(1, True)], steps[(2, True)])]
    on_off = [a / b for a, b in zip(steps[(2, True)], steps[(2, False)])]
    pairs = [a / b for a, b in zip(steps[(2, True)], steps["no pairs"])]
    shown = {(1, True): "1t", (2, True): "2t", (2, False): "2t split off", "no pairs": "2t pairs off"}
    return [f"Paired steps, {args.rounds} rounds of {args.steps} steps (ms, each round's median): "
            + "; ".join(f"{shown[k]} {' / '.join(_ms(s) for s in steps[k])}" for k in keys)
            + f". Median of the rounds' 2t / 1t **{statistics.median(two_one):.2f}** (least steps: "
            f"{_ms(min(steps[(1, True)]))} / {_ms(min(steps[(2, True)]))} ms), 2t split on / off "
            f"**{statistics.median(on_off):.2f}**, 2t pairs on / off **{statistics.median(pairs):.2f}** "
            f"({_pairs(runs[(2, True)])} pairs)"
            + f"; split runs that lost (kernels.parallel.outcomes) {parallel.outcomes.stalls - stalls}, "
            f"score at the end {parallel.outcomes.score:.2f}", ""]


def model_tables(model: str, args: argparse.Namespace) -> list[str]:
    prep = prepare(_request(model))
    params, batches = initial_parameters(prep.folder), step_batches(prep.folder, 1, 0)
    runs: dict = {(t, s): _Run(prep, t, s, params, batches) for t in (1, 2) for s in (True, False)}
    runs["no pairs"] = _Run(prep, 2, True, params, batches, interop="off")
    return _op_table(model, args, runs) + _paired_steps(args, runs)


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
