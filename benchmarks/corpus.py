"""The corpus table of issue 11: every Hugging Face architecture x exporter, as exported.

Usage: python benchmarks/corpus.py [NAME ...] [--optimizers adamw,sgd] [--steps 3]
           [-o reports/corpus.json] [--markdown reports/corpus.md] [--fresh]

For each hf-ARCH[-dynamo] (`onnxplan models list`) and optimizer: forward nodes and op types,
trained/frozen parameter counts (`inspect`), the planned peak, the measured peak and median step of
our executor (`run`) and of ONNX Runtime's training API (each in a fresh probe process, peak RSS
increase: onnxplan.memprobe, as `onnxplan bench` measures its peers), then `run --verify` (verified,
worst per-tensor relative error) as a second run, so a verification failure keeps the figures.
A model that fails gets its one-line error in `status` and the table goes on. Prints the markdown
table; writes the JSON rows (after every row: an interrupted run resumes where it stopped, unless
--fresh) and the markdown report.
Needs `transformers`. Runs the CLI in-process (typer's CliRunner), so figures are the CLI's.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import date
from pathlib import Path

from typer.testing import CliRunner

from onnxplan.cli.app import app
from onnxplan.models import hf
from onnxplan.sizes import format_bytes

runner = CliRunner()
COLUMNS = ("model", "exporter", "optimizer", "nodes", "op_types", "trained", "frozen", "planned_peak",
           "ours_peak", "ort_peak", "planned/ort", "ours_ms", "ort_ms", "verified", "worst_error", "status")


def _cli(*args) -> dict:
    """One CLI call's JSON, or {'error': its one-line message}."""
    result = runner.invoke(app, [str(a) for a in args])
    if result.exit_code != 0:
        lines = (result.stderr or result.stdout or "").strip().splitlines() or [f"exit {result.exit_code}"]
        return {"error": lines[-1].removeprefix("onnxplan: error: ")[:300], "exit_code": result.exit_code}
    return json.loads(result.stdout)


def _forward_stats(name: str) -> dict:
    import onnx

    model = onnx.load(str(hf.export_forward(name)))
    op_types = {(n.domain, n.op_type) for n in model.graph.node}
    return {"nodes": len(model.graph.node), "op_types": len(op_types)}


def corpus_row(name: str, optimizer: str, steps: int) -> dict:
    """Every figure of one corpus model with one optimizer (never raises for a failing model)."""
    from onnxplan.bench.peers import measure_peer
    from onnxplan.loading.request import LoadRequest
    from onnxplan.loading.resolve import resolve_artifacts

    spec, exporter = hf.require_spec(name)
    row: dict = {"model": name, "arch": spec.arch, "exporter": exporter, "optimizer": optimizer,
                 "status": "ok"}
    t0 = time.perf_counter()
    try:
        row.update(_forward_stats(name))
    except Exception as exc:  # noqa: BLE001 - an export failure is a row of the table
        row["status"] = f"export: {str(exc).splitlines()[0][:300]}"
        return row
    info = _cli("inspect", name, "--optimizer", optimizer, "--json")
    if "error" in info:
        row["status"] = f"inspect: {info['error']}"
        return row
    params = info.get("parameters", {})
    row.update(step_nodes=info["nodes"], trained=len(params.get("trained", [])),
               frozen=len(params.get("frozen", [])), unshaped=len(info["unshaped_values"]))
    run = _cli("run", name, "--optimizer", optimizer, "--steps", steps, "--json")
    if "error" in run:
        row["status"] = f"run: {run['error']}"
        return row
    row.update(planned_peak=run["peak_bytes"], ours_peak=run["measured_peak_bytes"],
               ours_ms=run["median_step_seconds"] * 1e3, loss=run["loss"])
    verified = _cli("run", name, "--optimizer", optimizer, "--steps", steps, "--verify", "--no-measure",
                    "--json")
    if "error" in verified:
        row["status"] = f"run --verify: {verified['error']}"
    else:
        row.update(verified=verified["verified"], worst_error=verified["max_rel_diff"])
        if verified["verified"] is False:
            row["status"] = f"verify: {verified['worst'][0] if verified['worst'] else 'differs'}"[:300]
    folder = resolve_artifacts(LoadRequest(name, optimizer=optimizer))
    ort = measure_peer("ort", folder, repeat=steps, warmup=1)
    row.update(ort_peak=ort["peak_bytes"],
               ort_ms=ort["median_step_seconds"] * 1e3 if ort["median_step_seconds"] else None)
    if ort["error"] and row["status"] == "ok":
        row["status"] = f"ort: {ort['error']}"
    if row.get("ort_peak"):
        row["planned/ort"] = row["planned_peak"] / row["ort_peak"]
    row["wall_seconds"] = round(time.perf_counter() - t0, 1)
    return row


def _cell(key: str, value) -> str:
    if value is None:
        return "-"
    if key in ("planned_peak", "ours_peak", "ort_peak"):
        return format_bytes(value)
    if key in ("ours_ms", "ort_ms"):
        return f"{value:.1f}"
    if key == "planned/ort":
        return f"{value:.2f}"
    if key == "worst_error":
        return f"{value:.1e}"
    if key == "verified":
        return "yes" if value else "NO"
    if key == "status":
        return str(value).replace("|", "/")
    return str(value)


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = (_cell(k, r.get(k if k != "model" else "arch")) for k in COLUMNS)
        lines.append("| " + " | ".join(cells) + " |")
    passed = sum(r["status"] == "ok" for r in rows)
    return ("\n".join(lines) + f"\n\n{passed} of {len(rows)} rows pass inspect, plan, run --verify "
            "and the ORT probe.\n")


def _write_atomic(path: Path, text: str) -> None:
    from onnxplan.cli.common import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help="hf-ARCH[-dynamo] names (default: the whole corpus)")
    ap.add_argument("--optimizers", default="adamw,sgd")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("-o", "--out", type=Path, default=Path("reports/corpus.json"))
    ap.add_argument("--markdown", type=Path, default=Path("reports/corpus.md"))
    ap.add_argument("--fresh", action="store_true", help="ignore the rows already in --out")
    args = ap.parse_args()
    if not hf.available():
        sys.exit("benchmarks/corpus.py needs transformers: pip install transformers")
    names = args.models or [hf.zoo_name(s.arch, e) for s in hf.hf_specs() for e in hf.EXPORTERS]
    for name in names:
        hf.require_spec(name)
    import onnxruntime
    import torch
    import transformers

    env = (f"{date.today()}, {platform.machine()} {platform.system()}, Python {platform.python_version()}, "
           f"torch {torch.__version__}, transformers {transformers.__version__}, "
           f"onnxruntime {onnxruntime.__version__}")
    done = {}
    if args.out.is_file() and not args.fresh:  # resume: rows already measured are kept
        done = {(r["model"], r["optimizer"]): r for r in json.loads(args.out.read_text())["rows"]}
    rows = []
    for name in names:
        for optimizer in [o for o in args.optimizers.split(",") if o]:
            row = done.get((name, optimizer)) or corpus_row(name, optimizer, args.steps)
            rows.append(row)
            print(f"{name} {optimizer}: {row['status']}", file=sys.stderr, flush=True)
            _write_atomic(args.out, json.dumps({"environment": env, "steps": args.steps, "rows": rows},
                                               indent=1) + "\n")
    table = markdown(rows)
    print(table)
    _write_atomic(args.markdown, (
        "# Corpus: real architectures as exported (issue 11)\n\n"
        f"`python benchmarks/corpus.py` ({env}). Batch 2, tiny configs (models/hf.py); "
        "`torchscript` = `torch.onnx.export(dynamo=False, opset_version=17, training=TRAINING)`, "
        "`dynamo` = the default exporter. Peaks: planned = persistent + arena; ours/ORT = peak RSS "
        f"increase of a fresh probe process; ms = median step of {args.steps}; worst_error = the largest "
        "per-tensor relative error of `run --verify` (loss, gradients, running statistics).\n\n" + table))


if __name__ == "__main__":
    main()
