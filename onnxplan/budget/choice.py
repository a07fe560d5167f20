"""The one tie rule and the one price every budget decision uses (budget.decide weighs the
strategies with them; the recompute strategy its schedules, the swap strategy its policies):

  1. Of the candidates that fit the budget, the fastest predicted step sets the mark; every
     fitting candidate predicted within the margin of it is a tie: MARGIN (10%) where node
     times were measured (a profile: its noise), ESTIMATE_MARGIN (2%) where they are the FLOP
     estimate (deterministic: a wider margin overrules what it predicts, see ESTIMATE_MARGIN).
  2. A tie goes to the strategy first in PREFERENCE (the plain plan, then recompute, swap, the
     joint solver's plans: the order measurement favoured, see PREFERENCE), then to the
     least peak, then to the least predicted seconds (then the name: a strategy not in
     PREFERENCE ranks after those in it).
  3. None fits: the least peak (then PREFERENCE).

The price (`price`): onnxplan.swap.pricing.price_outcome, node times from a TimeModel (None:
the FLOP estimate), transfers at the swap store's rates."""

from __future__ import annotations

from dataclasses import dataclass

from onnxplan.checkpoint.costs import TimeModel
from onnxplan.plan_records import StrategyCandidate
from onnxplan.planning import PlanOutcome
from onnxplan.swap.pricing import StepPrice, StoreRates, price_outcome

__all__ = ["ESTIMATE_MARGIN", "MARGIN", "PREFERENCE", "Candidate", "choose", "margin_of", "price", "weigh"]

# predicted within this fraction of the fastest fitting candidate: a tie (the rule above). 10%: two
# candidates 2% apart stay in one order under 3% of noise on either (a profile of another call,
# another load); the predictions themselves are rarely closer than that to the measured step
MARGIN = 0.10
# the margin where node times are the FLOP estimate (checkpoint.costs: the same graph, the same
# seconds, no noise of its own). Measured (benchmarks/decision.py, reports/decision.md, session
# 11): with 10% here, three of the five misses were swap predicted 5.6-8% faster than recompute
# and given to recompute by the tie (measured 8-36% slower); 2% keeps PREFERENCE for candidates
# the estimate cannot tell apart
ESTIMATE_MARGIN = 0.02
# the order a tie is broken in: the plain plan, recompute, swap, then the joint solver's plans.
# Recompute before swap: a recomputed plan's time is CPU alone, priced by the calibrated FLOP
# estimate (checkpoint.costs.CPU_NUMPY); a swap plan's adds transfers whose time depends on a
# shared disk and on the store's moving estimate (swap.pricing). Measured in one process,
# interleaved, least of 4-5 rounds (benchmarks/price_probe.py, reports/price.md): transformer b16
# and gpt b16 at 0.9/0.75/0.6 of the arena, two runs (load 0.4-1.3, 3.5): recompute the faster at
# 11 of 12 (by 3-60%); resnet18 b8 and vgg16 b8 (load 4): at 3 of 5, swap the faster at vgg16 0.9
# (3.5%) and 0.75 (18%). The order
# before (swap first) rested on rounds at load 5-12, where a step took 5-10x its idle time and
# swap's ran faster than the plain plan's. The joint plans last: gpt b16 at 7.87 MiB, joint
# predicted 1% faster than swap alone, measured 12% slower. A strategy not listed comes after these
PREFERENCE = ("none", "recompute", "swap", "joint-recompute", "joint-quick", "joint")


def price(outcome: PlanOutcome, times: TimeModel | None = None, rates: StoreRates | None = None) -> StepPrice:
    """The one price of a planned outcome (onnxplan.swap.pricing.price_outcome): node times from
    `times` (None: the FLOP estimate), transfers at `rates` (None: the store the plan records)."""
    return price_outcome(outcome, times or TimeModel(), rates)


@dataclass(frozen=True)
class Candidate:
    """One strategy's plan for a budget, as the decision weighs it."""

    name: str  # the strategy: none, recompute, swap, joint, joint-recompute, ...
    outcome: PlanOutcome
    price: StepPrice  # the predicted step (price)
    budget: int | None
    notes: tuple[str, ...] = ()
    margin: float = ESTIMATE_MARGIN  # what counts as a tie with it (margin_of its node times)

    @property
    def seconds(self) -> float:
        return self.price.seconds

    @property
    def peak_bytes(self) -> int:
        return self.outcome.plan.peak_bytes

    @property
    def fits(self) -> bool:
        return self.budget is None or self.peak_bytes <= self.budget

    def record(self) -> StrategyCandidate:
        return StrategyCandidate(self.name, self.peak_bytes, self.seconds, self.fits)

    def line(self) -> str:
        return f"{self.name} {self.seconds * 1e3:.2f} ms" + ("" if self.fits else " (misses the budget)")


def margin_of(times: TimeModel | None) -> float:
    """The tie margin of predictions made with `times`: MARGIN for measured node times (a
    profile), ESTIMATE_MARGIN for the FLOP estimate (None: the estimate)."""
    return MARGIN if times is not None and times.source == "profile" else ESTIMATE_MARGIN


def weigh(name: str, outcome: PlanOutcome, budget: int | None, times: TimeModel | None = None,
          rates: StoreRates | None = None) -> Candidate:
    """`outcome` as a candidate for `budget`, priced by `price`."""
    return Candidate(name, outcome, price(outcome, times, rates), budget, margin=margin_of(times))


def _rank(name: str) -> int:
    return PREFERENCE.index(name) if name in PREFERENCE else len(PREFERENCE)


def choose(candidates: list[Candidate]) -> Candidate:
    """The one tie rule (this module's docstring): of the fitting candidates, those predicted
    within the margin of the fastest (the widest of the candidates' margins), the first in
    PREFERENCE, then of least peak; none fits: the least peak."""
    fitting = [c for c in candidates if c.fits]
    if not fitting:
        return min(candidates, key=lambda c: (c.peak_bytes, _rank(c.name), c.seconds, c.name))
    mark = min(c.seconds for c in fitting) * (1 + max(c.margin for c in fitting))
    return min((c for c in fitting if c.seconds <= mark),
               key=lambda c: (_rank(c.name), c.peak_bytes, c.seconds, c.name))
