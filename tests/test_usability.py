"""Usability lines: clear messages where a user used to read a Python error or a wall of text."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import onnx
from onnx import TensorProto, helper
from typer.testing import CliRunner

from onnxplan.bench.results import dumps_results, new_results
from onnxplan.cli.app import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def test_a_model_without_parameters_says_so(tmp_path):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "noparams",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, tmp_path / "noparams.onnx")
    r = runner.invoke(app, ["plan", str(tmp_path / "noparams.onnx")])
    assert r.exit_code == 2, r.stderr
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "nothing to train" in err, err
    assert "list index" not in err


def test_models_build_help_names_the_cache_folder_in_use():
    from onnxplan.loading.artifacts import default_cache_dir

    r = runner.invoke(app, ["models", "build", "--help"], env={"ONNXPLAN_CACHE": ""})
    text = " ".join(r.stdout.split())
    assert "~/.cache/onnxplan/artifacts" in text
    assert str(default_cache_dir()).endswith("/.cache/onnxplan/artifacts") or "ONNXPLAN_CACHE" in text


def test_the_readme_first_command_writes_no_tracked_file():
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)\n```", readme, re.S).group(1)
    outputs = re.findall(r"(?:-o|--html|--markdown|--csv) (\S+)", first)
    assert outputs, first
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split())
    for path in outputs:
        assert path.startswith("out/") and path not in tracked, path
    assert "out/" in (ROOT / ".gitignore").read_text().split()


def test_check_summarises_many_missing_rows(tmp_path):
    """A count, then one short line per model; the head line names the results file whole, however
    long its path and however narrow the terminal (it once wrapped at 160 columns under a long TMPDIR)."""
    def doc(rows):
        d = new_results({"strategies": sorted({r["strategy"] for r in rows})})
        d["rows"] = rows
        return dumps_results(d)

    rows = [{"model": f"m{k}", "batch": 4, "strategy": s, "planned_peak_bytes": 1000, "lower_bound_bytes": 900,
             "measured_peak_bytes": None, "median_step_seconds": None}
            for k in range(14) for s in ("auto", "given+naive", "nntrainer+sort", "greedy+best-fit", "ilp+ilp")]
    folder = tmp_path / ("long-folder-name-" * 10)
    folder.mkdir()
    (folder / "base.json").write_text(doc(rows))
    (folder / "new.json").write_text(doc(rows[:1]))
    r = runner.invoke(app, ["check", str(folder / "new.json"), "--baseline", str(folder / "base.json")],
                      env={"COLUMNS": "60"})
    assert r.exit_code == 1
    lines = r.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("missing from"))
    assert lines[head] == (f"missing from {folder / 'new.json'}: 69 baseline row(s) of 14 model(s), "
                           "a failure unless --allow-missing:")
    assert lines[head + 1] == "  m0 (batch 4): 4 strategies: given+naive, greedy+best-fit, ilp+ilp, nntrainer+sort"
    assert all(re.fullmatch(r"  m\d+ \(batch 4\): 5 strategies: auto, .*", line) for line in lines[head + 2:head + 11])
    assert lines[head + 11] == "  ... and 4 more model(s)" and len(lines) == head + 12
    assert all(len(line) < 100 for line in lines[head + 1:])


def test_text_lines_are_not_broken_at_the_terminal_width():
    """In a narrow terminal the tables fit its width and every line of text stays whole (the
    terminal wraps it), so a script or a test reading the output finds it on one line."""
    r = runner.invoke(app, ["plan", "mlp", "--batch", "4"], env={"COLUMNS": "40"})
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert "  skipped order ilp: auto uses the heuristic orders (--order ilp runs OLLA's lifetime ILP)" in lines
    assert re.fullmatch(r"persistent \S+ MiB \+ arena \S+ MiB = peak \S+ MiB", lines[-1]), lines[-1]
    table = [line for line in lines if line[:1] in "┏┃┡│└"]
    assert table and all(len(line) <= 40 for line in table)


def test_ci_runs_the_readmes_test_command_with_the_pins():
    """.ci/run runs the README's test command byte for byte, and it installs the versions of
    constraints.txt: every package pinned exactly, every dependency of pyproject.toml among them
    (read as tools/try_newest.py reads them)."""
    import importlib.util
    import tomllib

    readme = (ROOT / "README.md").read_text()
    block = readme.split("Install and run the tests")[1].split("```bash\n")[1].split("\n```")[0]
    venv, activate, command = block.split(" && ", 2)
    assert (venv, activate) == ("python3 -m venv .venv", ". .venv/bin/activate")
    assert command in (ROOT / ".ci/run").read_text().splitlines()
    assert command.startswith("pip install -c constraints.txt -e '.[test]' && ")
    spec = importlib.util.spec_from_file_location("try_newest", ROOT / "tools/try_newest.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    text = (ROOT / "constraints.txt").read_text()
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[\w.+!-]+", line) for line in lines)
    pins = {k: v for k, (_, v) in tool.read_pins(text).items()}
    assert len(pins) == len(lines)  # no package twice
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for req in project["dependencies"] + project["optional-dependencies"]["test"]:
        assert tool._dist(re.match(r"[A-Za-z0-9._-]+", req).group()) in pins, req
    assert pins["torch"] == "2.13.0" and pins["onnxruntime-training-cpu"] == "1.19.2"
    assert tool._same("2.13.0", "2.13.0+cpu") and not tool._same("2.13.0", "2.13.1")
