"""How the load stage finds models by name without importing the zoo.

The library never imports `onnxplan.models`: the zoo (or any other catalogue of models) hands
itself in as a ModelSource, through `register_source` (the CLI does it, and the zoo does it
when imported) or, for API users who never import the zoo, named in the settings
(ONNXPLAN_MODEL_SOURCES, MODULE:ATTR comma-separated; default the zoo's
"onnxplan.models.source:SOURCE"; empty: none), loaded on first use. A name no source knows is
a ModelError that lists the names the sources know.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from onnxplan.loading.request import LoadRequest

__all__ = ["ForwardExport", "ModelSource", "model_names", "register_source", "sources"]

@dataclass(frozen=True)
class ForwardExport:
    """A named model exported to a forward .onnx file, trained like a user's file."""

    path: Path
    default_loss: str


class ModelSource(Protocol):
    """A catalogue of models known by name (the zoo, the exported HF corpus)."""

    def names(self) -> list[str]:
        """The names this source builds (for the message on an unknown name, and `--all`)."""

    def knows(self, name: str) -> bool:
        """Whether `name` is one of this source's (its names, or a family such as hf-ARCH)."""

    def forward_file(self, request: LoadRequest) -> ForwardExport | None:
        """The forward .onnx a name stands for (exported on first use), or None."""

    def artifacts(self, request: LoadRequest) -> Path | None:
        """The artifact folder a name stands for (built into the cache on first use), or None."""


_REGISTERED: list[ModelSource] = []
_loaded: set[str] = set()  # the settings' MODULE:ATTR specs already loaded


def register_source(source: ModelSource) -> None:
    """Make `source`'s names loadable (idempotent: a source registered twice counts once)."""
    if all(s is not source for s in _REGISTERED):
        _REGISTERED.append(source)


def sources() -> list[ModelSource]:
    """The registered sources, after those the settings name (loaded once each)."""
    import importlib

    from onnxplan.errors import UsageError
    from onnxplan.settings import ENV, current

    for spec in (s.strip() for s in current().model_sources.split(",")):
        if not spec or spec in _loaded:
            continue
        _loaded.add(spec)
        module, _, attr = spec.partition(":")
        try:
            register_source(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError, ValueError) as exc:
            raise UsageError(f"invalid {ENV['model_sources']} entry {spec!r}: {type(exc).__name__}: {exc}") from None
    return list(_REGISTERED)


def model_names(models: list[str] | None, all_models: bool) -> list[str]:
    """The models a sweep names (bench MODELS or --all, the gate's list), checked before any
    work: each a file or folder, or a name a source knows (a typo in the last model should not
    cost the sweep). UsageError (exit 2) otherwise; duplicates dropped, order kept."""
    from onnxplan.errors import UsageError

    known = [n for s in sources() for n in s.names()]
    if all_models and models:
        raise UsageError("give MODELS or --all, not both")
    if all_models:
        return known
    if not models:
        raise UsageError("no model given: name zoo models (onnxplan models list) or use --all")
    for name in models:
        if not any(s.knows(name) for s in sources()) and not Path(name).exists():
            raise UsageError(f"'{name}' is neither a file, an artifact folder nor a zoo model "
                             f"(zoo: {', '.join(known)})")
    return list(dict.fromkeys(models))
