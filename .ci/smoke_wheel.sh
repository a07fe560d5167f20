#!/usr/bin/env bash
# The wheel as a user gets it: build it from this checkout's files (a clean copy, so no stale
# build/ output gets in), install it NOT editable into a fresh virtual environment, and run
# every command once on a tiny model from outside the source tree (so nothing is imported
# from the checkout). Usage: .ci/smoke_wheel.sh (installs the dependencies too, at the versions of
# constraints.txt, from pip's cache: minutes), or SMOKE_DEPS_FROM=VENV .ci/smoke_wheel.sh (takes
# them from VENV: .ci/run).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir "$WORK/src"
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | tar -c --null -T - -f -) | tar -x -C "$WORK/src"
else
  cp -r "$ROOT/." "$WORK/src"
fi
python3 -m pip wheel -q --no-deps -w "$WORK/dist" "$WORK/src"
python3 -m venv --without-pip "$WORK/venv"  # pip runs from outside (--python): no setuptools shadows
PY="$WORK/venv/bin/python"
pip_in() { python3 -m pip --python "$PY" "$@"; }
if [ -n "${SMOKE_DEPS_FROM:-}" ]; then
  # CI: the dependencies (torch and ONNX Runtime are large) come from the environment .ci/run just
  # installed from the same pins, as a plain path entry (its .pth files, the editable onnxplan's
  # among them, are not run); the wheel goes in without them, and pip check proves they satisfy its requirements.
  SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  "$SMOKE_DEPS_FROM/bin/python" -c 'import sys; print("\n".join(p for p in sys.path if p.endswith("-packages")))' \
    > "$SITE/deps.pth"
  pip_in install -q --no-deps "$WORK"/dist/onnxplan-*.whl
  # the wheel's own requirements are met (other packages' complaints are not this test's)
  if pip_in check 2>&1 | grep '^onnxplan '; then exit 1; fi
else
  pip_in install -q -c "$ROOT/constraints.txt" "$WORK"/dist/onnxplan-*.whl
fi
cd "$WORK"
rm -rf "$WORK/src"  # nothing left to import from but the installed wheel
export ONNXPLAN_CACHE="$WORK/cache"
"$PY" - <<'PY'
import sys
import onnxplan, onnxplan.cli.app, onnxplan.executor.runner, onnxplan.models  # the wheel's, not the checkout's
for m in (onnxplan, onnxplan.cli.app, onnxplan.models):
    assert m.__file__.startswith(sys.prefix), m.__file__
PY
op() { echo "+ onnxplan $*"; "$WORK/venv/bin/onnxplan" "$@"; }
op --version
op models list
op models build mlp --batch 4 -o art
op inspect art
op plan art -o plan.json
op run art --steps 1 --warmup 0 --verify
op run art --plan plan.json --steps 1 --warmup 0 --no-measure
op explain plan.json
op bench art --strategies auto --no-measure -o results.json
op report results.json -o report.html --markdown report.md
op check results.json --baseline results.json
test -s report.html && test -s report.md
echo "wheel smoke test: every command ran from the installed wheel"
