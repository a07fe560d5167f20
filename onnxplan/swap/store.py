"""The swap store: slots of bytes in one unlinked file, moved with pwrite / preadv (O_DIRECT
through one bounce block where the file system allows it, else flushed and dropped from the
page cache). The executor's swap runtime (onnxplan.executor.swap_io) moves the planned swaps
through it; the swap pricing (onnxplan.swap.pricing) measures its bandwidth. See
onnxplan.executor.swap_io for how the bytes move and why."""

from __future__ import annotations

import errno
import mmap
import os
import tempfile
import weakref
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from onnxplan.errors import ModelError, OnnxplanError, UsageError

__all__ = ["DIRECT_CHUNK", "SwapIOError", "SwapStore", "check_swap_dir", "default_parent", "fs_type"]

PAGE = 4096
DIRECT_CHUNK = 512 << 10  # O_DIRECT transfers go through a bounce block this large (its RSS)
SETTLE_CHUNK = 1 << 20  # an idle worker settles this much at a time, then looks for work
_SYNC_RANGE = 1 | 2 | 4  # SYNC_FILE_RANGE_WAIT_BEFORE | WRITE | WAIT_AFTER


def _sync_file_range():
    """libc's sync_file_range (Linux), or None."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def fs_type(path: str | Path) -> str:
    """The file-system type holding `path` (from /proc/mounts; "" when unknown)."""
    path = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                inside = len(parts) > 2 and (path == parts[1] or path.startswith(parts[1].rstrip("/") + "/"))
                if inside and len(parts[1]) >= len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def _open_direct(path: str) -> int | None:
    """`path` opened again with O_DIRECT (bypassing the page cache), or None where the
    platform or the file system has no such flag (tmpfs refuses it)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_RDWR | flag)
    except OSError:
        return None


def default_parent() -> str:
    """The temporary folder, unless it lives in RAM (tmpfs): then /var/tmp when that does not."""
    tmp = tempfile.gettempdir()
    if fs_type(tmp) in ("tmpfs", "ramfs") and os.path.isdir("/var/tmp") and \
            fs_type("/var/tmp") not in ("tmpfs", "ramfs"):
        return "/var/tmp"
    return tmp


def check_swap_dir(folder: str | Path | None) -> str | None:
    """A --swap-dir as a string (None: not given), or UsageError (exit 2) if it is no folder."""
    if folder is None:
        return None
    if not Path(folder).is_dir():
        raise UsageError(f"--swap-dir {folder}: no such folder")
    return str(folder)


class SwapIOError(OnnxplanError):
    """The swap file cannot be written or read: no room on --swap-dir (ENOSPC, a quota) or an
    I/O error. Exit 2: the folder is unusable; pick another with --swap-dir."""


def _io_error(exc: OSError, folder: str, what: str) -> SwapIOError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return SwapIOError(f"--swap-dir {folder}: no room for the swap file ({what}: {os.strerror(exc.errno)}); "
                           "free space or give another folder with --swap-dir")
    return SwapIOError(f"--swap-dir {folder}: swap file I/O failed ({what}: {exc.strerror or exc})")


class SwapStore:
    """Slots of bytes in one unlinked file. `slots`: slot name -> bytes."""

    def __init__(self, slots: dict[str, int], folder: str | Path | None = None, *, drop_cache: bool = True) -> None:
        check_swap_dir(folder)
        own = folder is None
        where = Path(tempfile.mkdtemp(prefix="onnxplan-swap-", dir=default_parent())) if folder is None else Path(folder)
        try:
            fd, path = tempfile.mkstemp(prefix="onnxplan-swap-", suffix=".bin", dir=where)
        except OSError as exc:
            raise UsageError(f"--swap-dir {where}: cannot create the swap file ({exc.strerror})") from None
        dfd = _open_direct(path) if drop_cache else None
        os.unlink(path)  # the file lives as long as fd is open, and not a moment longer
        if own:
            os.rmdir(where)
        self.fd = fd
        self.folder = str(where)
        self.fs = fs_type(where)
        self.drop_cache = drop_cache
        self.offsets: dict[str, int] = {}
        self.sizes = dict(slots)
        end = 0
        for name, nbytes in slots.items():
            self.offsets[name] = end
            end += -(-nbytes // PAGE) * PAGE
        self.nbytes = end
        try:
            os.posix_fallocate(fd, 0, max(end, 1))
        except OSError as exc:  # a file system without it: a sparse file, flushes then write metadata
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                os.close(fd)
                raise _io_error(exc, self.folder, f"reserving {end} bytes") from None
            os.ftruncate(fd, end)
        self.bounce: mmap.mmap | None = None  # O_DIRECT: an aligned block the bytes pass through, DIRECT_CHUNK at a time
        if dfd is not None:
            self.bounce = mmap.mmap(-1, DIRECT_CHUNK)
            try:  # the file system may accept the flag and refuse the I/O (EINVAL): then buffered
                os.pwrite(dfd, memoryview(self.bounce)[:PAGE], 0)
                os.close(fd)
                self.fd = fd = dfd
            except OSError:
                os.close(dfd)
                self.bounce = None
        if drop_cache and self.bounce is None:  # no readahead: it would pull the next slots into the page cache
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        self._sync = _sync_file_range()
        self.unsettled: list[tuple[int, int, bool]] = []  # ranges (offset, bytes, written) to settle
        self.cache_policy = ("sync_file_range + posix_fadvise(DONTNEED)" if self._sync else
                             "fdatasync + posix_fadvise(DONTNEED)") if drop_cache else "page cache kept"
        if self.bounce is not None:
            self.cache_policy = f"O_DIRECT (no page cache; {DIRECT_CHUNK >> 10} KiB bounce block)"
        self._closer = weakref.finalize(self, os.close, fd)

    @property
    def direct(self) -> bool:
        return self.bounce is not None

    def _bounce_block(self) -> mmap.mmap:
        if self.bounce is None:
            raise RuntimeError(f"swap file in {self.folder}: an O_DIRECT transfer without its bounce block")
        return self.bounce

    def _direct(self, write: bool, off: int, view: memoryview) -> None:
        """Move `view` to (write) or from the file at `off` through the bounce block."""
        bounce = memoryview(self._bounce_block())
        done = 0
        while done < len(view):
            k = min(DIRECT_CHUNK, len(view) - done)
            span = -(-k // PAGE) * PAGE  # whole blocks: slots are page-aligned and page-rounded
            if write:
                bounce[:k] = view[done:done + k]
                if os.pwrite(self.fd, bounce[:span], off + done) != span:
                    raise OSError(errno.EIO, "short direct write")
            else:
                if os.preadv(self.fd, [bounce[:span]], off + done) < k:
                    raise OSError(errno.EIO, "short direct read")
                view[done:done + k] = bounce[:k]
            done += k

    def _drop(self, off: int, nbytes: int, written: bool) -> None:
        if not self.drop_cache or self.direct:
            return
        nbytes = -(-nbytes // PAGE) * PAGE  # whole pages (a slot is page-rounded): DONTNEED skips a partial one
        if written and (self._sync is None or self._sync(self.fd, off, nbytes, _SYNC_RANGE) != 0):
            os.fdatasync(self.fd)
        os.posix_fadvise(self.fd, off, nbytes, os.POSIX_FADV_DONTNEED)

    def _at(self, slot: str, offset: int, nbytes: int) -> int:
        """The file offset of byte `offset` of `slot`, for a transfer of `nbytes` inside it (a
        range of a slot starts on a page, PIECE_ALIGN, onnxplan.passes.split; and is whole pages
        unless it ends the slot: O_DIRECT writes whole pages, a short range would overwrite the
        start of the next)."""
        end = offset + nbytes
        if offset < 0 or offset % PAGE or end > self.sizes[slot] or (nbytes % PAGE and end != self.sizes[slot]):
            raise ValueError(f"swap store: bytes {offset}..{offset + nbytes} are not a page-aligned range of "
                             f"slot {slot!r} ({self.sizes[slot]} B)")
        return self.offsets[slot] + offset

    def write(self, slot: str, data: np.ndarray, *, settle: bool = True, offset: int = 0) -> None:
        """Store `data` (1-D uint8, the slot's size; or a range of it at byte `offset`) in `slot`;
        its pages then leave RAM, at once or (settle False) at the next settle()."""
        off, view = self._at(slot, offset, data.nbytes), data.data
        done = 0
        try:
            if self.direct:
                self._direct(True, off, view)
                return
            while done < len(view):
                done += os.pwrite(self.fd, view[done:], off + done)
        except OSError as exc:
            raise _io_error(exc, self.folder, f"writing {slot!r}") from None
        if settle:
            self._drop(off, len(view), True)
        elif self.drop_cache:
            if self._sync is not None:
                self._sync(self.fd, off, len(view), 2)  # SYNC_FILE_RANGE_WRITE: start, no wait
            self.unsettled.append((off, len(view), True))

    def settle(self, until: Callable[[], bool] | None = None) -> None:
        """Wait for the write-back of every unsettled write, drop its pages and those of the
        unsettled reads (pages still in flight when a read returned); one range at a time,
        stopping early once `until()` is true (work is waiting)."""
        while self.unsettled and not (until is not None and until()):
            off, n, written = self.unsettled.pop(0)
            if until is not None and n > SETTLE_CHUNK:  # a long write-back wait would delay the next job
                self.unsettled.insert(0, (off + SETTLE_CHUNK, n - SETTLE_CHUNK, written))
                n = SETTLE_CHUNK
            self._drop(off, n, written)

    def write_zeros(self, slot: str) -> None:
        """Fill `slot` with zero bytes, a small block at a time (no slot-sized buffer)."""
        if self.direct:
            block = self._bounce_block()
            block[:] = bytes(DIRECT_CHUNK)
            view = memoryview(block)
            try:
                for done in range(0, self.sizes[slot], DIRECT_CHUNK):
                    os.pwrite(self.fd, view[:min(DIRECT_CHUNK, -(-(self.sizes[slot] - done) // PAGE) * PAGE)],
                              self.offsets[slot] + done)
            except OSError as exc:
                raise _io_error(exc, self.folder, f"writing {slot!r}") from None
            return
        zeros = np.zeros(min(self.sizes[slot], 1 << 16), np.uint8)
        done = 0
        while done < self.sizes[slot]:
            n = min(len(zeros), self.sizes[slot] - done)
            try:
                os.pwrite(self.fd, zeros.data[:n], self.offsets[slot] + done)
            except OSError as exc:
                raise _io_error(exc, self.folder, f"writing {slot!r}") from None
            done += n
        self._drop(self.offsets[slot], self.sizes[slot], True)

    def read(self, slot: str, out: np.ndarray, *, settle: bool = True, offset: int = 0) -> None:
        """Read `slot` (or the range of it at byte `offset`) into `out` (1-D uint8, the range's
        size), bypassing any copy; its pages are dropped at once and (settle False) once more at
        the next settle()."""
        off, view = self._at(slot, offset, out.nbytes), out.data
        if self.direct:
            self._direct(False, off, view)
            return
        done = 0
        while done < len(view):
            got = os.preadv(self.fd, [view[done:]], off + done)
            if got <= 0:
                raise OSError(f"swap store: short read of slot {slot!r}")
            done += got
        self._drop(off, len(view), False)
        if not settle and self.drop_cache:
            self.unsettled.append((off, len(view), False))

    def write_state(self, state: Mapping[str, tuple[str, Any]], params: Mapping[str, np.ndarray],
                    optimizer_state: Mapping[str, np.ndarray]) -> None:
        """Initial bytes of the state homed here (`state`: slot -> class, spec): parameters from
        `params` (each must be there), other state from `optimizer_state` or zero."""
        for slot, (vclass, spec) in state.items():
            source = params if vclass == "parameter" else optimizer_state
            if slot not in source:
                if vclass == "parameter":
                    raise ModelError(f"no initial value for parameter {slot!r}")
                self.write_zeros(slot)  # no slot-sized zero array: it would count in RSS
                continue
            data = np.ascontiguousarray(np.asarray(source[slot]).reshape(spec.shape), dtype=spec.dtype)
            self.write(slot, data.reshape(-1).view(np.uint8))

    def read_state(self, state: Mapping[str, tuple[str, Any]], vclass_wanted: str,
                   names: Collection[str] | None = None) -> dict[str, np.ndarray]:
        """The state homed here of class `vclass_wanted` (only those in `names` when given), read back."""
        out = {}
        for slot, (vclass, spec) in state.items():
            if vclass == vclass_wanted and (names is None or slot in names):
                data = np.empty(spec.shape, dtype=spec.dtype)
                self.read(slot, data.reshape(-1).view(np.uint8))
                out[slot] = data
        return out

    def close(self) -> None:
        self._closer()

    @property
    def closed(self) -> bool:
        return not self._closer.alive
