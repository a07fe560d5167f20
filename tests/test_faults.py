"""Faults: `run` killed (SIGKILL) while its child measures leaves no process and no file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.zoo_small import small_artifacts


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")
def test_sigkill_during_measurement_leaves_no_child_and_no_file(tmp_path):
    folder = small_artifacts("mlp", "sgd")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    code = "from onnxplan.cli.app import main; main()"
    parent = subprocess.Popen([sys.executable, "-c", code, "run", str(folder), "--steps", "100", "--warmup", "0", "--measure"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        probe = []
        while not probe and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.2)
            probe = [c for c in _children(parent.pid)
                     if b"onnxplan.memprobe" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert probe, "the measuring child never started"
        time.sleep(1.0)  # inside the measurement
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(probe[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(probe[0]), "the measuring child outlived its parent"
        assert not list(tmp.iterdir()), list(tmp.iterdir())
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in probe if "probe" in locals() else ():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
