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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from onnxplan.errors import UsageError
from onnxplan.json_models import doc, validated
from onnxplan.sizes import parse_size

__all__ = ["GateConfig", "GateModel", "GateTable", "find_gate_config", "load_gate_config"]



Count = Annotated[int, Field(strict=True, gt=0)]  # a positive integer, not a bool or a string


def _one_model(item: Any) -> Any:
    return {"model": item} if isinstance(item, str) else item


@dataclass(frozen=True)
class GateModel:
    """One model of the gate, with its own settings."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    model: Annotated[StrictStr, doc("a zoo name or a path (relative to the file's folder)")]
    batch: Annotated[Count | None, doc("its batch")] = None
    optimizer: Annotated[StrictStr | None, doc("its optimizer")] = None
    loss: Annotated[StrictStr | None, doc("its loss")] = None
    dims: Annotated[dict[str, Count], doc("its dynamic dimensions")] = field(default_factory=dict)


@dataclass(frozen=True)
class GateTable:
    """The [tool.onnxplan] table (or an onnxplan.toml's top level) as written."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    baseline: Annotated[StrictStr, doc("the baseline results file, relative to the file's folder")]
    models: Annotated[list[Annotated[GateModel, BeforeValidator(_one_model)]] | None, doc(
        "\"all\" (null here) or a list: names, paths or {model, batch, optimizer, loss, dims}"),
        Field(min_length=1)] = None
    strategies: Annotated[StrictStr, doc("as bench --strategies")] = "ci"
    tolerance: Annotated[StrictStr | StrictInt | StrictFloat | None, doc("as check --tolerance")] = None
    metric: Annotated[StrictStr, doc("planned_peak, measured_peak or latency")] = "planned_peak"
    measure: Annotated[StrictBool, doc("run every plan")] = False
    budgets: Annotated[dict[str, StrictStr | StrictInt], doc("per model (\"*\": every model)")] = field(default_factory=dict)
    workers: Annotated[Count | None, doc("a Dask LocalCluster of this many workers")] = None
    scheduler: Annotated[StrictStr | None, doc("a Dask scheduler's address")] = None
    tool: Annotated[dict[str, Any] | None, doc("an onnxplan.toml's own [tool] tables (ignored)")] = None


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


def _model_path(name: str, folder: Path) -> str:
    """A zoo name as it is; a path relative to the file's folder, made absolute."""
    if "/" in name or name.endswith(".onnx") or name.startswith("."):
        return str((folder / name).resolve()) if not Path(name).is_absolute() else name
    return name


def load_gate_config(path: Path) -> GateConfig:
    table = _table(path)
    if table is None:
        raise UsageError(f"{path}: no [tool.onnxplan] table")
    where = f"{path}: [tool.onnxplan]" if path.name == "pyproject.toml" else str(path)
    if table.get("models", "all") == "all":
        table = {k: v for k, v in table.items() if k != "models"}
    gate = validated(GateTable, table, UsageError, f"{where}: ")
    folder = path.parent
    models: list[str] | None = None
    options: dict[str, dict[str, Any]] = {}
    if gate.models is not None:
        models = []
        for i, item in enumerate(gate.models):
            name = _model_path(item.model, folder)
            if name in models:
                raise UsageError(f"{where}: models[{i}]: {name!r} is listed twice")
            models.append(name)
            opts = {k: v for k, v in asdict(item).items() if k != "model" and v not in (None, {})}
            if opts:
                options[name] = opts
    budgets: dict[str, int] = {}
    for model, size in gate.budgets.items():
        try:
            budgets[model] = parse_size(str(size))
        except UsageError as e:
            raise UsageError(f"{where}: budgets.{model}: {e}") from None
    if gate.workers is not None and gate.scheduler is not None:
        raise UsageError(f"{where}: give workers or scheduler, not both")
    return GateConfig(
        source=path, models=models, model_options=options, baseline=folder / gate.baseline,
        strategies=gate.strategies, tolerance=None if gate.tolerance is None else str(gate.tolerance),
        metric=gate.metric, measure=gate.measure, budgets=budgets, workers=gate.workers, scheduler=gate.scheduler,
    )
