"""Files written whole or not at all: a temporary sibling, renamed into place (one helper for
output files, the artifact cache's notes, the swap store's kept rates and HF exports)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "write_atomic"]


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """A temporary file beside `path` (created empty, the usual mode for new files) for the
    block to write; renamed onto `path` when the block ends, removed when it raises. OSError
    (an unwritable folder, a full disk) propagates."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a written file gets the usual mode
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write `data` (text or bytes) to `path` through atomic_path: no half-written file is left."""
    with atomic_path(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)
