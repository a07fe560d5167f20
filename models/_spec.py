"""A zoo entry (ModelSpec); the types it builds live in the library (onnxplan.forward.spec)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from onnxplan.forward.spec import ForwardModel

__all__ = ["ModelSpec"]


@dataclass(frozen=True)
class ModelSpec:
    """A zoo entry: name, one-line description, defaults and the builder."""

    name: str
    description: str
    default_batch: int
    default_loss: str
    default_optimizer: str
    builder: Callable[..., ForwardModel]
