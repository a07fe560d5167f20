"""Where the time of a budget's candidates goes, measured in one process against the price.

Per model (NAME:BATCH) and budget fraction (persistent + f x arena of the plain plan): the plain
plan, the "recompute" and the "swap" strategies' plans (budget.strategies, the FLOP estimate),
each bound to its own executor in this one process at one thread, run in `--rounds` interleaved
rounds (the plans' order rotated each round), each round one untimed step, then one step timed
whole (wall and process CPU) and one step timed node by node (Executor.timed_nodes). Reported
per plan, the least over rounds:

  step        wall seconds of the whole step; cpu: the process's CPU seconds of it
  stall, io   the swap runtime's waits for late transfers, the I/O worker's busy time and CPU
  extra       the recomputed copies (recompute plans): measured seconds of the copies (their
              own node timings) against the FLOP estimate of the same nodes
  per node    sum over nodes of the least per-node time, against the FLOP estimate

and the price (budget.decide.price): compute, handling, stall and io_cpu.

Run: PYTHONPATH=. python benchmarks/price_probe.py --models transformer:16 gpt:16 [--rounds 5]
     [--fractions 0.9 0.75 0.6] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field

import onnxplan
from onnxplan.api import Step
from onnxplan.budget.costs import FLOP_COSTS
from onnxplan.budget.decide import price
from onnxplan.budget.strategies import STRATEGIES
from onnxplan.checkpoint.costs import TimeModel
from onnxplan.executor.runner import Executor, initial_parameters, step_batches
from onnxplan.ir.graph import original_name
from onnxplan.planning import PlanOptions, PlanOutcome, plan_step
from onnxplan.threads import use_threads


@dataclass
class Measured:
    """One plan's least-of-rounds figures."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    stall: list[float] = field(default_factory=list)
    io: list[float] = field(default_factory=list)
    io_cpu: list[float] = field(default_factory=list)
    nodes: dict[str, float] = field(default_factory=dict)  # node -> least seconds

    def add_nodes(self, seconds: dict[str, float]) -> None:
        for k, v in seconds.items():
            self.nodes[k] = min(v, self.nodes.get(k, v))


def plans_of(step: Step, f: float) -> tuple[int, dict[str, PlanOutcome]]:
    plain = plan_step(step.graph, PlanOptions())
    budget = plain.plan.persistent_bytes + int(f * plain.plan.arena_bytes)
    out = {"plain": plain}
    for name in ("recompute", "swap"):
        out[name] = STRATEGIES[name](step.graph, budget, FLOP_COSTS, None, PlanOptions())
    return budget, out


def measure(step: Step, outs: dict[str, PlanOutcome], rounds: int) -> dict[str, Measured]:
    params = initial_parameters(step.folder)
    batch = step_batches(step.folder, 1, 0)[0]
    exs = {}
    for name, out in outs.items():
        ex = Executor(out.graph, out.plan)
        ex.load_state(params)
        exs[name] = ex
    got = {name: Measured() for name in outs}
    names = list(outs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            ex, m = exs[name], got[name]
            feed = {k: v for k, v in batch.items() if k in ex.feeds}
            ex.step(feed)
            w0, c0 = time.perf_counter(), time.process_time()
            ex.step(feed)
            m.wall.append(time.perf_counter() - w0)
            m.cpu.append(time.process_time() - c0)
            if ex.swap is not None:
                s = ex.swap.history[-1]
                m.stall.append(s.stall_seconds)
                m.io.append(s.io_seconds)
                m.io_cpu.append(s.io_cpu_seconds)
            m.add_nodes(ex.timed_nodes(feed)[1])
    for ex in exs.values():
        if ex.swap is not None:
            ex.swap.close()
    return got


def node_table(out: PlanOutcome, m: Measured) -> dict:
    """Measured against estimated seconds, for the recomputed copies and for every node, by op."""
    g, est = out.graph, TimeModel()
    nodes = {n.name: n for n in g.nodes}
    copies = [n for n in nodes if original_name(n) != n and n in m.nodes]
    by_op: dict[str, list[float]] = {}
    for name, secs in m.nodes.items():
        n = nodes[name]
        row = by_op.setdefault(n.op_type, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += secs
        row[2] += est.node_seconds(g, n)
    return {"copies": len(copies), "copies_measured": sum(m.nodes[n] for n in copies),
            "copies_estimated": sum(est.node_seconds(g, nodes[n]) for n in copies),
            "nodes": len(m.nodes), "nodes_measured": sum(m.nodes.values()),
            "nodes_estimated": sum(est.node_seconds(g, nodes[n]) for n in m.nodes), "by_op": by_op}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["transformer:16", "gpt:16"])
    ap.add_argument("--fractions", nargs="+", type=float, default=[0.9, 0.75, 0.6])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    use_threads(1)
    doc: dict = {"load_start": os.getloadavg()[0], "rows": []}
    for spec in args.models:
        name, _, batch = spec.partition(":")
        step = onnxplan.load(name, batch=int(batch) if batch else None)
        for f in args.fractions:
            budget, outs = plans_of(step, f)
            got = measure(step, outs, args.rounds)
            print(f"## {spec} f={f} budget {budget / 2**20:.2f} MiB, load {os.getloadavg()[0]:.1f}")
            for pname, out in outs.items():
                p, m = price(out), got[pname]
                t = node_table(out, m)
                row = {"model": spec, "fraction": f, "plan": pname, "peak": out.plan.peak_bytes, "budget": budget,
                       "swaps": len(out.plan.swaps), "moved": p.moved,
                       "price": {"compute": p.compute, "handling": p.handling, "stall": p.stall, "io_cpu": p.io_cpu,
                                 "seconds": p.seconds},
                       "wall": min(m.wall), "cpu": min(m.cpu), "stall": min(m.stall, default=0.0),
                       "io": min(m.io, default=0.0), "io_cpu": min(m.io_cpu, default=0.0),
                       "walls": m.wall, **t}
                doc["rows"].append(row)
                print(f"  {pname:9s} peak {out.plan.peak_bytes / 2**20:6.2f} MiB  predicted {p.seconds * 1e3:7.1f} ms "
                      f"(compute {p.compute * 1e3:.1f} handling {p.handling * 1e3:.1f} stall {p.stall * 1e3:.1f} "
                      f"io_cpu {p.io_cpu * 1e3:.1f}; {len(out.plan.swaps)} swaps, {p.moved / 2**20:.1f} MiB)  "
                      f"measured wall {row['wall'] * 1e3:7.1f} cpu {row['cpu'] * 1e3:7.1f} stall "
                      f"{row['stall'] * 1e3:.1f} io {row['io'] * 1e3:.1f} io_cpu {row['io_cpu'] * 1e3:.1f}; "
                      f"nodes {t['nodes']} {t['nodes_measured'] * 1e3:.1f} vs est {t['nodes_estimated'] * 1e3:.1f}; "
                      f"copies {t['copies']} {t['copies_measured'] * 1e3:.1f} vs est {t['copies_estimated'] * 1e3:.1f}",
                      flush=True)
    doc["load_end"] = os.getloadavg()[0]
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)


if __name__ == "__main__":
    main()
