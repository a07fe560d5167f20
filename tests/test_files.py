"""onnxplan.files: a file is written whole or not at all."""

from __future__ import annotations

import os

import pytest

from onnxplan.files import atomic_path, write_atomic


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "out.json"
    write_atomic(path, "old\n")
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("interrupted")
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["out.json"]
    write_atomic(path, b"new")
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["out.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # the usual mode, not mkstemp's 0600


def test_an_unwritable_folder_is_an_os_error(tmp_path):
    with pytest.raises(OSError):
        write_atomic(tmp_path / "missing" / "out.json", "x")
