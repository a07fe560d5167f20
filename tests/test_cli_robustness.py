"""Issue 16's bad-input cases: each ends in one line on stderr, its documented exit code, no
traceback and nothing left behind; usage errors are one line; a bug is exit 4."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from onnxplan.cli.app import app
from tests.cli_asserts import assert_one_line_error

runner = CliRunner()
NINES_400 = "9" * 400


def _run(*args: str, env: dict | None = None):
    return runner.invoke(app, list(args), env=env)


_one_line = assert_one_line_error


def _cache() -> set[str]:
    root = Path(os.environ["ONNXPLAN_CACHE"])
    return {p.name for p in root.iterdir()} if root.exists() else set()


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _forward(path: Path, shape=("batch", 6), elem=TensorProto.FLOAT, node_name="mm", w_rows=6) -> Path:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((w_rows, 3)).astype(np.float32), "W")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name=node_name)], "tiny",
        [helper.make_tensor_value_info("x", elem, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [shape[0], 3])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    path.write_bytes(m.SerializeToString())
    return path


@pytest.fixture(scope="module")
def mlp_art(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mlp-art")
    assert _run("models", "build", "mlp", "--batch", "4", "-o", str(out)).exit_code == 0
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory, mlp_art) -> Path:
    out = tmp_path_factory.mktemp("res") / "res.json"
    r = _run("bench", str(mlp_art), "--strategies", "auto", "--no-measure", "-o", str(out))
    assert r.exit_code == 0, r.stderr
    return out


# 1. a negative dimension: inspect, plan and run
@pytest.mark.parametrize("command", ["inspect", "plan", "run"])
def test_negative_dimension(tmp_path, command):
    p = _forward(tmp_path / "neg.onnx", shape=(-3, 6))
    before = _cache()
    _one_line(_run(command, str(p), *(["--no-measure"] if command == "run" else [])), 2,
              "input 'x' has a negative dimension -3 (axis 0)")
    assert _cache() == before and _left(tmp_path) == ["neg.onnx"]


# 2. huge planned sizes: planned in Python ints (greedy-size past its int64 packing), or refused
@pytest.mark.slow
def test_huge_batch_is_planned(tmp_path):
    r = _run("plan", "mlp", "--batch", "1000000000", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["peak_bytes"] > 2**42


@pytest.mark.slow
def test_huge_input_is_planned(tmp_path):
    p = _forward(tmp_path / "huge.onnx", shape=(10**9, 10**6), w_rows=10**6)
    r = _run("plan", str(p), "--planner", "greedy-size", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["peak_bytes"] >= 4 * 10**15


def test_input_past_the_size_limit_is_refused_before_generation(tmp_path):
    p = _forward(tmp_path / "big.onnx")
    before = _cache()
    _one_line(_run("plan", str(p), "--dim", f"batch={2**52}"), 2, "more than onnxplan plans for")
    assert _cache() == before


# 3. sizes with 400 digits, --dim with 30 nines
@pytest.mark.parametrize("args", [("--budget", NINES_400), ("--swap", "window", "--window-bytes", NINES_400 + "MiB")])
def test_size_with_400_digits(tmp_path, mlp_art, args):
    _one_line(_run("plan", str(mlp_art), "-o", str(tmp_path / "p.json"), *args), 2, "more than 8192.00 TiB")
    assert _left(tmp_path) == []


def test_dim_with_30_nines(tmp_path):
    p = _forward(tmp_path / "dyn.onnx")
    _one_line(_run("plan", str(p), "--dim", "batch=" + "9" * 30), 2, "invalid --dim batch=999")
    _one_line(_run("plan", str(p), "--batch", "9" * 30), 2, "invalid --batch")


# 4. an input whose dtype is UNDEFINED (or STRING); a node name that is not UTF-8
@pytest.mark.parametrize("elem, name", [(TensorProto.UNDEFINED, "UNDEFINED"), (TensorProto.STRING, "STRING")])
def test_non_numeric_input_dtype(tmp_path, elem, name):
    p = _forward(tmp_path / "u.onnx", elem=elem)
    before = _cache()
    _one_line(_run("plan", str(p), "--batch", "2"), 2, f"input 'x': element type {name} is not a numeric")
    assert _cache() == before


def test_node_name_not_utf8(tmp_path):
    p = _forward(tmp_path / "n.onnx", node_name="NODENAMEX")
    p.write_bytes(p.read_bytes().replace(b"NODENAMEX", b"NODE\xff\xfeAMX"))
    before = _cache()
    for command in ("inspect", "plan"):
        _one_line(_run(command, str(p), "--batch", "2"), 2, "a name is not valid UTF-8")
    assert _cache() == before


# 5. --plan that is a JSON list, null or string, or a folder (run and explain)
@pytest.mark.parametrize("text, needle", [("[]", "the JSON is list"), ("null", "the JSON is NoneType"),
                                          ('"plan"', "the JSON is str"), (None, "is a folder, not a plan file")])
def test_plan_file_not_a_plan(tmp_path, mlp_art, text, needle):
    p = tmp_path / "p.json"
    if text is None:
        p.mkdir()
    else:
        p.write_text(text)
    _one_line(_run("run", str(mlp_art), "--plan", str(p), "--no-measure"), 2, needle)
    _one_line(_run("explain", str(p)), 2, needle)
    assert _left(tmp_path) == ["p.json"]


# 7. -o DIR, -o /proc/self/x, report --markdown DIR (checked before the HTML is written)
def test_output_is_a_folder(tmp_path, mlp_art):
    (tmp_path / "d").mkdir()
    _one_line(_run("plan", str(mlp_art), "-o", str(tmp_path / "d")), 2, "is a folder; give a file name")
    assert _left(tmp_path) == ["d"] and _left(tmp_path / "d") == []


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_output_in_proc(mlp_art):
    _one_line(_run("plan", str(mlp_art), "-o", "/proc/self/x"), 2, "/proc/self/x: cannot write in folder /proc/self")


def test_output_is_a_device(mlp_art):
    _one_line(_run("plan", str(mlp_art), "-o", os.devnull), 2, "not a regular file")


def test_report_markdown_folder_writes_nothing(tmp_path, results):
    (tmp_path / "d").mkdir()
    _one_line(_run("report", str(results), "-o", str(tmp_path / "r.html"), "--markdown", str(tmp_path / "d")),
              2, "is a folder")
    assert _left(tmp_path) == ["d"]


def test_check_update_baseline_into_a_folder(tmp_path, results):
    (tmp_path / "d").mkdir()
    _one_line(_run("check", str(results), "--baseline", str(tmp_path / "d"), "--update-baseline"), 2, "is a folder")


# 8. --swap-dir on a full file system: the reservation fails, or (no fallocate) a write does
@pytest.mark.parametrize("where", ["fallocate", "pwrite"])
def test_swap_dir_full(tmp_path, mlp_art, monkeypatch, where):
    from onnxplan.swap import store as swap_io

    def no_room(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def no_fallocate(*a, **k):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(swap_io.os, "posix_fallocate", no_room if where == "fallocate" else no_fallocate)
    if where == "pwrite":
        monkeypatch.setattr(swap_io.os, "pwrite", no_room)
    swap_dir = tmp_path / "swap"
    swap_dir.mkdir()
    r = _run("run", str(mlp_art), "--swap", "on-demand", "--swap-dir", str(swap_dir), "--steps", "1",
             "--warmup", "0", "--no-measure")
    _one_line(r, 2, f"--swap-dir {swap_dir}: no room for the swap file")
    assert _left(swap_dir) == []


# 9. report on results with a null planned_peak_bytes
def test_report_null_planned_peak(tmp_path, results):
    doc = json.loads(results.read_text())
    doc["rows"][0]["planned_peak_bytes"] = None
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    _one_line(_run("report", str(bad), "-o", str(tmp_path / "r.html")), 2,
              "rows[0].planned_peak_bytes: input should be a valid number")
    assert _left(tmp_path) == ["bad.json"]


def test_device_as_model_is_not_missing():
    _one_line(_run("inspect", os.devnull), 2, f"{os.devnull}: not a regular file or folder")


# usage errors: one line, exit 2, for every command; usage lines without {model} or list[...]
COMMANDS = [["inspect"], ["plan"], ["run"], ["explain"], ["report"], ["models", "build"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_usage_errors_are_one_line(command):
    # run's MODEL is optional (a plan file can name it): its own line says what is missing
    _one_line(_run(*command), 2, "needs a MODEL" if command == ["run"] else "Missing")
    _one_line(_run(*command, "x", "--no-such-option"), 2, "No such option: --no-such-option")
    usage = _run(*command, "--help").stdout
    assert "{" not in usage.splitlines()[0] and "list[" not in usage, usage


@pytest.mark.parametrize("command", [["bench"], ["models", "list"], ["check"]], ids=" ".join)
def test_usage_errors_are_one_line_without_required_arguments(command):
    _one_line(_run(*command, "--no-such-option"), 2, "No such option")
    _one_line(_run(*command, "--json", "--json=3"), 2, "")


def test_bad_option_value_is_one_line(mlp_art):
    _one_line(_run("plan", str(mlp_art), "--batch", "x"), 2, "Invalid value for '--batch'")


def test_usage_names_the_arguments():
    assert "Usage: onnxplan plan [OPTIONS] MODEL" in _run("plan", "--help").stdout
    assert "Usage: onnxplan report [OPTIONS] RESULTS..." in _run("report", "--help").stdout
    assert "Usage: onnxplan bench [OPTIONS] [MODELS]..." in _run("bench", "--help").stdout


# an unexpected internal error: exit 4, one line that says it is a bug; the traceback on request
def test_internal_error_is_exit_4(monkeypatch, mlp_art):
    from onnxplan.cli import inspect_cmd

    def boom(graph):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(inspect_cmd, "inspect_summary", boom)
    _one_line(_run("inspect", str(mlp_art)), 4, "internal error, a bug in onnxplan (ZeroDivisionError: planted)")
    for r in (_run("--debug", "inspect", str(mlp_art)), _run("inspect", str(mlp_art), env={"ONNXPLAN_DEBUG": "1"})):
        assert r.exit_code == 4
        assert "Traceback" in r.stderr and "ZeroDivisionError: planted" in r.stderr
        assert r.stderr.strip().splitlines()[-1].startswith("onnxplan: error: internal error")
    assert _run("inspect", str(mlp_art)).exit_code == 4  # --debug does not stick to the next run
    assert "Traceback" not in _run("inspect", str(mlp_art)).stderr


def test_help_documents_exit_4():
    assert "4 an internal error" in " ".join(_run("--help").stdout.split())


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_models_build_into_proc():
    _one_line(_run("models", "build", "mlp", "--batch", "4", "-o", "/proc/self/x"), 2, "/proc/self/x: cannot write")
