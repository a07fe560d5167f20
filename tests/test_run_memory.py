"""`run` compares what it will allocate with the memory available before allocating it."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from onnxplan import hostmem
from onnxplan.cli.app import app
from onnxplan.forward.spec import InputSpec

runner = CliRunner()


def test_available_bytes_reads_meminfo_and_the_smaller_cgroup_room(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 8000000 kB\nMemAvailable:    4000000 kB\n")
    cg = tmp_path / "cg"
    cg.mkdir()
    assert hostmem.available_bytes(meminfo, cg) == 4000000 * 1024
    (cg / "memory.max").write_text("max\n")
    assert hostmem.available_bytes(meminfo, cg) == 4000000 * 1024
    (cg / "memory.max").write_text(f"{3 << 30}\n")
    (cg / "memory.current").write_text(f"{1 << 30}\n")
    assert hostmem.available_bytes(meminfo, cg) == 2 << 30
    assert hostmem.available_bytes(tmp_path / "none", tmp_path / "none") is None


def test_run_refuses_what_does_not_fit_before_allocating(monkeypatch):
    monkeypatch.setattr(hostmem, "available_bytes", lambda: 1 << 20)
    r = runner.invoke(app, ["run", "mlp", "--batch", "4", "--steps", "1", "--warmup", "0"])
    assert r.exit_code == 3, (r.stdout, r.stderr)
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("onnxplan: error: running mlp needs "), err
    assert "arena" in err and "step data" in err and "1.00 MiB available" in err
    assert not r.stdout.strip()


def test_step_data_is_drawn_without_a_64_bit_copy_and_unchanged(monkeypatch):
    """Chunked draws give the numbers one draw of the whole shape gives."""
    from onnxplan.forward import spec as _spec

    monkeypatch.setattr(_spec, "_SAMPLE_CHUNK", 1000)
    for spec in (InputSpec("x", "float32", (37, 91), -1, 1), InputSpec("y", "int64", (5003,), 0, 10),
                 InputSpec("b", "bool", (2500,), 0, 2), InputSpec("s", "float16", (), 0, 1)):
        got = spec.sample(np.random.default_rng([1, 2, 3]))
        rng = np.random.default_rng([1, 2, 3])
        draw = rng.uniform(spec.low, spec.high, spec.shape) if spec.dtype.startswith("float") else (
            rng.integers(int(spec.low), int(spec.high), size=spec.shape))
        assert got.dtype == np.dtype(spec.dtype) and np.array_equal(got, draw.astype(spec.dtype))
        assert spec.nbytes == got.nbytes
