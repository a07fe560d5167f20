"""Shared CLI plumbing: error handling, model options, atomic output files."""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from onnxplan import files
from onnxplan.errors import OnnxplanError, UsageError
from onnxplan.loading.request import LoadRequest, make_request
from onnxplan.sizes import MAX_BYTES

__all__ = ["check_output", "console", "fail", "handle_errors", "model_request", "print_json", "write_atomic"]


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
                  freeze: list[str] | None = None) -> LoadRequest:
    """The request of the model options (--dim as NAME=INT), checked (onnxplan.loading.request.make_request)."""
    return make_request(model, batch, optimizer, loss, parse_dims(dims), train, freeze)


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
    try:
        files.write_atomic(path, data)
    except OSError as exc:
        raise UsageError(f"{path}: cannot write ({exc.strerror or exc})") from None


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
