"""Issue 27's size rule, held in CI: no library module over MAX_MODULE_LINES lines, no function
over MAX_FUNCTION_LINES (the library: onnxplan/ and the CLI in cli/; tests, benchmarks and the
zoo's model builders are not held to it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("onnxplan", "cli")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def oversized(source: str, where: str) -> list[str]:
    """What in `source` (a module's text, named `where`) breaks the rule, one line each."""
    lines = source.count("\n") + (0 if source.endswith("\n") or not source else 1)
    out = [f"{where}: {lines} lines (at most {MAX_MODULE_LINES})"] if lines > MAX_MODULE_LINES else []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                out.append(f"{where}:{node.lineno}: {node.name} has {length} lines (at most {MAX_FUNCTION_LINES})")
    return out


def test_no_library_module_or_function_is_over_the_limits():
    modules = [p for top in LIBRARY for p in sorted((ROOT / top).rglob("*.py"))]
    assert len(modules) > 100, "the walk must see the library"
    found = [line for p in modules for line in oversized(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, "\n".join(found)


def test_a_planted_long_function_and_a_long_module_are_caught():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))  # def + 80 lines: 81
    assert oversized(f"def f():\n{body}\n", "m.py") == [f"m.py:1: f has {MAX_FUNCTION_LINES + 1} lines (at most 80)"]
    assert oversized(f"async def g():\n{body[:-len(body.splitlines()[-1]) - 1]}\n", "m.py") == []  # exactly 80
    long_module = "\n".join(f"y{i} = {i}" for i in range(MAX_MODULE_LINES + 1)) + "\n"
    assert oversized(long_module, "m.py") == [f"m.py: {MAX_MODULE_LINES + 1} lines (at most {MAX_MODULE_LINES})"]
    assert oversized(long_module.split("\n", 1)[1], "m.py") == []
