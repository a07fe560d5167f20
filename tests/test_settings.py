"""onnxplan.settings: every ONNXPLAN_* variable read in one module, on first use, overridable in code."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from onnxplan import settings
from onnxplan.kernels import _torch
from onnxplan.settings import ENV, Settings
from tests.import_graph import SOURCES


def test_the_environment_gives_the_settings(tmp_path):
    env = {ENV["cache_dir"]: str(tmp_path), ENV["torch_kernels"]: "0", ENV["bind_kernels"]: "0",
           ENV["threads"]: " 3 ", ENV["swap_bandwidth"]: "2e8", ENV["progress"]: "LINES", ENV["debug"]: "1",
           ENV["keep_openmp_wait"]: "1", ENV["probe_method"]: "sampled", ENV["parallel_min_elems"]: "64",
           ENV["native_kernels"]: "0", ENV["interop"]: "1"}
    got = Settings.from_environ(env)
    assert got == Settings(cache_dir=tmp_path, swap_bandwidth="2e8", torch_kernels=False, bind_kernels=False,
                           threads="3", keep_openmp_wait=True, probe_method="sampled", progress="lines",
                           debug=True, parallel_min_elems=64, native_kernels=False, interop="all")
    assert Settings.from_environ({}) == Settings()
    assert Settings.from_environ({ENV["debug"]: "0", ENV["torch_kernels"]: "1"}) == Settings()


def test_code_overrides_the_settings_and_the_kernels_read_them():
    x = np.zeros((4, 8), np.float32)
    assert settings.current().torch_kernels and _torch.usable(np, x, x)
    with settings.override(torch_kernels=False) as inside:
        assert settings.current() is inside and not _torch.usable(np, x, x)
    assert settings.current().torch_kernels and _torch.usable(np, x, x)


def test_nothing_reads_the_settings_at_import():
    code = ("import onnxplan, onnxplan.cli.app, onnxplan.kernels.registry, onnxplan.kernels.conv\n"
            "from onnxplan import settings\nassert settings._current is None, settings._current\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def _environment_reads(source: str) -> list[int]:
    """Lines of `os.environ.get("ONNXPLAN_...")`, `os.getenv(...)` or `os.environ["ONNXPLAN_..."]`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "getenv"):
            args = node.args
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            args = [node.slice]
        else:
            continue
        if args and isinstance(args[0], ast.Constant) and str(args[0].value).startswith("ONNXPLAN_"):
            lines.append(node.lineno)
    return lines


def test_no_module_but_settings_reads_an_onnxplan_variable():
    assert _environment_reads('import os\nx = os.environ.get("ONNXPLAN_X", "1")\ny = os.environ["ONNXPLAN_Y"]\n') == [2, 3]
    found = {str(path): lines for folder in SOURCES.values() for path in sorted(Path(folder).rglob("*.py"))
             if path.name != "settings.py" and (lines := _environment_reads(path.read_text()))}
    assert not found, f"ONNXPLAN_* read outside onnxplan/settings.py: {found}"


@pytest.mark.parametrize(("raw", "mode"), [(None, "products"), ("0", "off"), ("off", "off"), ("1", "all"),
                                           ("all", "all"), (" Products ", "products")])
def test_interop_modes(raw, mode):
    env = {} if raw is None else {ENV["interop"]: raw}
    assert Settings.from_environ(env).interop == mode
