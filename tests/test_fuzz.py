"""Fuzzed models through `inspect` and `plan`: every case ends in exit 0, 2 or 3, never a
traceback (exit 4 or an uncaught exception). Seeded: a failure names its seed, and
`python -m tests.fuzz_models --first SEED --cases 1` replays it (tests/fuzz_models.py)."""

from __future__ import annotations

import pytest

from onnxplan import settings
from tests.fuzz_models import base_folders, check_model, run_case, summary

CASES = 240
CHUNKS = 4


@pytest.fixture(scope="module")
def bases():
    return base_folders()


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_fuzzed_models_never_crash(chunk, bases, tmp_path):
    per = CASES // CHUNKS
    cases = [run_case(seed, bases, tmp_path) for seed in range(chunk * per, (chunk + 1) * per)]
    problems = [f"seed {c.seed} ({c.base} {c.target} {c.kind}): {c.problem}" for c in cases if c.problem]
    assert not problems, "\n".join(problems) + "\n" + summary(cases)
    assert sum(c.codes == (0, 0) for c in cases) >= per // 10  # the mutations leave some models valid
    assert sum(2 in c.codes for c in cases) >= per // 3  # and most of them are refused, as they should be



def test_the_harness_sees_a_bug(monkeypatch, bases):
    """A planted bug (exit 4, its line) is a problem; so is an exception escaping the CLI."""
    from onnxplan.cli import core, inspect_cmd

    model = str(bases["mlp"])
    assert check_model(model, []) == ((0, 0), None)

    def boom(graph):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(inspect_cmd, "inspect_summary", boom)
    codes, problem = check_model(model, [])
    assert codes == (4,) and "inspect: exit 4" in problem and "ZeroDivisionError: planted" in problem
    monkeypatch.setattr(core, "EXIT_BUG", 0)  # a traceback with exit 0 is still a problem
    monkeypatch.setenv("ONNXPLAN_DEBUG", "1")
    settings.reload()  # the environment changed: read it again
    codes, problem = check_model(model, [])
    assert codes == (0,) and problem is not None and problem.startswith("inspect: exit 0")
