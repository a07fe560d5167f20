"""How the load stage finds models by name without importing the zoo.

The library never imports `onnxplan.models`: the zoo (or any other catalogue of models) hands
itself in as a ModelSource, through `register_source` (the CLI does it, and the zoo does it
when imported) or, for API users who never import the zoo, through the `onnxplan.sources`
entry point the package declares (pyproject.toml). A name no source knows is a ModelError that
lists the names the sources know.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from onnxplan.loading.request import LoadRequest

__all__ = ["ENTRY_POINT_GROUP", "ForwardExport", "ModelSource", "register_source", "sources"]

ENTRY_POINT_GROUP = "onnxplan.sources"


@dataclass(frozen=True)
class ForwardExport:
    """A named model exported to a forward .onnx file, trained like a user's file."""

    path: Path
    default_loss: str


class ModelSource(Protocol):
    """A catalogue of models known by name (the zoo, the exported HF corpus)."""

    def names(self) -> list[str]:
        """The names this source builds (for the message on an unknown name)."""

    def forward_file(self, request: LoadRequest) -> ForwardExport | None:
        """The forward .onnx a name stands for (exported on first use), or None."""

    def artifacts(self, request: LoadRequest) -> Path | None:
        """The artifact folder a name stands for (built into the cache on first use), or None."""


_REGISTERED: list[ModelSource] = []
_entry_points_read = False


def register_source(source: ModelSource) -> None:
    """Make `source`'s names loadable (idempotent: a source registered twice counts once)."""
    if all(s is not source for s in _REGISTERED):
        _REGISTERED.append(source)


def sources() -> list[ModelSource]:
    """The registered sources, after those the installed packages declare as entry points."""
    global _entry_points_read
    if not _entry_points_read:
        _entry_points_read = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            register_source(ep.load())
    return list(_REGISTERED)
