"""The package's import graph from its source (ast), by subpackage: module-level imports, or
every import statement wherever it is (`everywhere`: the imports that run on use too).

`python -m tests.import_graph` prints the graph between subpackages and any cycle;
tests/test_import_graph.py fails on a cycle, on a forbidden import and on a library module that
imports the zoo or the CLI (the leaves).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# import name -> source folder (setup.py's PACKAGE_DIR: the CLI and the zoo install under onnxplan)
SOURCES = {"onnxplan": ROOT / "onnxplan", "onnxplan.cli": ROOT / "cli", "onnxplan.models": ROOT / "models"}
# planning and what it is built from must not need the executor (the budget layer and the API sit above both)
BELOW_EXECUTOR = ("onnxplan.planning", "onnxplan.passes", "onnxplan.orders", "onnxplan.offsets", "onnxplan.swap",
                  "onnxplan.checkpoint")
# nothing in the library imports these: the zoo and the CLI sit on top of it
LEAVES = ("onnxplan.models", "onnxplan.cli")


def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    out = {}
    for pkg, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([pkg, *parts])] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run when the module is imported: the body, class bodies and the
    blocks of module-level if/try/with (not `if TYPE_CHECKING:`), but no function body."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            if not _is_type_checking(stmt.test):
                yield from _module_level(stmt.body)
            yield from _module_level(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                yield from _module_level(block)
        elif isinstance(stmt, (ast.With, ast.ClassDef)):
            yield from _module_level(stmt.body)
        else:
            yield stmt


def _statements(source: str, everywhere: bool) -> Iterable[ast.stmt]:
    tree = ast.parse(source)
    if everywhere:  # every import statement, in functions and `if TYPE_CHECKING:` blocks too
        return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return _module_level(tree.body)


def imports_of(name: str, source: str, known: set[str], everywhere: bool = False) -> set[str]:
    """The package's modules `name` imports at module level (`everywhere`: anywhere, functions
    included). An imported attribute counts as its module; `from pkg import sub` as the submodule."""
    is_pkg = name in known and any(k.startswith(name + ".") for k in known)
    out = set()
    for stmt in _statements(source, everywhere):
        if isinstance(stmt, ast.Import):
            targets = [a.name for a in stmt.names]
        elif isinstance(stmt, ast.ImportFrom):
            base = stmt.module or ""
            if stmt.level:  # relative: from the module's package
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - stmt.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in stmt.names]
        else:
            continue
        out.update(t for t in targets if t == "onnxplan" or t.startswith("onnxplan."))
    out.discard(name)
    return out


def module_graph(everywhere: bool = False) -> dict[str, set[str]]:
    """module -> the package's modules it imports at module level (`everywhere`: also inside
    functions, the imports that run on use)."""
    mods = modules()
    known = set(mods)
    out = {}
    for name, path in mods.items():
        out[name] = imports_of(name, path.read_text(), known, everywhere)
    return out


def unit(module: str) -> str:
    """The subpackage (or top-level module) a module belongs to: onnxplan.X."""
    return ".".join(module.split(".")[:2])


def unit_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Subpackage -> the subpackages its modules import (itself left out)."""
    out: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        edges = out.setdefault(unit(mod), set())
        edges.update(unit(d) for d in deps if unit(d) != unit(mod))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # recursive: the graph is a few dozen subpackages deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def forbidden_imports(graph: dict[str, set[str]], below: tuple[str, ...] = BELOW_EXECUTOR,
                      banned: str = "onnxplan.executor") -> list[tuple[str, str]]:
    """(module, imported module) for each module-level import of `banned` from a module of `below`."""
    return sorted((m, d) for m, deps in graph.items() if unit(m) in below
                  for d in deps if d == banned or d.startswith(banned + "."))


def leaf_imports(graph: dict[str, set[str]], leaves: tuple[str, ...] = LEAVES) -> list[tuple[str, str]]:
    """(module, imported module) for each import of a leaf (the zoo, the CLI) from outside the leaves."""
    return sorted((m, d) for m, deps in graph.items() if unit(m) not in leaves
                  for d in deps if unit(d) in leaves)


def main() -> None:
    ug = unit_graph(module_graph())
    for u in sorted(ug):
        print(f"{u.removeprefix('onnxplan.') or 'onnxplan'} -> "
              f"{', '.join(sorted(d.removeprefix('onnxplan.') or 'onnxplan' for d in ug[u])) or '-'}")
    for c in cycles(ug):
        print("CYCLE:", " <-> ".join(c))
    for m, d in forbidden_imports(module_graph()):
        print(f"FORBIDDEN: {m} imports {d}")
    full = module_graph(everywhere=True)
    for c in cycles(unit_graph(full)):
        print("cycle through imports inside functions:", " <-> ".join(c))
    for m, d in leaf_imports(full):
        print(f"LEAF: {m} imports {d}")


if __name__ == "__main__":
    main()
