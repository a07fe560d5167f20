"""The host memory a run may take: MemAvailable, or the cgroup's room when that is smaller."""

from __future__ import annotations

from pathlib import Path

from onnxplan.errors import BudgetError
from onnxplan.sizes import format_bytes

__all__ = ["available_bytes", "require_memory"]

_MEMINFO = Path("/proc/meminfo")
_CGROUP = Path("/sys/fs/cgroup")


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _cgroup_room(root: Path = _CGROUP) -> int | None:
    """Bytes the cgroup limit leaves (limit - usage), v2 or v1; None without a limit."""
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        limit = _read_int(root / limit_file)
        if limit is not None and limit < 1 << 60:  # v1 writes a huge number for "no limit"
            return max(limit - (_read_int(root / usage_file) or 0), 0)
    return None


def available_bytes(meminfo: Path = _MEMINFO, cgroup: Path = _CGROUP) -> int | None:
    """MemAvailable from /proc/meminfo, or the cgroup's room when smaller; None if unknown."""
    avail = None
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    room = _cgroup_room(cgroup)
    known = [v for v in (avail, room) if v is not None]
    return min(known) if known else None


def require_memory(need: dict[str, int], what: str) -> None:
    """Raise BudgetError (exit 3) when the bytes in `need` (by part) exceed what is available,
    before anything is allocated. Unknown availability lets the run go on."""
    total = sum(need.values())
    avail = available_bytes()
    if avail is None or total <= avail:
        return
    parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in need.items() if v)
    raise BudgetError(f"{what} needs {format_bytes(total)} of memory ({parts}) but this machine has "
                      f"{format_bytes(avail)} available: use a smaller --batch, or plan with --budget")


# A full garbage collection walks every object the process holds: cheap in a command's process,
# most of the time of a long-lived one's verifications (a test session after thousands of tests:
# py-spy's samples of the slow tier sat in it); below this resident size there is little an old
# cycle could hold that matters: only the young generations are collected.
COLLECT_FROM_RSS = 1 << 30


def give_back_freed() -> None:
    """Return the memory this process freed to the system: collect garbage (every generation
    where the process is large, COLLECT_FROM_RSS; the young ones else), then glibc's malloc_trim
    (freed tensors under malloc's mmap threshold stay in its heaps otherwise, and the process's
    RSS with them). Nothing where there is no glibc."""
    import ctypes
    import gc

    from onnxplan.memprobe import read_memory_status

    try:
        large = read_memory_status().get("VmRSS", 0) >= COLLECT_FROM_RSS
    except OSError:  # no /proc: collect as on a large process
        large = True
    gc.collect(2 if large else 1)
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
