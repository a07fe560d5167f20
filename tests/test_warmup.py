"""A measured run's warm-up: `warmup` steps, then on until `warmup_seconds` have passed (bench's
--warmup-seconds), for ours (executor.runner.execute) and the peers (data.run_steps); the timed
steps and what is reported do not change with it."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan import data
from onnxplan.bench import peers
from onnxplan.executor.prepare import Prepared
from onnxplan.executor.runner import execute, initial_parameters, step_batches
from onnxplan.loading import open_step
from onnxplan.memprobe import ProbeResult
from onnxplan.planning import PlanOptions, plan_step
from tests.zoo_small import small_artifacts


class _Clock:
    """perf_counter for onnxplan.data: it moves only when a step runs."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(data.time, "perf_counter", c)
    return c


def _walk(clock: _Clock, warmup: int, seconds: float, step: float) -> list[int]:
    out = []
    for k in data.warm_up_steps(warmup, seconds):
        out.append(k)
        clock.now += step
    return out


def test_the_warm_up_runs_its_steps_then_on_until_its_seconds(clock):
    assert _walk(clock, 0, 5.0, 0.1) == []  # no warm-up asked: none, whatever the seconds
    assert _walk(clock, 3, 0.0, 0.1) == [0, 1, 2]
    assert _walk(clock, 2, 0.55, 0.1) == [0, 1, 2, 3, 4, 5]  # steps begun before 0.55 s
    assert _walk(clock, 3, 0.15, 1.0) == [0, 1, 2]  # slow steps: the count decides
    assert len(_walk(clock, 1, 1e9, 0.0)) == data.MAX_WARMUP_STEPS  # a step that takes no time ends too


def test_run_steps_cycles_the_warm_up_batches_then_times_the_rest(clock):
    fed = []

    class Trainer:
        def step(self, batch):
            fed.append(batch)
            clock.now += 0.1
            return float(batch), 0.1 * batch

    out = data.run_steps(Trainer(), [0, 1, 2, 3], warmup=2, warmup_seconds=0.45)
    assert fed == [0, 1, 0, 1, 0, 2, 3] and out["warmup_steps"] == 5
    assert out["losses"][0] == 0.0 and len(out["step_seconds"]) == 7


def test_a_peers_figures_leave_out_every_warm_up_step(monkeypatch):
    seconds = [9.0, 8.0, 7.0, 6.0, 0.2, 0.1, 0.3]

    def probe(target, kwargs, **_):
        assert kwargs["steps"] == 3 and kwargs["warmup"] == 1 and kwargs["warmup_seconds"] == 0.5
        return ProbeResult(100, 0, 100, {"losses": [2.0] * 7, "step_seconds": seconds, "warmup_steps": 4}, "sampled")

    monkeypatch.setattr(peers, "probe_peak", probe)
    fig = peers.measure_peer("ort", small_artifacts("nnt-fc3", "adamw"), 3, 1, warmup_seconds=0.5)
    assert fig["median_step_seconds"] == pytest.approx(0.2) and fig["max_step_seconds"] == pytest.approx(0.3)
    assert fig["steps_timed"] == 3 and fig["warmup_steps"] == 4 and fig["first_loss"] == 2.0


def test_a_longer_warm_up_changes_nothing_reported():
    """Our warm-up runs on a copy of the initial state's values, restored before the timed steps:
    a warm-up of many steps (cycling its batches) reports the losses and parameters of none."""
    folder, graph = open_step(small_artifacts("nnt-fc3", "adamw"))
    made = plan_step(graph, PlanOptions("given", "best-fit"))
    prep = Prepared(folder, made.graph, made.plan)
    batches, params = step_batches(folder, 2, 0), initial_parameters(folder)
    cold, cold_losses, _ = execute(prep, batches, params, steps=2, warmup=0, learning_rate=None, check_arena=False)
    warm, warm_losses, seconds = execute(prep, batches, params, steps=2, warmup=2, learning_rate=None,
                                         check_arena=False, warmup_seconds=0.05)
    assert cold.warmup_steps == 0 and warm.warmup_steps > 2 and len(seconds) == 2
    assert warm_losses == cold_losses
    for name, value in cold.parameters().items():
        np.testing.assert_array_equal(value, warm.parameters()[name])
