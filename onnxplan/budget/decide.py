"""The one place a memory budget becomes decisions: swap, recompute, or neither, and with
which policy; every plan then goes through planning.plan_step with those choices fixed."""

from __future__ import annotations

from dataclasses import dataclass, replace

from onnxplan.budget.attempt import attempt
from onnxplan.budget.checkpoint import plan_with_checkpoint
from onnxplan.budget.costs import CostModel, FlopCosts
from onnxplan.budget.strategies import fit_budget, plan_with_strategy, strategy_choices
from onnxplan.checkpoint.rotor import DEFAULT_SLOTS
from onnxplan.checkpoint.select import CHECKPOINT_POLICIES
from onnxplan.errors import UsageError
from onnxplan.ir.graph import StepGraph
from onnxplan.planning import PlanOptions, PlanOutcome
from onnxplan.sizes import parse_size
from onnxplan.swap import SWAP_CHOICES

__all__ = ["MemoryRequest", "plan_for_budget"]


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
                    costs: CostModel = FlopCosts()) -> PlanOutcome:
    """Plan `graph` for `request` with `base`'s order, planner, passes and time limit.

    A strategy named (request.strategy, with a budget): that registered strategy (recompute,
    swap, joint...). A checkpoint policy: recompute with it (no swap unless one is named). A
    budget and no policy named: the plain plan if it fits, else the default strategy
    (recompute, swap) that fits with the least step time predicted by `costs` (budget.strategies). A swap
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
