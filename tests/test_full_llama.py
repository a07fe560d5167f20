"""hf-llama@full (issue 26): a LLaMA-architecture model of 747,685,888 parameters, its float32
weights (2.79 GiB) over protobuf's 2 GiB, through `inspect` and `plan` without its weights'
values: each command's whole process under 4 GiB of RSS (artifacts built in the same process
when the cache lacks them); `plan --budget 8GiB`, below its persistent state (parameters and
AdamW's moments, 8.36 GiB), fits by swapping persistent state; a budget below the floor names it
in one line (exit 3); `run` refuses the nominal checkpoint in one line (exit 2).

Opt-in by cost: it runs only where the artifact cache already holds the export (exporting takes
minutes and some 6 GB of memory), e.g. `ONNXPLAN_CACHE=DIR python -m pytest -m slow
tests/test_full_llama.py` after `ONNXPLAN_CACHE=DIR onnxplan inspect hf-llama@full`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from onnxplan.errors import ModelError
from onnxplan.models import hf

pytest.importorskip("transformers")

NAME = "hf-llama@full"
# embedding and LM head 2 x 32000 x 2048; 12 layers of q, k, v, o 2048 x 2048 and gate, up, down
# 2048 x 5632; 25 RMSNorm weights of 2048
PARAMETERS = 2 * 32000 * 2048 + 12 * (4 * 2048 * 2048 + 3 * 2048 * 5632) + 25 * 2048
RSS_LIMIT = 4 << 30
_MEASURED = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, file=sys.stderr); "
             "sys.exit(code)")
_CLI = "import sys; from onnxplan.cli.app import main; sys.exit(main())"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """An empty artifact cache that shares the export of hf-llama@full with the session's (a
    link to its hf/ folder), or a skip where it was never exported: the artifacts are built
    (by reference) in the first measured command, then reused. Removed after the module."""
    def not_cached(spec):
        raise LookupError("not in the cache")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hf, "build_torch_model", not_cached)
        try:
            hf.export_forward(NAME)
        except ModelError:
            pytest.skip(f"{NAME} is not exported in this artifact cache (ONNXPLAN_CACHE): opt-in")
    root = tmp_path_factory.mktemp("llama-cache")
    (root / "hf").symlink_to(hf.export_dir(), target_is_directory=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)  # a copy of the weights (forward.data): 2.8 GB


def _onnxplan(cache: Path, *args: str) -> tuple[subprocess.CompletedProcess, int]:
    """`onnxplan ARGS` in a fresh process on artifact cache `cache`, and its peak RSS in bytes."""
    env = {**os.environ, "ONNXPLAN_CACHE": str(cache)}
    result = subprocess.run([sys.executable, "-c", _MEASURED, sys.executable, "-c", _CLI, *args],
                            capture_output=True, text=True, timeout=900, env=env)
    *err, rss = result.stderr.strip().splitlines()
    result.stderr = "\n".join(err)
    return result, int(rss)


@pytest.mark.slow
def test_inspect_and_plan_without_the_weights(cache):
    shown, rss = _onnxplan(cache, "inspect", NAME, "--json")
    assert shown.returncode == 0, shown.stderr
    assert rss < RSS_LIMIT, f"inspect peaked at {rss / 2**30:.2f} GiB"
    by_class = json.loads(shown.stdout)["bytes_by_class"]
    assert by_class["parameter"] == 4 * PARAMETERS  # float32
    assert by_class["optimizer_state"] == 2 * 4 * PARAMETERS + 8  # AdamW's two moments, an int64 step
    planned, rss = _onnxplan(cache, "plan", NAME, "--json")
    assert planned.returncode == 0, planned.stderr
    assert rss < RSS_LIMIT, f"plan peaked at {rss / 2**30:.2f} GiB"
    plan = json.loads(planned.stdout)
    assert plan["persistent_bytes"] >= 3 * 4 * PARAMETERS and plan["peak_bytes"] > plan["persistent_bytes"]


@pytest.mark.slow
def test_budgets_below_the_persistent_state(cache):
    planned, rss = _onnxplan(cache, "plan", NAME, "--budget", "8GiB", "--json")
    assert planned.returncode == 0, planned.stderr
    assert rss < RSS_LIMIT, f"plan --budget peaked at {rss / 2**30:.2f} GiB"
    plan = json.loads(planned.stdout)
    assert plan["peak_bytes"] <= 8 << 30 < 3 * 4 * PARAMETERS  # persistent state swapped
    floor, _ = _onnxplan(cache, "plan", NAME, "--budget", "512MiB")
    assert floor.returncode == 3 and len(floor.stderr.strip().splitlines()) == 1, floor.stderr
    assert "no plan reaches the budget 512.00 MiB" in floor.stderr and "floor" in floor.stderr


@pytest.mark.slow
def test_run_refuses_in_one_line(cache):
    ran, _ = _onnxplan(cache, "run", NAME, "--steps", "1")
    assert ran.returncode in (2, 3) and len(ran.stderr.strip().splitlines()) == 1, ran.stderr
    assert "parameters' names only" in ran.stderr or "of memory" in ran.stderr
