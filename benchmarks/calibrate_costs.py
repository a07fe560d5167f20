"""Calibrate the FLOP estimate's roofline (onnxplan.checkpoint.costs.CPU_NUMPY) on this machine.

For each model (NAME:BATCH) the plain plan runs in this process at one thread (the thread count
the decision benchmark measures at); each node's least time over `--rounds` node-timed steps
(Executor.timed_nodes, after two untimed steps) is kept with the node's FLOPs and bytes
(checkpoint.costs.node_flops / node_bytes), its op type and its kind of work (work_kind). Then:
  1. the seconds per call: the CALL_QUANTILE of the node times (the least nodes are a bound
     kernel's call and nothing else); the rates (matmul, conv, conv_grad, elementwise FLOP/s)
     and the bandwidth fitted by a coordinate search in log space minimising the absolute error of the
     summed time of each (model, op type), each model weighted by 1 / its measured step (a
     large model does not drown the small ones);
  2. each op type of elementwise work measured at OP_FLOOR or more over the models gets the
     factor measured / predicted (Machine.op_factor: norms, pools, gathers are several passes);
  3. the rates refitted with the factors.
Prints the fit as Machine fields to commit, the error per model and per op type before and after;
`--json` keeps the samples; `--samples FILE...` fits from kept samples without running, each
node's least time over the files (runs of the same plans: least-of-N across runs).

Run (an idle machine; state the load): PYTHONPATH=. python benchmarks/calibrate_costs.py
     [--models transformer:16 gpt:16 resnet18:8 vgg16:8] [--rounds 5] [--json samples.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass, replace
from typing import Any

import onnxplan
from onnxplan.checkpoint.costs import CPU_NUMPY, Machine, node_bytes, node_flops, work_kind
from onnxplan.executor.runner import Executor, initial_parameters, step_batches
from onnxplan.planning import PlanOptions, plan_step
from onnxplan.threads import use_threads

FIELDS = ("matmul_flops", "conv_flops", "conv_grad_flops", "elementwise_flops", "bandwidth")
CALL_QUANTILE = 0.1
OP_FLOOR = 0.5e-3  # seconds over the models' steps: an op type measured less keeps factor 1


@dataclass(frozen=True)
class Sample:
    model: str
    op: str
    kind: str  # work_kind
    flops: float
    nbytes: int
    seconds: float  # least measured
    weight: float  # 1 / the model's measured step


def samples_of(spec: str, rounds: int) -> list[Sample]:
    name, _, batch = spec.partition(":")
    step = onnxplan.load(name, batch=int(batch) if batch else None)
    out = plan_step(step.graph, PlanOptions())
    ex = Executor(out.graph, out.plan)
    ex.load_state(initial_parameters(step.folder))
    feed = {k: v for k, v in step_batches(step.folder, 1, 0)[0].items() if k in ex.feeds}
    least: dict[str, float] = {}
    ex.step(feed)
    ex.step(feed)
    for _ in range(rounds):
        for k, v in ex.timed_nodes(feed)[1].items():
            least[k] = min(v, least.get(k, v))
    nodes = {n.name: n for n in out.graph.nodes}
    total = sum(least.values())
    g = out.graph
    return [Sample(spec, nodes[k].op_type, work_kind(nodes[k]), node_flops(g, nodes[k]), node_bytes(g, nodes[k]),
                   v, 1 / total) for k, v in least.items()]


def predict(m: Machine, s: Sample) -> float:
    return m.seconds(s.flops, s.nbytes, s.op, s.kind)


def groups(samples: list[Sample]) -> dict[tuple[str, str], list[Sample]]:
    out: dict[tuple[str, str], list[Sample]] = {}
    for s in samples:
        out.setdefault((s.model, s.op), []).append(s)
    return out


def error(m: Machine, grouped: dict[tuple[str, str], list[Sample]]) -> float:
    return sum(abs(sum(predict(m, s) - s.seconds for s in mine)) * mine[0].weight for mine in grouped.values())


def fit_rates(m: Machine, grouped: dict[tuple[str, str], list[Sample]], sweeps: int) -> Machine:
    """Coordinate search in log space: each field tried at its value x 2^(k/8), k in -32..32,
    the best kept, every field in turn, `sweeps` times."""
    def scaled(m: Machine, name: str, factor: float) -> Machine:
        kw: dict[str, Any] = {name: (getattr(m, name) or m.matmul_flops) * factor}
        return replace(m, **kw)

    for _ in range(sweeps):
        for name in FIELDS:
            m = min((scaled(m, name, 2 ** (k / 8)) for k in range(-32, 33)), key=lambda c: error(c, grouped))
    return m


def fit(samples: list[Sample], start: Machine = CPU_NUMPY) -> Machine:
    grouped = groups(samples)
    times = sorted(s.seconds for s in samples)
    call = float(f"{times[int(len(times) * CALL_QUANTILE)]:.2g}")
    m = fit_rates(replace(start, op_factor={}, call_seconds=call), grouped, 6)
    ops: dict[str, list[Sample]] = {}
    for s in samples:
        if s.kind == "elementwise":
            ops.setdefault(s.op, []).append(s)
    factors = {}
    for op, mine in sorted(ops.items()):
        measured = sum(s.seconds - m.call_seconds for s in mine)
        if sum(s.seconds for s in mine) >= OP_FLOOR and measured > 0:
            predicted = sum(predict(m, s) - m.call_seconds for s in mine)
            factors[op] = float(f"{measured / predicted:.2g}")
    return fit_rates(replace(m, op_factor=factors), grouped, 3)


def report(samples: list[Sample], before: Machine, after: Machine) -> list[str]:
    lines = ["fit: " + ", ".join(f"{k}={getattr(after, k):.3g}" for k in (*FIELDS, "call_seconds"))
             + f", op_factor={dict(after.op_factor)}",
             "| model | measured ms | estimate before | after |", "|---|---|---|---|"]
    for spec in dict.fromkeys(s.model for s in samples):
        mine = [s for s in samples if s.model == spec]
        lines.append(f"| {spec} | {sum(s.seconds for s in mine) * 1e3:.1f} | "
                     f"{sum(predict(before, s) for s in mine) * 1e3:.1f} | {sum(predict(after, s) for s in mine) * 1e3:.1f} |")
    lines += ["", "| op | nodes | measured ms | after ms |", "|---|---|---|---|"]
    ops: dict[str, list[Sample]] = {}
    for s in samples:
        ops.setdefault(s.op, []).append(s)
    for op, mine in sorted(ops.items(), key=lambda kv: -sum(s.seconds for s in kv[1])):
        lines.append(f"| {op} | {len(mine)} | {sum(s.seconds for s in mine) * 1e3:.2f} | "
                     f"{sum(predict(after, s) for s in mine) * 1e3:.2f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["transformer:16", "gpt:16", "resnet18:8", "vgg16:8"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--samples", nargs="*", default=None, help="fit from samples kept by --json (nothing runs)")
    args = ap.parse_args()
    use_threads(1)
    load = os.getloadavg()[0]
    if args.samples:
        runs = []
        for path in args.samples:
            with open(path) as fh:
                runs.append([Sample(**d) for d in json.load(fh)])
        samples = [min(same, key=lambda s: s.seconds) for same in zip(*runs)]
    else:
        samples = [s for spec in args.models for s in samples_of(spec, args.rounds)]
    after = fit(samples)
    print(f"load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; {len(samples)} nodes")
    print("\n".join(report(samples, CPU_NUMPY, after)))
    print(f"mean |log(predicted / measured)| per node: before "
          f"{sum(abs(math.log(predict(CPU_NUMPY, s) / s.seconds)) for s in samples if s.seconds > 0) / len(samples):.2f}, "
          f"after {sum(abs(math.log(predict(after, s) / s.seconds)) for s in samples if s.seconds > 0) / len(samples):.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([s.__dict__ for s in samples], fh)


if __name__ == "__main__":
    main()
