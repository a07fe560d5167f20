"""Shared CLI plumbing: error handling, model options, atomic output files."""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import typer
from rich.console import Console

from onnxplan.errors import OnnxplanError, UsageError
from onnxplan.ir.graph import ValueClass
from onnxplan.resolve import ModelRequest, make_request
from onnxplan.sizes import MAX_BYTES

__all__ = ["handle_errors", "model_request", "check_output", "write_atomic", "print_json", "fail", "console"]


class _Console(Console):
    """Text is printed unbroken (soft wrap: the terminal wraps it, no newline is inserted);
    tables and other renderables are laid out to the width as usual."""

    def print(self, *objects: Any, soft_wrap: bool | None = None, **kwargs: Any) -> None:
        if soft_wrap is None:
            soft_wrap = all(isinstance(o, str) for o in objects)
        super().print(*objects, soft_wrap=soft_wrap, **kwargs)


def console(fallback: int, least: int = 0, **kwargs: Any) -> Console:
    """The commands' rich console: as wide as the terminal (`fallback` columns where there is
    none), at least `least`. Tables fit that width; a line of text is never broken: a long line,
    a long path in it, stays one line for the terminal to wrap, so whoever reads the output (a
    test, a script, a user copying a path) gets it whole at any width."""
    return _Console(width=max(shutil.get_terminal_size((fallback, 24)).columns, least), **kwargs)


def fail(message: str, code: int) -> None:
    """Print one line on stderr and exit with `code`."""
    typer.echo(f"onnxplan: error: {message}", err=True)
    raise typer.Exit(code)


def handle_errors(fn: Callable) -> Callable:
    """Turn OnnxplanError into one line on stderr and its exit code; no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except OnnxplanError as exc:
            fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            fail("interrupted", 130)

    return wrapper


def parse_dims(dims: list[str] | None) -> tuple[tuple[str, int], ...]:
    out = []
    for item in dims or []:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit():
            raise UsageError(f"invalid --dim '{item}': expected NAME=INT, e.g. --dim batch=32")
        if int(value) > MAX_BYTES:
            raise UsageError(f"invalid --dim {name}={value}: more than 2**53")
        out.append((name, int(value)))
    return tuple(out)


def model_request(model: str, batch: int | None, optimizer: str | None, loss: str | None,
                  dims: list[str] | None, train: list[str] | None = None,
                  freeze: list[str] | None = None) -> ModelRequest:
    """The request of the model options (--dim as NAME=INT), checked (onnxplan.resolve.make_request)."""
    return make_request(model, batch, optimizer, loss, parse_dims(dims), train, freeze)


THREADS_HELP = ("Threads for every pool of the process: numpy's BLAS, torch (intra-op; inter-op 1), "
                "OpenMP and each ONNX Runtime session (default: every core this process may use). "
                "README: Threads.")
TRAIN_HELP = "Train only the initializers matching this glob (forward .onnx; repeatable)."
FREEZE_HELP = "Freeze the initializers matching this glob (forward .onnx; repeatable)."
STRATEGY_HELP = ("With --budget, how to meet it: auto (default: the plain plan if it fits, else recompute or swap, "
                 "whichever fits predicted faster; within 10%, swap: onnxplan/budget/decide.py), recompute (rotor's fastest checkpoint schedule "
                 "that fits), swap (the swap module's auto policy), joint (recomputation on the whole graph and "
                 "paging chosen together by the joint CP-SAT solver; opt-in: seconds per solve, --time-limit each; "
                 "`onnxplan explain` shows what it kept, recomputed and swapped per value).")


def check_output(*paths: Path | str | None) -> None:
    """Refuse output paths that cannot be written (UsageError, exit 2): a command checks all of
    its outputs with this before its work and before writing any of them. None and '-'
    (stdout) pass."""
    for path in paths:
        if path is None or str(path) == "-":
            continue
        path = Path(path)
        if not path.parent.is_dir():
            raise UsageError(f"{path}: folder {path.parent} does not exist")
        if path.is_dir():
            raise UsageError(f"{path}: is a folder; give a file name")
        if path.exists() and not path.is_file():
            raise UsageError(f"{path}: not a regular file (a device, pipe or socket); give a file name")
        try:  # a probe, not os.access: it also holds for root and for read-only file systems
            fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        except OSError as exc:
            raise UsageError(f"{path}: cannot write in folder {path.parent} ({exc.strerror or exc})") from None
        os.close(fd)
        os.unlink(probe)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write a file via a temporary sibling and rename, so no half-written file is left."""
    path = Path(path)
    check_output(path)
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise UsageError(f"{path}: cannot write ({exc.strerror or exc})") from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a written file gets the usual mode
    try:
        with os.fdopen(fd, mode) as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"{path}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")



def parameter_report(graph) -> dict:
    """Trained and frozen parameter names of a step graph, and for a forward .onnx what
    onnxplan rewrote to make it trainable (JSON: inspect's and plan's "parameters")."""
    produced = {o for n in graph.nodes for o in n.outputs}
    params = [v for v in graph.values.values() if v.vclass == ValueClass.PARAMETER and v.name not in produced]
    return {
        "trained": [v.name for v in params if v.trainable],
        "frozen": [v.name for v in params if not v.trainable],
        "rewrites": list(graph.source.get("rewrites", [])),
        "rebatched": graph.source.get("rebatched"),
    }


def parameter_lines(report: dict, limit: int = 8) -> list[str]:
    """The parameter report as text lines (names cut after `limit`)."""

    def names(items: list[str]) -> str:
        shown = ", ".join(items[:limit])
        return shown + (f", ... (+{len(items) - limit})" if len(items) > limit else "")

    lines = [f"trained parameters ({len(report['trained'])}): {names(report['trained'])}",
             f"frozen parameters ({len(report['frozen'])}): {names(report['frozen']) or '-'}"]
    lines += [f"forward model: {note}" for note in report["rewrites"]]
    return lines
