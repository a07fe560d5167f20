"""Offline check of the price: replay a decision benchmark's measured budgets through today's price.

Reads the JSON of benchmarks/decision.py (default reports/decision.json: per budget, every
candidate's measured seconds per round). For each budget it re-plans the strategies fit_budget
weighs (budget.strategies.AUTO_STRATEGIES: plans are deterministic under the FLOP estimate),
prices each with the one price function (budget.decide.price), lets budget.decide.choose pick,
and judges the pick against the measured rounds as the benchmark does (decision.judge: the
fastest measured plan, the pick's paired excess over it, ok within 5%). Runs no kernel: it
prints the table in the time planning takes (plans kept in this process per model and budget).

Run: PYTHONPATH=. python benchmarks/decision_replay.py [--json reports/decision.json] [--models transformer:16]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import onnxplan
from onnxplan.api import Step
from onnxplan.budget.costs import FLOP_COSTS
from onnxplan.budget.decide import choose, weigh
from onnxplan.budget.strategies import AUTO_STRATEGIES, STRATEGIES
from onnxplan.planning import PlanOptions

try:
    from benchmarks.decision import judge
except ImportError:  # run as a script from benchmarks/
    from decision import judge  # type: ignore[no-redef]


def probe_rows(doc: dict) -> list[dict]:
    """benchmarks/price_probe.py's JSON (in-process interleaved rounds) as decision rows: per
    model and budget, each plan's wall seconds per round (plain, recompute, swap)."""
    rows: dict[tuple, dict] = {}
    for p in doc["rows"]:
        r = rows.setdefault((p["model"], p["fraction"]), {
            "model": p["model"], "fraction": p["fraction"], "budget_bytes": p["budget"], "rounds": {},
            "measured": {}, "peaks": {}, "chosen": "-", "chosen_ok": False})
        if p["peak"] <= p["budget"]:  # the plain plan does not fit: not a candidate's rival
            r["rounds"][p["plan"]] = p["walls"]
            r["measured"][p["plan"]] = min(p["walls"])
        r["peaks"][p["plan"]] = p["peak"]
    return list(rows.values())


def replay(rows: list[dict]) -> list[dict]:
    """Per measured budget: the pick of today's price and how it fares against the rounds."""
    steps: dict[str, Step] = {}
    out = []
    for r in rows:
        spec = r["model"]
        if spec not in steps:
            name, _, batch = spec.partition(":")
            steps[spec] = onnxplan.load(name, batch=int(batch) if batch else None)
        step = steps[spec]
        budget = r["budget_bytes"]
        cands = [weigh(n, STRATEGIES[n](step.graph, budget, FLOP_COSTS, None, PlanOptions()), budget)
                 for n in AUTO_STRATEGIES]
        best = choose(cands)
        rounds = r["rounds"]  # every measured plan: the strategies', the chosen and the other cost model's
        verdict = judge(rounds, best.name)
        same = {c.name: c.peak_bytes == r["peaks"].get(c.name) for c in cands}
        out.append({"model": spec, "budget": budget, "fraction": r["fraction"], "pick": best.name,
                    "predicted": {c.name: c.seconds for c in cands}, "measured": r["measured"],
                    "fastest": verdict["fastest"], "off": verdict["off"], "ok": verdict["ok"], "same_plans": same,
                    "was": r["chosen"], "was_ok": r["chosen_ok"]})
    return out


def table(res: list[dict]) -> list[str]:
    ok = sum(r["ok"] for r in res)
    was = sum(r["was_ok"] for r in res)
    lines = [f"today's price: {ok}/{len(res)} budgets chosen fastest or within 5% (the run's own choice: {was}/{len(res)})",
             "", "| model | budget (f) | pick (was) | fastest | off | predicted ms rc / swap | measured ms rc / swap / joint "
             "| same plans |", "|---|---|---|---|---|---|---|---|"]
    for r in res:
        pred = " / ".join(f"{r['predicted'][n] * 1e3:.1f}" for n in ("recompute", "swap"))
        meas = " / ".join(f"{r['measured'][n] * 1e3:.1f}" if n in r["measured"] else "-"
                          for n in ("recompute", "swap", "joint"))
        same = "yes" if all(r["same_plans"].values()) else "no: " + ", ".join(k for k, v in r["same_plans"].items() if not v)
        lines.append(f"| {r['model']} | {r['budget'] / 2**20:.2f} MiB ({r['fraction']}) | {r['pick']} ({r['was']}) | "
                     f"{r['fastest']} | {r['off']:+.1%}{'' if r['ok'] else ' MISS'} | {pred} | {meas} | {same} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default="reports/decision.json")
    ap.add_argument("--probe", action="store_true", help="the JSON is benchmarks/price_probe.py's")
    ap.add_argument("--models", nargs="*", default=None, help="only these rows (NAME:BATCH as in the JSON)")
    args = ap.parse_args()
    doc = json.loads(Path(args.json).read_text())
    rows = probe_rows(doc) if args.probe else doc["rows"]
    rows = [r for r in rows if args.models is None or r["model"] in args.models]
    print("\n".join(table(replay(rows))))


if __name__ == "__main__":
    main()
