"""Parse and format byte sizes: B/KB/MB/GB (powers of 1000) and KiB/MiB/GiB (powers of 1024)."""

from __future__ import annotations

import re
from fractions import Fraction

from onnxplan.errors import UsageError

__all__ = ["MAX_BYTES", "parse_size", "format_bytes"]

# The most bytes any size may be: every byte count stays exact in a float64 (JSON, pandas) and far
# from int64 overflow in numpy and the ILP solver. 8 PiB is beyond any machine onnxplan plans for.
MAX_BYTES = 2**53

_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """'256MiB' -> 268435456; '1.5 GB' -> 1500000000. Malformed -> UsageError (exit 2)."""
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else None
    shown = str(text) if len(str(text)) <= 40 else f"{str(text)[:20]}...{str(text)[-10:]}"
    if not m or unit not in _UNITS:
        raise UsageError(
            f"invalid size '{shown}': expected a number with an optional unit "
            "B, KB, MB, GB, KiB, MiB or GiB (e.g. 256MiB, 1.5GB)"
        )
    size = round(Fraction(m.group(1)) * _UNITS[unit])  # exact: no float overflow or rounding
    if size > MAX_BYTES:
        raise UsageError(f"invalid size '{shown}': more than {format_bytes(MAX_BYTES)} (2**53 bytes)")
    return size


def format_bytes(n: int | float) -> str:
    """Human-readable binary size: 1536 -> '1.50 KiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
