"""Typed JSON files and records: dataclasses read and written through pydantic v2.

The plan file, the bench results file, the gate's baseline and config, and `run --json` are
frozen dataclasses whose fields carry their documentation (`doc`, a pydantic Field
description). pydantic validates a loaded document against them (`validated`: one line naming
the field path of the first error) and writes them back (`dumped`); the files' SCHEMA pages are
generated from the same descriptions (onnxplan.schema_doc)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import Field, TypeAdapter, ValidationError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["adapter", "doc", "dumped", "error_line", "optional", "record_of", "typed_items", "validated"]

T = TypeVar("T")
D = TypeVar("D", bound="DataclassInstance")


def doc(text: str, **kw: Any) -> Any:
    """A field's description (shown in its generated SCHEMA page), with pydantic Field options."""
    return Field(description=text, **kw)


def optional(text: str) -> Any:
    """A field written only when it holds a value (absent from the JSON when None)."""
    return Field(description=f"{text} (absent when null)", exclude_if=lambda v: v is None)


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def adapter(cls: Any) -> TypeAdapter[Any]:
    """The (cached) pydantic adapter of a record type."""
    made = _ADAPTERS.get(cls)
    if made is None:
        made = _ADAPTERS[cls] = TypeAdapter(cls)
    return made


def error_line(exc: ValidationError) -> str:
    """The first error of `exc` as 'path.to[2].field: message' (and how many more)."""
    err = exc.errors()[0]
    loc, msg = err["loc"], err["msg"][:1].lower() + err["msg"][1:]
    if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):  # the key is the error, not a place
        loc, msg = loc[:-1], f"unknown key {loc[-1]!r}"
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    more = exc.error_count() - 1
    return (f"{path}: {msg}" if path else msg) + (f" (and {more} more error{'s' * (more > 1)})" if more else "")


def validated(cls: type[T], data: Any, error: type[Exception], prefix: str = "") -> T:
    """`data` (parsed JSON) as a `cls`, or `error` with one line: `prefix` and the field path."""
    try:
        return adapter(cls).validate_python(data)
    except ValidationError as exc:
        raise error(f"{prefix}{error_line(exc)}") from None


def dumped(obj: Any) -> Any:
    """A record as JSON-ready Python (fields by their JSON names; floats kept as they are, so
    json.dumps writes them exactly as before, Infinity and NaN included)."""
    return adapter(type(obj)).dump_python(obj, by_alias=True)


def typed_items(cls: type[T], items: Any) -> tuple[T, ...]:
    """A record's list of `cls` items from what its producer gave: `cls` instances, or dicts
    with exactly its fields (a key it lacks is an error: add the field, do not drop data)."""
    return tuple(x if isinstance(x, cls) else adapter(cls).validate_python(x, strict=False, extra="forbid")
                 for x in items)


def record_of(cls: type[D], d: dict[str, Any]) -> D:
    """A record from a dict that was validated already (or made by this run): its fields only,
    the rest of the dict ignored, as on load."""
    return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})
