"""Do the newest versions of onnxplan's dependencies still pass, and if not, which one broke what?

    python tools/try_newest.py [--tests "PYTEST ARGS"] [--constraints FILE] [--work DIR] [--keep]

1. A fresh virtual environment installs `-e '.[test]'` without the pins (pip takes the newest
   versions) and runs the tests (default: the fast tier, -m "not slow").
2. Every package whose version there differs from constraints.txt is listed.
3. Where tests failed: a second environment installs the pins and reruns the failed tests (a
   test that fails there too is not an upgrade's doing); then it upgrades one differing package
   at a time to its newest version, reruns the failed tests, and goes back to the pins.

The table: package, pinned, newest, result. Exit 0: the newest versions pass; 1: a test failed
with them (the table says which upgrade breaks it); 2: an environment could not be set up.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAST_TIER = '-m "not slow"'


def _dist(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str) -> dict[str, tuple[str, str]]:
    """name==version lines (comments and blanks skipped): {normalised name: (name, version)}."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[_dist(name)] = (name.strip(), version.strip())
    return pins


def _same(pinned: str, installed: str) -> bool:
    """torch==2.13.0 pins the local build 2.13.0+cpu too (a pin without a local label matches any)."""
    return installed == pinned or ("+" not in pinned and installed.split("+")[0] == pinned)


def _node_id(classname: str, name: str) -> str:
    """JUnit's classname (tests.test_x or tests.test_x.TestClass) and name as a pytest node id."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (ROOT / path).is_file():
            return "::".join([path, *parts[cut:], name])
    return f"{classname.replace('.', '/')}.py::{name}"


class Env:
    """A virtual environment at `path` with onnxplan installed editable from this checkout."""

    def __init__(self, path: Path, log: Path) -> None:
        self.path, self.log = path, log
        self.python = str(path / "bin" / "python")

    def sh(self, *args: str, check: bool = True) -> int:
        with self.log.open("a") as log:
            log.write(f"\n$ {shlex.join(args)}\n")
            log.flush()
            rc = subprocess.run(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
        if check and rc != 0:
            print(f"try_newest: error: '{shlex.join(args)}' failed (exit {rc}); see {self.log}", file=sys.stderr)
            raise SystemExit(2)
        return rc

    def create(self, constraints: Path | None) -> Env:
        self.sh(sys.executable, "-m", "venv", str(self.path))
        pins = ["-c", str(constraints)] if constraints else []
        self.sh(self.python, "-m", "pip", "install", *pins, "-e", ".[test]")
        return self

    def pip(self, *args: str, check: bool = True) -> int:
        return self.sh(self.python, "-m", "pip", *args, check=check)

    def versions(self) -> dict[str, tuple[str, str]]:
        out = subprocess.run([self.python, "-m", "pip", "freeze", "--exclude-editable"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        return read_pins(out)

    def failures(self, pytest_args: list[str], report: Path) -> list[str] | None:
        """Run pytest; the ids of the tests that failed or errored (None: pytest itself failed)."""
        report.unlink(missing_ok=True)
        rc = self.sh(self.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                     *pytest_args, check=False)
        if rc not in (0, 1) or not report.exists():
            return None if rc not in (0, 5) else []
        failed = []
        for case in ET.parse(report).iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(_node_id(case.get("classname", ""), case.get("name", "")))
        return failed


def try_one(env: Env, name: str, newest: str, pins: Path, failed: list[str], report: Path) -> str:
    """Upgrade `name` alone to `newest`, rerun the failed tests, go back to the pins."""
    before = env.versions()
    if env.pip("install", f"{name}=={newest}", check=False) != 0:
        return "could not install alone"
    after = env.versions()
    moved = sorted(after[k][0] for k in after if k != _dist(name) and before.get(k) != after[k])
    still = env.failures(failed, report)
    env.pip("install", "-r", str(pins))  # back to the pins; packages the upgrade brought in go too
    extra = [after[k][0] for k in after if k not in before]
    if extra:
        env.pip("uninstall", "-y", *extra)
    with_ = f" (with {', '.join(moved)})" if moved else ""
    if still is None:
        return "pytest did not run" + with_
    if still:
        return f"BREAKS {len(still)} of {len(failed)}: {', '.join(still[:3])}{' ...' if len(still) > 3 else ''}{with_}"
    return "ok" + with_


def table(rows: list[tuple[str, str, str, str]]) -> str:
    head = ("package", "pinned", "newest", "result")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(3)]
    lines = []
    for r in [head, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--tests", default=FAST_TIER, help=f"pytest arguments (default: {FAST_TIER})")
    ap.add_argument("--constraints", type=Path, default=ROOT / "constraints.txt", help="the pins (constraints.txt)")
    ap.add_argument("--work", type=Path, help="folder for the environments and logs (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the environments (in the work folder)")
    args = ap.parse_args(argv)
    if not args.constraints.is_file():
        print(f"try_newest: error: no constraints file {args.constraints}", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="try-newest-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    pins_path = args.constraints.resolve()
    pins = read_pins(pins_path.read_text())
    tests = shlex.split(args.tests)
    print(f"try_newest: environments and log in {work}", flush=True)

    try:
        return _run(args, work, log, pins_path, pins, tests)
    finally:
        if not args.keep:
            shutil.rmtree(work / "newest", ignore_errors=True)
            shutil.rmtree(work / "pinned", ignore_errors=True)


def _run(args, work: Path, log: Path, pins_path: Path, pins: dict, tests: list[str]) -> int:
    newest_env = Env(work / "newest", log).create(None)
    newest = newest_env.versions()
    differ = sorted(k for k in newest.keys() | pins.keys()
                    if k not in pins or k not in newest or not _same(pins[k][1], newest[k][1]))
    print(f"try_newest: {len(differ)} package(s) differ from {pins_path.name}; running {args.tests} "
          "with the newest versions", flush=True)
    failed = newest_env.failures(tests, work / "newest.xml")
    if failed is None:
        print(f"try_newest: error: pytest did not run with the newest versions; see {log}", file=sys.stderr)
        return 2
    rows = []
    if not failed:
        for k in differ:
            rows.append((newest.get(k, pins.get(k))[0], pins.get(k, ("", "-"))[1], newest.get(k, ("", "-"))[1],
                         "ok (the tests pass with every newest version)"))
        print(table(rows) if rows else "try_newest: the pins are the newest versions")
        print(f"try_newest: {args.tests}: passed with the newest versions")
        return 0
    print(f"try_newest: {len(failed)} test(s) failed with the newest versions; trying one upgrade at a time",
          flush=True)
    pinned_env = Env(work / "pinned", log).create(pins_path)
    on_pins = pinned_env.failures(failed, work / "pinned.xml")
    if on_pins:
        print(f"try_newest: {len(on_pins)} of them fail with the pins too (not an upgrade's doing): "
              + ", ".join(on_pins[:5]))
    to_try = [t for t in failed if t not in (on_pins or [])]
    for k in differ:
        name = newest.get(k, pins.get(k))[0]
        pinned_v, newest_v = pins.get(k, ("", "-"))[1], newest.get(k, ("", "-"))[1]
        if k not in newest:
            result = "not installed with the newest versions"
        elif k not in pins:
            result = "new dependency (comes with an upgrade; not tried alone)"
        elif not to_try:
            result = "not tried (every failure fails with the pins too)"
        else:
            result = try_one(pinned_env, name, newest_v, pins_path, to_try, work / "one.xml")
        rows.append((name, pinned_v, newest_v, result))
        print(f"  {name} {pinned_v} -> {newest_v}: {result}", flush=True)
    print(table(rows))
    print("failed with the newest versions: " + ", ".join(failed))
    return 1


if __name__ == "__main__":
    sys.exit(main())
