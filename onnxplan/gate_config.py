"""The memory gate's settings: `[tool.onnxplan]` in pyproject.toml, or an onnxplan.toml.

`onnxplan check` with no RESULTS reads them from the nearest folder (this one, then its
parents) holding an onnxplan.toml (its top level, or its own [tool.onnxplan]) or a
pyproject.toml with a [tool.onnxplan] table. onnxplan.toml wins when both are there.

    [tool.onnxplan]
    models = "all"                      # or a list: "mlp", "nets/m.onnx",
                                        #   {model = "gpt", batch = 8, optimizer = "sgd", loss = "ce",
                                        #    dims = {seq = 32}}
    strategies = "ci"                   # as bench --strategies
    baseline = "reports/baseline.json"  # relative to the file's folder
    tolerance = "1%"                    # as check --tolerance (default: the metric's own)
    metric = "planned_peak"             # planned_peak, measured_peak or latency
    measure = false                     # true: run every plan (measured_peak, latency)
    budgets = {mlp = "8MiB"}            # per model ("*": every model); no plan fits -> exit 3
    workers = 2                         # optional: a Dask LocalCluster (or scheduler = "tcp://...")

Every error is one line naming the file and the key (UsageError, exit 2).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxplan.errors import UsageError
from onnxplan.sizes import parse_size

__all__ = ["GateConfig", "find_gate_config", "load_gate_config"]

_KEYS = ("models", "strategies", "baseline", "tolerance", "metric", "measure", "budgets", "workers", "scheduler")
_MODEL_KEYS = {"model": str, "batch": int, "optimizer": str, "loss": str, "dims": dict}


@dataclass
class GateConfig:
    source: Path
    models: list[str] | None  # None: the whole zoo
    baseline: Path
    strategies: str = "ci"
    tolerance: str | None = None
    metric: str = "planned_peak"
    measure: bool = False
    budgets: dict[str, int] = field(default_factory=dict)
    model_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    workers: int | None = None
    scheduler: str | None = None


def _table(path: Path) -> dict[str, Any] | None:
    """The [tool.onnxplan] table of `path` (an onnxplan.toml may also hold it at top level)."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML ({e})") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read ({e.strerror})") from None
    table = doc.get("tool", {}).get("onnxplan")
    if table is None and path.name == "onnxplan.toml":
        table = doc
    return table


def find_gate_config(start: Path | None = None) -> Path:
    """The nearest onnxplan.toml, or pyproject.toml with [tool.onnxplan], from `start` upwards."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "onnxplan.toml").is_file():
            return folder / "onnxplan.toml"
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and _table(pyproject) is not None:
            return pyproject
    raise UsageError(f"no gate configured: no onnxplan.toml, nor a pyproject.toml with [tool.onnxplan], "
                     f"in {here} or above (README: Using onnxplan in CI); or give RESULTS --baseline FILE")


def _expect(where: str, value: Any, kind: type | tuple) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise UsageError(f"{where}: expected {names}, got {value!r}")
    return value


def _model(where: str, item: Any, folder: Path) -> tuple[str, dict[str, Any]]:
    if isinstance(item, str):
        item = {"model": item}
    _expect(where, item, (str, dict))
    unknown = sorted(set(item) - set(_MODEL_KEYS))
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(_MODEL_KEYS)})")
    if "model" not in item:
        raise UsageError(f"{where}: no 'model' (a zoo name or a path)")
    for key, kind in _MODEL_KEYS.items():
        if key in item:
            _expect(f"{where}.{key}", item[key], kind)
    if item.get("batch") is not None and item["batch"] <= 0:
        raise UsageError(f"{where}.batch: must be a positive integer, got {item['batch']}")
    for dim, size in item.get("dims", {}).items():
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise UsageError(f"{where}.dims.{dim}: must be a positive integer, got {size!r}")
    name = item["model"]
    if "/" in name or name.endswith(".onnx") or name.startswith("."):  # a path: relative to the file
        name = str((folder / name).resolve()) if not Path(name).is_absolute() else name
    return name, {k: v for k, v in item.items() if k != "model"}


def load_gate_config(path: Path) -> GateConfig:
    table = _table(path)
    if table is None:
        raise UsageError(f"{path}: no [tool.onnxplan] table")
    where = f"{path}: [tool.onnxplan]" if path.name == "pyproject.toml" else str(path)
    unknown = sorted(set(table) - set(_KEYS) - {"tool"})
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(_KEYS)})")
    if "baseline" not in table:
        raise UsageError(f"{where}: no 'baseline' (the baseline results file, e.g. reports/baseline.json)")
    folder = path.parent
    models_value = table.get("models", "all")
    models: list[str] | None = None
    options: dict[str, dict[str, Any]] = {}
    if models_value != "all":
        _expect(f"{where}.models", models_value, list)
        if not models_value:
            raise UsageError(f"{where}.models: empty (give \"all\" or a list)")
        models = []
        for i, item in enumerate(models_value):
            name, opts = _model(f"{where}.models[{i}]", item, folder)
            if name in models:
                raise UsageError(f"{where}.models[{i}]: {name!r} is listed twice")
            models.append(name)
            if opts:
                options[name] = opts
    budgets: dict[str, int] = {}
    for model, size in _expect(f"{where}.budgets", table.get("budgets", {}), dict).items():
        _expect(f"{where}.budgets.{model}", size, (str, int))
        try:
            budgets[model] = parse_size(str(size))
        except UsageError as e:
            raise UsageError(f"{where}.budgets.{model}: {e}") from None
    workers = table.get("workers")
    if workers is not None and (_expect(f"{where}.workers", workers, int) < 1):
        raise UsageError(f"{where}.workers: must be a positive integer, got {workers}")
    if workers is not None and table.get("scheduler") is not None:
        raise UsageError(f"{where}: give workers or scheduler, not both")
    tolerance = table.get("tolerance")
    return GateConfig(
        source=path, models=models, model_options=options,
        baseline=folder / _expect(f"{where}.baseline", table["baseline"], str),
        strategies=_expect(f"{where}.strategies", table.get("strategies", "ci"), str),
        tolerance=None if tolerance is None else str(_expect(f"{where}.tolerance", tolerance, (str, int, float))),
        metric=_expect(f"{where}.metric", table.get("metric", "planned_peak"), str),
        measure=_expect(f"{where}.measure", table.get("measure", False), bool),
        budgets=budgets, workers=workers,
        scheduler=table.get("scheduler") and _expect(f"{where}.scheduler", table["scheduler"], str),
    )
