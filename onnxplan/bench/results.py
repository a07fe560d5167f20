"""The bench results file: documented JSON (rows, plans, peers), loading, validation, CSV."""

from __future__ import annotations

import csv
import io
import json
import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from onnxplan.bench.result_models import BenchRow, ResultsFile, row_fields
from onnxplan.errors import ModelError
from onnxplan.json_models import validated

__all__ = [
    "BUFFER_COLUMNS",
    "RESULTS_KIND",
    "RESULTS_SCHEMA_VERSION",
    "ROW_FIELDS",
    "dumps_results",
    "load_results",
    "machine_info",
    "merge_results",
    "new_results",
    "peer_key",
    "plan_key",
    "row_key",
    "rows_to_csv",
    "validate_results",
]

RESULTS_SCHEMA_VERSION = 1
RESULTS_KIND = "onnxplan-bench"
BUFFER_COLUMNS = ("name", "bytes", "class", "first_eo", "last_eo", "offset")

# Every row carries these keys (null where not measured); documented in onnxplan/bench/SCHEMA.md.
ROW_FIELDS = row_fields()


def machine_info() -> dict[str, Any]:
    """Where a run came from: OS, CPU, cores, memory, Python and the libraries that matter."""
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    memory = None
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "loadavg": load, "hostname": platform.node(), "system": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(), "cpu": cpu, "cpus": os.cpu_count(), "memory_bytes": memory,
        "python": platform.python_version(), "onnxplan": ver("onnxplan"),
        "onnxruntime": ver("onnxruntime-training-cpu"), "torch": ver("torch"), "numpy": ver("numpy"),
    }


def new_results(config: dict[str, Any]) -> dict[str, Any]:
    """An empty results document for a run with `config`."""
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "kind": RESULTS_KIND,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "config": config,
        "buffer_columns": list(BUFFER_COLUMNS),
        "rows": [],
        "plans": {},
        "peers": {},
        "runs": [],
    }


def row_key(row: dict[str, Any] | BenchRow) -> tuple[str, int | None, str]:
    """What identifies a row across runs: (model, batch, strategy)."""
    r = row if isinstance(row, BenchRow) else BenchRow.of(row)
    return (r.model, r.batch, r.strategy)


def plan_key(model: str, batch: int | None, strategy: str) -> str:
    """The key of a row's plan in the `plans` section: 'model|batch|strategy'."""
    return f"{model}|{batch}|{strategy}"


def peer_key(model: str, batch: int | None) -> str:
    """The key of a model's peer figures in the `peers` section: 'model|batch'."""
    return f"{model}|{batch}"


# A plan holds at least one parameter, a step takes time: 0 is as impossible there as a negative.
_POSITIVE = ("planned_peak_bytes", "median_step_seconds")
_CHECKED = ("planned_peak_bytes", "lower_bound_bytes", "measured_peak_bytes", "median_step_seconds")


def validate_results(doc: Any, source: str) -> dict[str, Any]:
    """Check a results document against ResultsFile (ModelError, exit 2, naming the field path)
    and its figures for values no plan or run can have; the document with its optional sections
    filled in."""
    if not isinstance(doc, dict):
        raise ModelError(f"{source}: not an onnxplan bench results file (top level is not an object)")
    version = doc.get("schema_version")
    if version != RESULTS_SCHEMA_VERSION:
        raise ModelError(f"{source}: schema_version {version!r}, expected {RESULTS_SCHEMA_VERSION}")
    typed = validated(ResultsFile, doc, ModelError, f"{source}: ")
    for i, row in enumerate(typed.rows):
        for k in _CHECKED:
            v = getattr(row, k)
            if v is not None and not ((v > 0 if k in _POSITIVE else v >= 0) and v < float("inf")):
                raise ModelError(f"{source}: rows[{i}] ({row.model}, {row.strategy}) has {k} {doc['rows'][i][k]!r}: "
                                 f"not a possible value ({'positive' if k in _POSITIVE else 'non-negative'} and "
                                 "finite); is the file corrupt or edited?")
    for section, empty in (("plans", {}), ("peers", {}), ("runs", []), ("config", {}), ("machine", {}),
                           ("buffer_columns", list(BUFFER_COLUMNS))):
        doc.setdefault(section, empty)
    return doc


def load_results(path: str | Path) -> dict[str, Any]:
    """Read and validate a results file; ModelError (exit 2) if missing, not JSON or malformed."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ModelError(f"{path}: no such results file") from None
    except IsADirectoryError:
        raise ModelError(f"{path}: is a folder, not a results file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: unreadable ({exc})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path}: not JSON ({exc})") from None
    return validate_results(doc, str(path))


def merge_results(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several results documents as one: rows, plans and peers; a later file's row wins."""
    if not docs:
        raise ValueError("no results to merge")
    merged = dict(docs[-1])
    rows: dict[tuple, dict] = {}
    plans: dict[str, Any] = {}
    peers: dict[str, Any] = {}
    for doc in docs:
        for row in doc["rows"]:
            rows[row_key(row)] = row
        plans.update(doc.get("plans", {}))
        for key, figures in doc.get("peers", {}).items():
            peers.setdefault(key, {}).update(figures)
    merged.update(rows=list(rows.values()), plans=plans, peers=peers)
    return merged


def dumps_results(doc: dict[str, Any]) -> str:
    """The document as JSON text: rows one per line, plan buffers one per line (diffable)."""
    doc = dict(doc)
    rows, plans = doc.pop("rows"), doc.pop("plans")
    head = json.dumps(doc, indent=1)[:-2]  # without the closing "\n}"
    parts = [head + ',\n "rows": [']
    parts.append(",\n".join("  " + json.dumps(r) for r in rows))
    parts.append('\n ],\n "plans": {')
    plan_texts = []
    for key, plan in plans.items():
        p = dict(plan)
        bufs = p.pop("buffers", [])
        body = json.dumps(p)[:-1] + ', "buffers": [\n' + ",\n".join("   " + json.dumps(b) for b in bufs)
        plan_texts.append(f"  {json.dumps(key)}: {body}\n  ]}}")
    parts.append(",\n".join(plan_texts))
    parts.append("\n }\n}\n")
    text = "".join(parts)
    json.loads(text)  # never write a file we could not read back
    return text


def rows_to_csv(rows: list[dict[str, Any]]) -> str:
    """The flat table: ROW_FIELDS first, then any other keys rows carry, one row per line."""
    extra = sorted({k for r in rows for k in r} - set(ROW_FIELDS))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*ROW_FIELDS, *extra], lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in writer.fieldnames})
    return out.getvalue()
