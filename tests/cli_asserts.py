"""Assertions shared by the CLI tests: a refusal is one line on stderr with its exit code."""

from __future__ import annotations


def assert_one_line_error(result, code: int, needle: str = "") -> None:
    """`result` (typer's CliRunner) exited `code` with one `onnxplan: error: ...` line on stderr
    containing `needle`, and no traceback anywhere."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("onnxplan: error: "), err
    assert needle in err, err
    assert "Traceback" not in result.stdout + result.stderr
