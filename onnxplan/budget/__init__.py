"""The budget layer: turns a memory budget into decisions (swap, recompute, which policy),
weighing them with a cost model passed in, above planning (planning.plan_step plans fixed
decisions) and the executor (which supplies the profiled cost model). budget.decide is the one
place a plan is chosen: its typed Candidate, its one price function and its one tie rule."""

from onnxplan.budget.attempt import attempt
from onnxplan.budget.checkpoint import plan_with_checkpoint
from onnxplan.budget.costs import CostModel, FlopCosts, ProfiledCosts, cost_model
from onnxplan.budget.decide import (
                                        DEFAULT_PROFILE,
                                        Candidate,
                                        MemoryRequest,
                                        choose,
                                        chosen_strategy,
                                        fit_budget,
                                        plan_for_budget,
                                        plan_with_strategy,
                                        price,
)
from onnxplan.budget.joint import (
                                        plan_joint_strategy,  # registers "joint" (opt-in) and the "dag." recompute code
)
from onnxplan.budget.strategies import (
                                        AUTO_STRATEGIES,
                                        STRATEGIES,
                                        Strategy,
                                        register_strategy,
                                        strategy_choices,
)

__all__ = ["AUTO_STRATEGIES", "DEFAULT_PROFILE", "STRATEGIES", "Candidate", "CostModel", "FlopCosts", "MemoryRequest",
           "ProfiledCosts", "Strategy", "attempt", "choose", "chosen_strategy", "cost_model", "fit_budget",
           "plan_for_budget", "plan_joint_strategy", "plan_with_checkpoint", "plan_with_strategy", "price",
           "register_strategy", "strategy_choices"]
