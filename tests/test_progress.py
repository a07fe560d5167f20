"""Progress of long work: plain lines on stderr when it is not a terminal, silent when quick."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from onnxplan import progress as progress_module
from onnxplan import settings
from onnxplan.cli.app import app
from onnxplan.progress import Progress, solve_cp_sat

runner = CliRunner()


@pytest.fixture
def eager(monkeypatch):
    """Lines mode with no quiet period: every item change prints."""
    monkeypatch.setenv("ONNXPLAN_PROGRESS", "lines")
    settings.reload()  # the environment changed: read it again
    monkeypatch.setattr(progress_module, "QUIET_SECONDS", 0.0)
    monkeypatch.setattr(progress_module, "_MIN_GAP", 0.0)


def test_lines_per_item_and_a_closing_line(eager, capsys):
    with Progress("bench", total=2) as p:
        p.update("mlp auto: planning")
        p.update("mlp auto: done", advance=1)
        p.update("mlp given: done", advance=1)
        p.finish("2 row(s)")
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("onnxplan: bench: 0/2 mlp auto: planning (")
    assert any(line.startswith("onnxplan: bench: 2/2 mlp given: done") for line in err)
    assert err[-1].startswith("onnxplan: bench: 2 row(s) (")


def test_quick_work_and_off_are_silent(monkeypatch, capsys):
    monkeypatch.setenv("ONNXPLAN_PROGRESS", "lines")
    settings.reload()  # the environment changed: read it again
    with Progress("run") as p:
        p.update("planning")
        p.finish("done")
    monkeypatch.setenv("ONNXPLAN_PROGRESS", "off")
    settings.reload()  # the environment changed: read it again
    monkeypatch.setattr(progress_module, "QUIET_SECONDS", 0.0)
    with Progress("run") as p:
        p.update("planning")
        p.finish("done")
    assert capsys.readouterr().err == ""


def test_a_heartbeat_while_one_item_runs_long(eager, monkeypatch, capsys):
    import time

    monkeypatch.setattr(progress_module, "EVERY_SECONDS", 0.2)
    with Progress("run") as p:
        p.update("measuring")
        time.sleep(1.5)
    lines = [line for line in capsys.readouterr().err.splitlines() if "measuring" in line]
    assert len(lines) >= 2


def test_nested_work_on_a_bar_does_not_open_a_second_display(monkeypatch):
    monkeypatch.setenv("ONNXPLAN_PROGRESS", "bar")
    settings.reload()  # the environment changed: read it again
    with Progress("run") as outer:
        outer.update("planning")
        with Progress("ILP order") as inner:
            inner.update("CP-SAT solving")
            assert outer.item.startswith("planning | ILP order")
        assert outer.item == "planning"


def test_an_ilp_solve_says_its_limit_and_gap(eager, capsys):
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    x = m.new_int_var(0, 10, "x")
    m.add(x >= 3)
    m.minimize(x)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = 5.0
    assert solve_cp_sat(solver, m, "ILP offsets") == cp_model.OPTIMAL
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("onnxplan: ILP offsets: CP-SAT solving, time limit 5.0 s")
    assert err[-1].startswith("onnxplan: ILP offsets: optimal, gap 0.0%")


def test_run_and_bench_say_what_they_do_when_stderr_is_not_a_terminal(eager, tmp_path):
    r = runner.invoke(app, ["run", "mlp", "--batch", "4", "--steps", "2", "--warmup", "0", "--no-measure"])
    assert r.exit_code == 0, r.stderr
    assert "onnxplan: run: planning" in r.stderr and "onnxplan: run: running step 2/2" in r.stderr
    r = runner.invoke(app, ["bench", "mlp", "--batch", "4", "--strategies", "given+naive", "--no-measure",
                            "-o", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.stderr
    assert "onnxplan: bench: 0/1 mlp" in r.stderr and "onnxplan: bench: 1 row(s)" in r.stderr
