"""The fused library's C source compiles wherever a C compiler is found: a source that does not
would send every kernel to its numpy path without a word (kernels/native.py falls back), and
tests/test_kernels_native.py would skip rather than fail."""

from __future__ import annotations

import subprocess

import pytest

from onnxplan.kernels import native


def test_the_fused_source_compiles_with_the_machines_compiler(tmp_path):
    cc = native._compiler()
    if cc is None:
        pytest.skip("no C compiler: the numpy paths only")
    src, out = tmp_path / "fused.c", tmp_path / "fused.so"
    src.write_text(native.SOURCE)
    done = subprocess.run([cc, *native._FLAGS, "-o", str(out), str(src)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert native.adamw() is not None and native.gemm_calls() is not None
