"""Cost models: what one step's nodes cost in seconds, handed to the budget layer.

A cost model is asked for a TimeModel of a graph (the step after realize/interleave) and
says what its numbers rest on. `FlopCosts` is the roofline estimate of onnxplan.checkpoint.costs
(no run); `ProfiledCosts` times our kernels in a short run (onnxplan.executor.profile). The
budget layer only ever calls `times`, so planning needs no executor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from onnxplan.checkpoint.costs import TimeModel
from onnxplan.executor.profile import profile_times
from onnxplan.ir.graph import StepGraph

__all__ = ["FLOP_COSTS", "CostModel", "FlopCosts", "ProfiledCosts", "cost_model"]


class CostModel(Protocol):
    """Seconds per node of a step: (TimeModel, one line saying what the times rest on)."""

    def times(self, graph: StepGraph, *, inplace: bool = True, order: str = "auto") -> tuple[TimeModel, str]: ...


@dataclass(frozen=True)
class FlopCosts:
    """The FLOP/byte roofline estimate: nothing runs."""

    def times(self, graph: StepGraph, *, inplace: bool = True, order: str = "auto") -> tuple[TimeModel, str]:
        return TimeModel(), "time: FLOP estimate"


@dataclass(frozen=True)
class ProfiledCosts:
    """Our kernels timed in a short run on `device` (a step they cannot run falls back to
    the FLOP estimate, and the note says why)."""

    device: str = "cpu"
    clock: str | None = None  # None: the profile's default (wall); "cpu" on shared machines
    threads: int | None = None  # the threads the run will use (onnxplan.threads; None: every core)

    def times(self, graph: StepGraph, *, inplace: bool = True, order: str = "auto") -> tuple[TimeModel, str]:
        return profile_times(graph, inplace=inplace, order=order, device=self.device, clock=self.clock,
                             threads=self.threads)


FLOP_COSTS = FlopCosts()  # the default of the functions taking a cost model


def cost_model(profile: bool, device: str = "cpu", threads: int | None = None) -> CostModel:
    """The cost model of the CLI's --profile/--no-profile, --device and --threads."""
    return ProfiledCosts(device, threads=threads) if profile else FlopCosts()
