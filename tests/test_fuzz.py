"""Fuzzed models through `inspect` and `plan`: every case ends in exit 0, 2 or 3, never a
traceback (exit 4 or an uncaught exception). Seeded: a failure names its seed, and
`python -m tests.fuzz_models --first SEED --cases 1` replays it (tests/fuzz_models.py)."""

from __future__ import annotations

import pytest

from tests.fuzz_models import base_folders, run_case, summary

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
