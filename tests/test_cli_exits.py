"""Wrong answers and wrong exits (issue 29): every command ends in its documented exit code and
one line on hostile input, a run that misses its budget is exit 3 as `plan` is, profiling never
allocates what the machine cannot hold, a scalar output is refused, `explain` shows swaps and
splits and refuses a plan that fails verification, `check` refuses impossible rows, long
commands show progress, and the floor message states a true bound. The hostile models are
built here from code (onnx.helper), seeded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from onnxplan import settings
from onnxplan.cli.app import app
from tests.cli_asserts import assert_one_line_error

runner = CliRunner()


def _forward(path: Path, nodes, x_shape, y_shape, *, imports=(), inputs=None, seed: int = 0) -> str:
    """A forward model x @ w -> ... -> y (w seeded), saved to `path`."""
    w = numpy_helper.from_array(np.random.default_rng(seed).standard_normal((4, 3)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)
    model = helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), *nodes], "g",
                                                inputs or [x], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 17), *imports])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def _invoke(*args: str):
    return runner.invoke(app, list(args))


# -- a run that misses its budget ---------------------------------------------------------------

def test_run_whose_plan_misses_the_budget_is_exit_3():
    """`run mlp --budget 3MiB` planned 3.56 MiB and ran it, exit 0 with no word; now as `plan`.
    (3 MiB fits since nodes split below swap's floor: 900 KiB is below the split floor, 1.02 MiB.)"""
    r = _invoke("run", "mlp", "--budget", "900KiB", "--no-measure", "--steps", "1")
    assert_one_line_error(r, 3, "no plan reaches the budget 900.00 KiB: smallest peak")
    assert "floor" in r.stderr


def test_budget_check_both_ways():
    from onnxplan.run_report import budget_check

    mib, overhead = 1 << 20, 18 << 20
    under = budget_check(3 * mib, 3 * mib + 1, 4 * mib, overhead)
    assert under.fits and under.line is None
    within = budget_check(3 * mib, 8 * mib, 4 * mib, overhead)  # a correct run: the runtime's overhead
    assert within.fits and "within the runtime's fixed overhead" in within.line
    beyond = budget_check(3 * mib, 4 * mib + overhead + 1, 4 * mib, overhead)  # something outside the plan grew
    assert not beyond.fits and beyond.line.startswith("the run misses the budget 4.00 MiB: measured peak")
    planned_over = budget_check(5 * mib, 5 * mib, 4 * mib, overhead)
    assert not planned_over.fits and "planned peak 5.00 MiB" in planned_over.line


@pytest.mark.parametrize("fault", [False, True])
def test_run_measured_peak_against_the_budget(fault, monkeypatch):
    """A correct run measured over the budget by the runtime's overhead says so in one line and
    exits 0; a measured peak beyond that overhead (planted) is exit 3 with that line."""
    import onnxplan.run_report as rr

    budget = int(3.8 * (1 << 20))
    extra = rr.RUNTIME_OVERHEAD_BYTES["cpu"] + (1 << 20) if fault else 4 << 20

    def fake_measure(req, folder, **kwargs):
        return {"probe": {"method": "planted"}, "step_seconds": [0.01]}, budget + extra

    monkeypatch.setattr(rr, "measure_run", fake_measure)
    r = _invoke("run", "mlp", "--budget", "3.8MiB", "--steps", "1", "--warmup", "0")
    if fault:
        assert_one_line_error(r, 3, "the run misses the budget 3.80 MiB: measured peak")
    else:
        assert r.exit_code == 0, (r.stdout, r.stderr)
        assert "over the budget 3.80 MiB, within the runtime's fixed overhead" in r.stdout


# -- zero-sized dimensions ----------------------------------------------------------------------

@pytest.mark.parametrize("args", [["inspect"], ["plan"], ["run", "--no-measure", "--steps", "1"],
                                  ["run", "--verify", "--no-measure", "--steps", "1"]])
def test_zero_batch_model_is_refused_everywhere(args, tmp_path):
    """Accepted by inspect/plan, trained 0 samples in run, SIGFPE (exit 136) in run --verify."""
    model = _forward(tmp_path / "zero.onnx", [helper.make_node("Relu", ["m"], ["y"])], [0, 4], [0, 3])
    r = _invoke(args[0], model, "--loss", "mse", *args[1:])
    assert_one_line_error(r, 2, "input 'x' has a zero-sized dimension (axis 0)")


def test_zero_dim_in_an_artifact_folder_and_dim_zero(tmp_path):
    from tests.zoo_small import small_artifacts

    folder = tmp_path / "art"
    shutil.copytree(small_artifacts("mlp"), folder)
    m = onnx.load(str(folder / "training_model.onnx"))
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 0
    onnx.save(m, str(folder / "training_model.onnx"))
    assert_one_line_error(_invoke("inspect", str(folder)), 2, "zero-sized dimension")
    dynamic = _forward(tmp_path / "dyn.onnx", [helper.make_node("Relu", ["m"], ["y"])], ["n", 4], ["n", 3])
    assert_one_line_error(_invoke("plan", dynamic, "--loss", "mse", "--dim", "n=0"), 2, "invalid --dim n=0")


# -- malformed graphs ---------------------------------------------------------------------------

MALFORMED = {
    "dropped input": ([helper.make_node("Relu", [], ["y"])], (), "Input 0 is out of bounds"),
    "ml op without its opset": ([helper.make_node("Normalizer", ["m"], ["y"], domain="ai.onnx.ml", norm="MAX")],
                                (), "No opset import for domain ai.onnx.ml"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
@pytest.mark.parametrize("command", ["inspect", "plan"])
def test_malformed_graph_is_bad_input(case, command, tmp_path):
    """Exit 4 ("a bug in onnxplan") before: onnx's shape inference raised unmapped."""
    nodes, imports, reason = MALFORMED[case]
    model = _forward(tmp_path / "bad.onnx", nodes, [2, 4], [2, 3], imports=imports)
    r = _invoke(command, model, "--loss", "mse")
    assert_one_line_error(r, 2, "malformed model: onnx shape inference refuses it")
    assert reason in r.stderr


# -- profiling bounded by the machine -----------------------------------------------------------

def test_profile_never_allocates_what_does_not_fit(monkeypatch):
    """--profile ran our kernels at full size (MemoryError, exit 3 'does not fit this machine');
    with the plain step larger than the memory available it is skipped, and said."""
    import onnxplan.executor.profile as profile
    import onnxplan.hostmem as hostmem

    def no_executor(*args, **kwargs):
        raise AssertionError("the profile allocated a step larger than the memory available")

    monkeypatch.setattr(hostmem, "available_bytes", lambda *a, **k: 1 << 20)  # 1 MiB: less than mlp's step
    monkeypatch.setattr(profile, "Executor", no_executor)
    monkeypatch.setattr(profile, "_CACHE", {})
    monkeypatch.setenv(profile.PROFILE_CACHE_ENV, "off")  # a stored profile would allocate nothing (no skip to see)
    r = _invoke("plan", "mlp", "--budget", "3.8MiB", "--profile")
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert "step times: profile skipped (the plain step needs" in " ".join(r.stdout.split())
    assert "more than the 1.00 MiB available); FLOP estimate used" in " ".join(r.stdout.split())


# -- a model that ends in its loss --------------------------------------------------------------

@pytest.mark.parametrize("loss", ["ce", "mse"])
def test_scalar_output_is_refused(loss, tmp_path):
    """`got shape []; use mse`, and with mse an MSE stacked on the model's own loss, exit 0."""
    nodes = [helper.make_node("Mul", ["m", "m"], ["s"]), helper.make_node("ReduceMean", ["s"], ["y"], keepdims=0)]
    model = _forward(tmp_path / "lossy.onnx", nodes, [2, 4], [])
    r = _invoke("plan", model, "--loss", loss)
    assert_one_line_error(r, 2, "the model's output is a scalar: it already ends in its loss")


# -- explain ------------------------------------------------------------------------------------

def test_explain_shows_swaps_and_refuses_a_tampered_plan(tmp_path):
    path = tmp_path / "plan.json"
    assert _invoke("plan", "mlp", "--budget", "3.8MiB", "--swap", "on-demand", "-o", str(path)).exit_code == 0
    r = runner.invoke(app, ["explain", str(path)], env={"COLUMNS": "200"})  # room for the table's names
    assert r.exit_code == 0, (r.stdout, r.stderr)
    swaps = json.loads(path.read_text())["swaps"]
    assert swaps and f"swap on-demand: {len(swaps)} swaps" in r.stdout
    assert all(s["value"] in r.stdout for s in swaps)
    assert "--checkpoint sqrt|chen|rotor" not in r.stdout
    js = json.loads(_invoke("explain", str(path), "--json").stdout)
    assert [s["value"] for s in js["swaps"]] == [s["value"] for s in swaps]
    d = json.loads(path.read_text())
    d["buffers"][0]["offset"] += 64  # overlaps a neighbour: the verifier refuses it
    path.write_text(json.dumps(d))
    assert_one_line_error(_invoke("explain", str(path)), 2, "the plan file fails verification")


@pytest.mark.slow
def test_explain_shows_split_convgrads(tmp_path):
    from tests.zoo_small import small_artifacts

    path = tmp_path / "plan.json"
    folder = str(small_artifacts("vgg16", "sgd"))  # convs past the first have a dX to split
    assert _invoke("plan", folder, "--split-grad", "-o", str(path)).exit_code == 0
    r = _invoke("explain", str(path))
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert "split-grad:" in r.stdout and "ConvGrad node(s) split" in r.stdout
    assert json.loads(_invoke("explain", str(path), "--json").stdout)["split_grad"]


# -- check --------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [0, -5, float("nan"), float("inf")])
def test_check_refuses_impossible_rows(value, tmp_path):
    """A planned peak of 0 passed as '-100% better': a results file is refused (exit 2) when a
    row holds a value no plan or run can have."""
    from onnxplan.bench.results import dumps_results, new_results

    def write(name, peak):
        doc = new_results({"strategies": ["auto"]})
        doc["rows"] = [{"model": "mlp", "batch": 4, "strategy": "auto", "planned_peak_bytes": peak,
                        "lower_bound_bytes": 900_000, "measured_peak_bytes": None, "median_step_seconds": None}]
        (tmp_path / name).write_text(dumps_results(doc))
        return str(tmp_path / name)

    base, new = write("base.json", 1_000_000), write("new.json", value)
    needle = f"rows[0] (mlp, auto) has planned_peak_bytes {value!r}: not a possible value"
    assert_one_line_error(_invoke("check", new, "--baseline", base), 2, needle)
    assert_one_line_error(_invoke("check", base, "--baseline", new), 2, needle)
    assert _invoke("check", base, "--baseline", base).exit_code == 0


# -- progress -----------------------------------------------------------------------------------

def test_plan_shows_progress_in_logs(monkeypatch):
    """`plan resnet18 --budget 40MiB` worked 52 s without a line; plan now reports its stages."""
    import onnxplan.progress as progress

    monkeypatch.setenv("ONNXPLAN_PROGRESS", "lines")
    settings.reload()  # the environment changed: read it again
    monkeypatch.setattr(progress, "QUIET_SECONDS", 0.0)
    monkeypatch.setattr(progress, "_MIN_GAP", 0.0)
    r = _invoke("plan", "mlp", "--budget", "3.8MiB")
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert "onnxplan: plan: planning mlp for the budget 3.80 MiB" in r.stderr
    assert "onnxplan: plan: planned, peak" in r.stderr


# -- the floor message --------------------------------------------------------------------------

def test_floor_line_names_the_bound_not_the_peak_of_swapping_everything():
    """vgg16's `smallest peak 41.50 MiB ... floor 43.66 MiB`: the offset planners beat the peak of
    swapping everything (Floor.peak_bytes), so only the working set's bound is a floor."""
    from onnxplan.sizes import format_bytes
    from onnxplan.swap.driver import Floor

    mib = 1 << 20
    f = Floor(peak_bytes=45_780_000, working_set=40 * mib, eo=7, node="conv3/ConvGrad", scratch=mib, resident=2 * mib)
    line = f.describe()
    assert line.startswith(f"floor {format_bytes(f.bound)} ({f.bound} B): the largest single working set")
    assert str(f.peak_bytes) not in line and format_bytes(f.peak_bytes) not in line


def test_floor_message_states_a_true_bound():
    """`smallest peak 41.50 MiB ... floor 43.66 MiB`: the floor printed was the peak of swapping
    everything, not a bound. Now the floor is the largest working set, never above a reached peak."""
    import re

    r = _invoke("plan", "mlp", "--budget", "1MiB", "--no-profile")
    assert r.exit_code == 3
    text = " ".join(r.stderr.split())
    smallest = int(re.search(r"smallest peak \S+ \S+ \((\d+) B\)", text).group(1))
    floor = int(re.search(r"floor \S+ \S+ \((\d+) B\)", text).group(1))
    assert floor <= smallest, text
