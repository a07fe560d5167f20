"""A plan file is input: every check a fresh plan passes runs again on a loaded one (values
recomputed from the graph), a plan made for another graph is refused, and the file names its
model so `run --plan plan.json` needs nothing else. A refusal is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onnxplan.cli.app import app
from tests.cli_asserts import assert_one_line_error

runner = CliRunner()
RUN = ("--no-measure", "--steps", "1", "--warmup", "0")


def _run(*args: str):
    return runner.invoke(app, list(args))


def _refused(result, needle: str, code: int = 2) -> None:
    assert_one_line_error(result, code, needle)
    assert not result.stdout.strip()  # refused before running: no half report
    assert not result.stdout.strip()  # refused before running: no half report


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("plans")
    made = {"swap": ("mlp", "--batch", "4", "--swap", "on-demand"),
            "ck": ("mlp", "--batch", "4", "--checkpoint", "sqrt", "--no-profile"),
            "b8": ("mlp", "--batch", "8")}
    for key, args in made.items():
        r = _run("plan", *args, "-o", str(out / f"{key}.json"))
        assert r.exit_code == 0, r.stderr
    return {k: out / f"{k}.json" for k in made}


def _tampered(tmp_path: Path, src: Path, edit) -> Path:
    d = json.loads(src.read_text())
    edit(d)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(d))
    return path


def _buffer(d: dict, pred) -> dict:
    return next(b for b in d["buffers"] if pred(b))


def _swap_order(d: dict) -> None:  # a node moved before one of its inputs' producers
    order = d["order"]
    k = next(i for i, n in enumerate(order) if n.startswith("fc2"))
    order.insert(0, order.pop(k))


CASES = {
    "offset": ("swap", lambda d: _buffer(d, lambda b: b["bytes"] > 0 and b["offset"] > 0).update(offset=0),
               "overlap"),
    "offset-unaligned": ("swap", lambda d: _buffer(d, lambda b: b["bytes"] > 0).update(offset=8), "multiple of 64"),
    "bytes": ("swap", lambda d: _buffer(d, lambda b: b["bytes"] > 1).update(bytes=1), "B in the plan and"),
    "lifetime": ("swap", lambda d: _buffer(d, lambda b: b["last_eo"] > b["first_eo"]).update(
        last_eo=_buffer(d, lambda b: b["last_eo"] > b["first_eo"])["first_eo"]), "derived from the order"),
    "swap-bytes": ("swap", lambda d: d["swaps"][0].update(bytes=1), "swap of 'x': 1 B"),
    "swap-gap": ("swap", lambda d: d["swaps"][0].update(next_use=d["order"][-1]), "no idle gap"),
    "swap-dropped": ("swap", lambda d: d["swaps"].pop(), "order does not match"),
    "swap-no-write": ("swap", lambda d: [s.update(write=False) for s in d["swaps"]], "fails verification"),
    "order": ("swap", _swap_order, "before its dependency"),
    "arena": ("swap", lambda d: d.update(arena_bytes=10**15), "larger than all its buffers"),
    "persistent": ("swap", lambda d: d.update(persistent_bytes=d["persistent_bytes"] - 64), "persistent bytes"),
    "lower-bound": ("swap", lambda d: d.update(lower_bound_bytes=1), "lower bound"),
    "passes": ("swap", lambda d: d.update(passes=["realize", "inplace", "interleave"]), "pass list"),
    "recompute-pass": ("ck", lambda d: d.update(passes=[p for p in d["passes"] if not p.startswith("recompute")]),
                       "checkpoint record's schedule"),
    "recompute-schedule": ("ck", lambda d: d["checkpoint"].update(schedule="L6.c1.n2-6.b6-1"),
                           "checkpoint record's schedule"),
    "fingerprint": ("b8", lambda d: d.update(graph_fingerprint="0" * 64), "made for another graph"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_tampered_plan_is_refused(plans, tmp_path, case):
    src, edit, needle = CASES[case]
    path = _tampered(tmp_path, plans[src], edit)
    _refused(_run("run", "--plan", str(path), *RUN), needle)


def test_the_untampered_plans_run_without_a_model(plans):
    for key in ("swap", "ck", "b8"):
        r = _run("run", "--plan", str(plans[key]), *RUN, "--json")
        assert r.exit_code == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["model"] == "mlp" and len(out["loss"]) == 1


def test_a_plan_for_another_graph_is_refused(plans):
    _refused(_run("run", "mlp", "--batch", "4", "--plan", str(plans["b8"]), *RUN), "made for another graph")
    _refused(_run("run", "nnt-fc3", "--plan", str(plans["b8"]), *RUN), "the plan is for model 'mlp'")


def test_a_plan_without_a_model_reference_needs_model(plans, tmp_path):
    path = _tampered(tmp_path, plans["b8"], lambda d: d.pop("source"))
    _refused(_run("run", "--plan", str(path), *RUN), "give MODEL before --plan")
    r = _run("run", "mlp", "--batch", "8", "--plan", str(path), *RUN)
    assert r.exit_code == 0, r.stderr


def test_run_without_model_or_plan_says_what_is_needed():
    _refused(_run("run", "--swap", "proactive", "--lookahead", "1"), "needs a MODEL")


def test_explain_refuses_a_checkpoint_record_that_is_not_the_plans(plans, tmp_path):
    assert _run("explain", str(plans["ck"])).exit_code == 0
    path = _tampered(tmp_path, plans["ck"], lambda d: d["checkpoint"].update(schedule="L6.c1.n2-6.b6-1"))
    r = _run("explain", str(path))
    assert r.exit_code == 2 and "checkpoint record's schedule" in r.stderr and not r.stdout.strip()


SECTIONS = ("settings", "solver", "swap", "checkpoint", "strategy")


def _as_v1(d: dict) -> None:
    """A schema-1 file: the free-form `options`, none of the typed sections."""
    d["schema_version"] = 1
    for key in SECTIONS:
        d.pop(key)


def test_a_schema_1_plan_is_migrated(plans, tmp_path):
    from onnxplan.plan import Plan

    for key in ("swap", "ck"):
        v2 = json.loads(plans[key].read_text())
        path = _tampered(tmp_path, plans[key], _as_v1)
        assert Plan.load(path) == Plan.from_json(v2)  # the sections read back from `options`
        r = _run("run", "--plan", str(path), *RUN, "--json")
        assert r.exit_code == 0, r.stderr
    assert Plan.load(path).checkpoint.schedule  # the recompute record survived
    assert _run("explain", str(path)).exit_code == 0


def test_a_plan_of_an_unknown_schema_or_sections_is_refused_in_one_line(plans, tmp_path):
    path = _tampered(tmp_path, plans["b8"], lambda d: d.update(schema_version=7))
    _refused(_run("run", "--plan", str(path), *RUN), "schema_version 7 is not one this onnxplan reads (1, 2)")
    path = _tampered(tmp_path, plans["b8"], lambda d: d.pop("settings"))
    _refused(_run("run", "--plan", str(path), *RUN), "malformed plan: settings: field required")
    path = _tampered(tmp_path, plans["b8"], lambda d: d["settings"].update(interleave=False))
    _refused(_run("run", "--plan", str(path), *RUN), "settings say interleave=False but the pass list says True")


def test_the_plan_records_version_fingerprint_and_typed_sections(plans):
    from onnxplan import __version__

    d = json.loads(plans["ck"].read_text())
    assert d["schema_version"] == 2 and d["onnxplan_version"] == __version__ and len(d["graph_fingerprint"]) == 64
    assert set(SECTIONS) <= set(d) and d["swap"]["policy"] == "none" and d["strategy"] is None
    assert d["checkpoint"]["policy"] == "sqrt" and d["options"]["checkpoint"] == d["checkpoint"]  # v1's view
