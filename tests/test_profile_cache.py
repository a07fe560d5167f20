"""The profile behind the budget layer's choices is kept on disk ($ONNXPLAN_CACHE/profiles):
a later process planning the same step runs no kernel, any other key (threads, graph) runs
them, and the plan chosen from the stored profile is the plan chosen from a fresh one."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import onnxplan
from onnxplan import settings
from onnxplan.budget import MemoryRequest, ProfiledCosts, plan_for_budget
from onnxplan.executor import profile
from onnxplan.planning import PlanOptions, plan_step

OPTS = PlanOptions(order="given", planner="best-fit")  # no time-limited solver: the same inputs give the same plan


@pytest.fixture(scope="module")
def step():
    return onnxplan.load("mlp", batch=4).graph


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A profile cache of this test's own, and an empty in-process cache (as in a new process)."""
    monkeypatch.setenv("ONNXPLAN_CACHE", str(tmp_path))
    monkeypatch.delenv(profile.PROFILE_CACHE_ENV, raising=False)
    settings.reload()
    monkeypatch.setattr(profile, "_CACHE", {})
    return tmp_path


class _PlantedExecutor:
    """Stands in for the executor: any profile that runs a kernel fails, naming this."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("planted: the executor ran")


def _new_process(monkeypatch) -> None:
    """What a later process sees: nothing profiled in memory, and kernels that cannot run."""
    monkeypatch.setattr(profile, "_CACHE", {})
    monkeypatch.setattr(profile, "Executor", _PlantedExecutor)


def test_a_later_process_reuses_the_profile_without_running_a_kernel(step, cache, monkeypatch):
    fresh, note = profile.profile_times(step, threads=1)
    assert fresh.source == "profile" and fresh.measured, note
    files = list((cache / "profiles").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["measured"] == fresh.measured
    _new_process(monkeypatch)
    again, again_note = profile.profile_times(step, threads=1)
    assert again.source == "profile" and again.measured == fresh.measured  # the same floats, bit for bit
    assert again_note.startswith(note) and "(cached " in again_note


def test_another_key_misses(step, cache, monkeypatch):
    """Other threads, another graph (batch), in-place off, or the cache turned off: the kernels
    run (the planted executor fails the profile, which falls back to the FLOP estimate)."""
    profile.profile_times(step, threads=1)
    _new_process(monkeypatch)
    other = onnxplan.load("mlp", batch=8).graph
    assert other.fingerprint() != step.fingerprint()
    for graph, kwargs in ((step, {"threads": 2}), (other, {"threads": 1}), (step, {"threads": 1, "inplace": False})):
        tm, note = profile.profile_times(graph, **kwargs)
        assert tm.source == "flops" and "planted: the executor ran" in note, kwargs
    monkeypatch.setenv(profile.PROFILE_CACHE_ENV, "off")
    settings.reload()
    tm, note = profile.profile_times(step, threads=1)
    assert tm.source == "flops" and "planted" in note


def test_the_key_is_the_graph_not_its_name(step, cache, monkeypatch):
    profile.profile_times(step, threads=1)
    _new_process(monkeypatch)
    renamed = step.copy()
    renamed.name = "another-name"
    assert renamed.fingerprint() == step.fingerprint()
    assert profile.profile_times(renamed, threads=1)[0].source == "profile"


def test_an_unreadable_entry_is_a_miss_and_is_replaced(step, cache, monkeypatch):
    profile.profile_times(step, threads=1)
    (path,) = (cache / "profiles").glob("*.json")
    path.write_text('{"format": 1, "measured": ')  # half a file (what the atomic write rules out)
    monkeypatch.setattr(profile, "_CACHE", {})
    tm, _ = profile.profile_times(step, threads=1)
    assert tm.source == "profile"  # profiled again
    assert json.loads(path.read_text())["measured"] == tm.measured
    assert not list((cache / "profiles").glob("*.tmp"))


def test_the_plan_chosen_from_the_stored_profile_is_the_fresh_ones(step, cache, monkeypatch):
    budget = plan_step(step, OPTS).plan.peak_bytes - 1
    costs = ProfiledCosts(threads=1)
    fresh = plan_for_budget(step, OPTS, MemoryRequest(budget=budget), costs)
    assert len(list((cache / "profiles").glob("*.json"))) == 1
    _new_process(monkeypatch)
    cached = plan_for_budget(step, OPTS, MemoryRequest(budget=budget), costs)
    a, b = fresh.plan, cached.plan
    assert a.strategy.chosen == b.strategy.chosen
    assert a.strategy.candidates == b.strategy.candidates  # same peaks, same predicted seconds
    assert (a.order, a.buffers, a.swaps, a.peak_bytes) == (b.order, b.buffers, b.swaps, b.peak_bytes)
    assert (a.planner, a.passes, a.settings) == (b.planner, b.passes, b.settings)


def test_a_second_process_runs_no_kernel(step, cache):
    """The same across real processes: the child's executor raises if it is ever built."""
    profile.profile_times(step, threads=1)
    code = textwrap.dedent("""
        import onnxplan
        from onnxplan.executor import profile

        class Planted:
            def __init__(self, *a, **k):
                raise RuntimeError("planted: the executor ran")

        profile.Executor = Planted
        tm, note = profile.profile_times(onnxplan.load("mlp", batch=4).graph, threads=1)
        print(tm.source, note)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("profile ") and "(cached " in r.stdout, r.stdout


@pytest.mark.parametrize("long_step", [False, True])
def test_a_long_step_is_profiled_from_two_steps(step, cache, monkeypatch, long_step):
    """A step of LONG_STEP seconds or more (a real-size model) is profiled from its first run
    alone; a short one warms up twice and is timed `steps` times, each with an untimed twin."""
    calls = {"step": 0, "timed": 0}

    class Counting(profile.Executor):
        def step(self, *a, **k):
            calls["step"] += 1
            return super().step(*a, **k)

        def timed_nodes(self, *a, **k):
            calls["timed"] += 1
            return super().timed_nodes(*a, **k)

    monkeypatch.setattr(profile, "Executor", Counting)
    monkeypatch.setattr(profile, "LONG_STEP", 0.0 if long_step else float("inf"))
    tm, note = profile.profile_times(step, steps=3, threads=1)
    assert tm.source == "profile" and tm.measured, note
    assert calls == ({"step": 0, "timed": 1} if long_step else {"step": 1 + 3, "timed": 1 + 3})
