"""Named memory strategies for the bench: short stable names mapped to planning options."""

from __future__ import annotations

from dataclasses import dataclass

from onnxplan.errors import UsageError
from onnxplan.planning import ORDER_CHOICES, PLANNER_CHOICES, PlanOptions

__all__ = [
    "CI_STRATEGIES",
    "DEFAULT_STRATEGIES",
    "Strategy",
    "parse_strategies",
    "parse_strategy",
    "strategy_help",
]

# The default sweep: the full pipeline, NNTrainer's own order + planner, the file order with a
# classic best-fit allocator, and the full pipeline with one pass switched off at a time.
DEFAULT_STRATEGIES = ("auto", "nntrainer+sort", "given+best-fit", "greedy+greedy-size", "no-interleave",
                      "no-inplace", "given+naive")
# The CI gate: heuristic planners only, so every planned peak is deterministic (the ILP planner
# runs under a time limit: on a slower machine it may stop at a worse incumbent).
CI_STRATEGIES = ("auto+greedy-size", "nntrainer+sort", "given+best-fit", "greedy+greedy-size",
                 "auto+greedy-size/no-interleave", "auto+greedy-size/no-inplace")

_MODIFIERS: dict[str, tuple[str, bool]] = {"no-interleave": ("interleave", False), "no-inplace": ("inplace", False)}


@dataclass(frozen=True)
class Strategy:
    """A strategy name and the planning options it stands for."""

    name: str
    order: str = "auto"
    planner: str = "auto"
    interleave: bool = True
    inplace: bool = True

    def options(self, time_limit: float | None) -> PlanOptions:
        return PlanOptions(self.order, self.planner, self.interleave, self.inplace, time_limit)


def strategy_help() -> str:
    return ("auto (best order, every planner), ORDER+PLANNER (orders: "
            f"{', '.join(ORDER_CHOICES)}; planners: {', '.join(PLANNER_CHOICES)}), "
            "optionally followed by /no-interleave or /no-inplace; no-interleave and no-inplace "
            "alone mean auto with that pass off")


def parse_strategy(name: str) -> Strategy:
    """'auto', 'ORDER+PLANNER[/no-interleave][/no-inplace]', 'no-interleave', 'no-inplace'."""
    text = name.strip()
    head, *mods = text.split("/")
    fields: dict[str, bool] = {}
    if head in _MODIFIERS:
        mods.insert(0, head)
        head = "auto"
    if head == "auto":
        order, planner = "auto", "auto"
    else:
        order, sep, planner = head.partition("+")
        if not sep or order not in ORDER_CHOICES or planner not in PLANNER_CHOICES:
            raise UsageError(f"unknown strategy '{name}': expected {strategy_help()}")
    for mod in mods:
        if mod not in _MODIFIERS:
            raise UsageError(f"unknown strategy modifier '{mod}' in '{name}': expected "
                             f"{' or '.join(_MODIFIERS)}")
        key, value = _MODIFIERS[mod]
        fields[key] = value
    return Strategy(text, order, planner, **fields)


def parse_strategies(text: str | None) -> list[Strategy]:
    """A comma-separated list ('default' and 'ci' expand to the built-in sets); no repeats."""
    names: list[str] = []
    for part in (text or "default").split(","):
        part = part.strip()
        if not part:
            continue
        expanded = {"default": DEFAULT_STRATEGIES, "ci": CI_STRATEGIES}.get(part, (part,))
        names.extend(n for n in expanded if n not in names)
    if not names:
        raise UsageError("--strategies is empty")
    return [parse_strategy(n) for n in names]
