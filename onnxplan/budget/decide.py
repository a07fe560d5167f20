"""The one place a memory budget becomes decisions: swap, recompute, joint or neither; every
plan then goes through planning.plan_step with those choices fixed.

The strategies (budget.strategies, budget.joint) only produce plans; this module weighs them
with budget.choice: each plan becomes a `Candidate`, priced by the one price function
(`price`: onnxplan.swap.pricing.price_outcome, node times from the cost model, transfers on one
I/O worker at the swap store's rates), and `choose` keeps one by the one tie rule (budget.choice:
the fastest fitting sets the mark, within the margin the first in PREFERENCE, then the least peak;
the margin is MARGIN for profiled node times, ESTIMATE_MARGIN for the FLOP estimate).
The choices inside a strategy go through the same rule: the recompute strategy's schedules
(budget.checkpoint) and the swap strategy's policies (budget.strategies).

The rule is stable: a profile a few percent off (a loaded machine, another call) moves the
predictions by less than MARGIN, and within MARGIN the order is fixed, so the same request
gives the same plan from call to call (`plan --budget` shows the plan `run --budget` runs); a
choice can still flip where the preferred candidate sits right at the margin's edge. With the
FLOP estimate as the cost model the prices, and so the choice, are exactly reproducible.
The cost model's default (DEFAULT_PROFILE) is the same for the CLI, the API, bench and check."""

from __future__ import annotations

from dataclasses import dataclass, replace

from onnxplan.budget import strategies
from onnxplan.budget.attempt import attempt, step_before_inplace
from onnxplan.budget.checkpoint import plan_with_checkpoint
from onnxplan.budget.choice import MARGIN, PREFERENCE, Candidate, choose, price, weigh
from onnxplan.budget.costs import FLOP_COSTS, CostModel, ProfiledCosts
from onnxplan.budget.strategies import STRATEGIES, StrategySkipped, strategy_choices
from onnxplan.checkpoint.rotor import DEFAULT_SLOTS
from onnxplan.checkpoint.select import CHECKPOINT_POLICIES
from onnxplan.errors import UsageError
from onnxplan.ir.graph import StepGraph
from onnxplan.plan_records import StrategyRecord
from onnxplan.planning import PlanOptions, PlanOutcome
from onnxplan.sizes import format_bytes, parse_size
from onnxplan.swap import SWAP_CHOICES

# the cost model when none is named (the CLI's --profile/--no-profile, api.plan(profile=...),
# bench and check): see DEFAULT_PROFILE's note in the report (reports/decision.md)
DEFAULT_PROFILE = False

__all__ = ["DEFAULT_PROFILE", "MARGIN", "PREFERENCE", "Candidate", "MemoryRequest", "choose", "chosen_strategy",
           "fit_budget", "plan_for_budget", "plan_with_strategy", "price", "weigh"]


def chosen_strategy(plan) -> str:
    """The memory strategy a plan was made with: the budget layer's choice (plan.strategy), else
    what its records say (joint, recompute, swap), else none."""
    if plan.strategy is not None:
        return plan.strategy.chosen
    if plan.joint is not None:
        return "joint"
    if plan.checkpoint is not None and plan.checkpoint.schedule:
        return "recompute"
    return "swap" if plan.swaps else "none"


@dataclass(frozen=True)
class MemoryRequest:
    """What was asked of memory: a budget (bytes), and the policies named (None: this layer
    chooses). Invalid values are a UsageError (exit 2) naming the CLI option."""

    budget: int | None = None
    swap: str | None = None  # none | auto | on-demand | reduced | proactive | window
    lookahead: int = 1  # proactive: EOs a swap-in is issued ahead of its use
    window_bytes: int | None = None  # window: the byte window (default: largest working set)
    checkpoint: str | None = None  # none | sqrt | chen | rotor
    slots: int = DEFAULT_SLOTS  # rotor: memory slots of its dynamic program
    strategy: str = "auto"  # auto: the fastest of the default strategies; else a registered one (recompute, swap, joint)

    def __post_init__(self) -> None:
        if self.swap is not None and self.swap not in SWAP_CHOICES:
            raise UsageError(f"invalid --swap {self.swap!r}: expected one of {', '.join(SWAP_CHOICES)}")
        if self.lookahead < 0:
            raise UsageError(f"invalid --lookahead {self.lookahead}: must be >= 0")
        if self.checkpoint is not None and self.checkpoint not in CHECKPOINT_POLICIES:
            raise UsageError(f"invalid --checkpoint {self.checkpoint!r}: expected one of "
                             f"{', '.join(CHECKPOINT_POLICIES)}")
        if self.strategy not in strategy_choices():
            raise UsageError(f"invalid --strategy {self.strategy!r}: expected one of {', '.join(strategy_choices())}")
        if self.strategy != "auto":
            if self.budget is None:
                raise UsageError(f"--strategy {self.strategy} needs --budget (it meets a budget)")
            if self.swap is not None or self.checkpoint is not None:
                raise UsageError(f"--strategy {self.strategy} chooses the memory policy itself: "
                                 "drop --swap / --checkpoint (or give them without --strategy)")

    @classmethod
    def from_flags(cls, budget: str | int | None = None, swap: str | None = None, lookahead: int = 1,
                   window_bytes: str | int | None = None, checkpoint: str | None = None,
                   strategy: str | None = None) -> MemoryRequest:
        """From the CLI's (or the API's) options: sizes as text ("256MiB") or bytes."""
        window = parse_size(window_bytes) if isinstance(window_bytes, str) else window_bytes
        if window is not None and window <= 0:
            raise UsageError(f"invalid --window-bytes {window_bytes}: must be > 0")
        return cls(parse_size(budget) if isinstance(budget, str) else budget, swap, lookahead, window, checkpoint,
                   strategy=strategy or "auto")

    @property
    def named(self) -> bool:
        """A swap or checkpoint policy was named: plan with it rather than choose."""
        return self.swap is not None or self.checkpoint is not None


def plan_for_budget(graph: StepGraph, base: PlanOptions, request: MemoryRequest,
                    costs: CostModel = FLOP_COSTS) -> PlanOutcome:
    """Plan `graph` for `request` with `base`'s order, planner, passes and time limit.

    A strategy named (request.strategy, with a budget): that registered strategy (recompute,
    swap, joint...). A checkpoint policy: recompute with it (no swap unless one is named). A
    budget and no policy named: the plain plan if it fits, else the default strategy
    (recompute, swap, joint-quick) that fits with the least step time predicted by `costs` (budget.strategies). A swap
    policy alone (or nothing under a budget): swap planning's own choice. The outcome may
    miss the budget: the caller compares plan.peak_bytes with it."""
    swap = request.swap or ("auto" if request.budget is not None and request.checkpoint is None else "none")
    opts = replace(base, swap=swap, lookahead=request.lookahead, window_bytes=request.window_bytes,
                   budget=request.budget, recompute="")
    if request.strategy != "auto":
        res, why = plan_with_strategy(graph, replace(opts, swap="none"), request.strategy, costs)
        res.pass_notes.append(f"memory strategy: {why}")
        return res
    if not request.named and request.budget is not None:
        res, why = fit_budget(graph, opts, costs)
        res.pass_notes.append(f"memory strategy: {why}")
        return res
    if request.checkpoint not in (None, "none"):
        return plan_with_checkpoint(graph, opts, request.checkpoint, costs, request.slots)
    return attempt(graph, opts)


def fit_budget(graph: StepGraph, opts: PlanOptions, costs: CostModel = FLOP_COSTS) -> tuple[PlanOutcome, str]:
    """The plan for `opts.budget` when the user named neither a checkpoint nor a swap policy:
    the plain plan if it fits; else every auto strategy (budget.strategies) is planned and one
    is chosen by `choose` (node times by `costs`). Returns (outcome, one line saying what was
    chosen and why); the choice is also recorded in plan.strategy."""
    budget = opts.budget
    plain = attempt(graph, replace(opts, swap="none", recompute=""))
    if budget is None or plain.plan.peak_bytes <= budget:
        why = "the plan fits without recomputation or swap"
        return _record(plain, "none", why, [weigh("none", plain, budget)], budget), why
    times, time_note = costs.times(plain.graph, inplace=opts.inplace, order=opts.order)
    cands = [weigh("none", plain, budget, times)]
    skipped = []
    for name in strategies.AUTO_STRATEGIES:
        try:
            cands.append(weigh(name, STRATEGIES[name](graph, budget, costs, opts.time_limit, opts), budget, times))
        except StrategySkipped as skip:
            skipped.append(f"{name} not planned: {skip}")
    best = choose(cands)
    if best.fits:
        others = ", ".join(c.line() for c in cands[1:] if c is not best)
        why = (f"{best.name}: the plain plan needs {format_bytes(plain.plan.peak_bytes)} > budget "
               f"{format_bytes(budget)}; {best.name} fits with predicted step {best.seconds * 1e3:.2f} ms"
               + (f" (vs {others})" if others else "") + f" (ties within {best.margin:.0%}: {', '.join(PREFERENCE)})")
    else:
        why = (f"{best.name}: no strategy reaches {format_bytes(budget)}; the smallest peak is "
               f"{format_bytes(best.peak_bytes)} ({best.name})")
        _step_floor(best, cands)
    if isinstance(costs, ProfiledCosts) and times.source != "profile":  # asked for a profile, got none: say why
        best.outcome.pass_notes.append(f"step times: {time_note}")
    best.outcome.pass_notes.extend(f"memory strategy: {note}" for note in skipped)
    return _record(best.outcome, best.name, why, cands, budget), why


def _step_floor(best: Candidate, cands: list[Candidate]) -> None:
    """None fits: the plan of least peak says the floor of the step, the split search's (the
    swap strategy's floor: the least any split plan holds, budget/split.py), not the one of its
    own order (another strategy's plan, e.g. a recomputed node's working set)."""
    split = next((c.outcome.swap.floor for c in cands if c.name == "swap" and c.outcome.swap is not None
                  and c.outcome.swap.floor is not None and c.outcome.swap.floor.unsplit), None)
    if split is not None and best.outcome.swap is not None:
        best.outcome.swap.floor = split


def plan_with_strategy(graph: StepGraph, opts: PlanOptions, name: str,
                       costs: CostModel = FLOP_COSTS) -> tuple[PlanOutcome, str]:
    """The plan of the registered strategy `name` for `opts.budget` (not weighed against the
    others; it may miss the budget: the caller compares). Returns (outcome, one line); the
    choice is recorded in plan.strategy as for fit_budget."""
    budget = opts.budget
    if budget is None:  # MemoryRequest refuses --strategy without --budget
        raise RuntimeError(f"strategy {name}: planned without a budget")
    try:
        out = STRATEGIES[name](graph, budget, costs, opts.time_limit, opts)
    except StrategySkipped as skip:
        raise UsageError(f"--strategy {name}: {skip}") from None
    times, _ = costs.times(step_before_inplace(graph, opts), inplace=opts.inplace, order=opts.order)
    cand = weigh(name, out, budget, times)
    verdict = "fits" if cand.fits else "misses it"
    why = (f"{name} (named): peak {format_bytes(cand.peak_bytes)} for budget {format_bytes(budget)} "
           f"({verdict}), predicted step {cand.seconds * 1e3:.2f} ms")
    return _record(out, name, why, [cand], budget), why


def _record(out: PlanOutcome, name: str, why: str, cands: list[Candidate], budget: int | None) -> PlanOutcome:
    out.plan = replace(out.plan, strategy=StrategyRecord(name, why, budget, tuple(c.record() for c in cands)))
    return out
