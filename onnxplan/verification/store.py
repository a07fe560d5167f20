"""Tensors a verified step needs later, kept on disk instead of in memory: the state before the
step (read back for ONNX Runtime's optimizer, a group at a time, and to explain a failure) and
ONNX Runtime's gradients and loss inputs (read back one tensor at a time, where they are
compared). A verification then holds beside the run's arena what one of ONNX Runtime's steps
needs while it runs, and a tensor or a group of tensors between (README "what verification
costs")."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from onnxplan.errors import OnnxplanError

__all__ = ["StoredTensors", "TensorStore", "TensorStoreError"]


class TensorStoreError(OnnxplanError):
    """A tensor cannot be written to the store's folder (no room, a quota, an I/O error). Exit 2:
    the folder is unusable; free space or pick another with --swap-dir."""


class TensorStore:
    """A scratch folder of .npy files, one per tensor, under `folder` (a new temporary folder
    in it; the system's temporary folder when None). `put` writes an array as it is (a view of
    an arena is written from the arena, without a copy); `get` reads a fresh copy. A tensor's
    file is named by its name alone, so another process opens the same store by its folder
    (`TensorStore.attach`: ONNX Runtime's side of a verified step writes its outputs there)."""

    def __init__(self, folder: str | Path | None = None, prefix: str = "onnxplan-verify-", *,
                 root: str | Path | None = None) -> None:
        self.owned = root is None  # a folder this object made (and removes on close)
        self.root = Path(tempfile.mkdtemp(prefix=prefix, dir=folder)) if root is None else Path(root)
        self.reads = 0  # how many tensors `get` has read (tests: what was read, not how much memory)

    @classmethod
    def attach(cls, root: str | Path) -> TensorStore:
        """The store in the existing folder `root` (made by another TensorStore)."""
        return cls(root=root)

    def path(self, name: str) -> Path:
        return self.root / (hashlib.sha1(name.encode()).hexdigest() + ".npy")

    def put(self, name: str, array: np.ndarray) -> None:
        path = self.path(name)
        try:
            np.save(path, np.asarray(array), allow_pickle=False)
        except OSError as exc:  # numpy's short write carries no errno: say what the folder has left
            path.unlink(missing_ok=True)
            free = shutil.disk_usage(self.root).free
            raise TensorStoreError(f"--swap-dir {self.root.parent}: cannot store the tensors verification keeps "
                                   f"on disk ({array.nbytes} B of {name!r}; {free} B free: {exc}); free space or "
                                   "give another folder with --swap-dir") from None

    def get(self, name: str) -> np.ndarray:
        """A copy of the tensor stored as `name` (KeyError when none is)."""
        self.reads += 1
        try:
            return np.load(self.path(name), allow_pickle=False)
        except FileNotFoundError:
            raise KeyError(name) from None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.path(name).is_file()

    def clear(self) -> None:
        for path in self.root.glob("*.npy"):
            path.unlink(missing_ok=True)

    def close(self) -> None:
        if self.owned:
            shutil.rmtree(self.root, ignore_errors=True)


class StoredTensors(Mapping[str, np.ndarray]):
    """A read-only mapping over the tensors of a store stored as `prefix + name`, each read
    when it is looked up: a whole state passed where a dict is read key by key (load_state,
    ONNX Runtime's optimizer) without all of it in memory at once."""

    def __init__(self, store: TensorStore, names: list[str], prefix: str = "") -> None:
        self.store, self.prefix = store, prefix
        self._names = [n for n in names if prefix + n in store]

    def __getitem__(self, name: str) -> np.ndarray:
        if self.prefix + name not in self.store:
            raise KeyError(name)
        return self.store.get(self.prefix + name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.prefix + name in self.store

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
