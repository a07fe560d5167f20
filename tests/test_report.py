"""onnxplan report: one self-contained HTML file (plotly inlined, no network) and a short Markdown summary."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from onnxplan.bench.results import load_results
from onnxplan.cli.app import app
from onnxplan.report import markdown_summary, render_html

runner = CliRunner()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "results.json"
    res = runner.invoke(app, ["bench", "mlp", "nnt-conv2d", "--no-measure", "--budget", "mlp=4MiB",
                              "--strategies", "auto,nntrainer+sort,no-interleave", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def test_html_is_self_contained_with_every_chart(results, tmp_path):
    out = tmp_path / "report.html"
    md = tmp_path / "summary.md"
    res = runner.invoke(app, ["report", str(results), "-o", str(out), "--markdown", str(md)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert text.count("plotly.js v") >= 1 and text.count("<script type='text/javascript'>") == 1
    assert not re.search(r"<script[^>]+src=", text)  # nothing fetched at view time
    ours = text.split("</script>", 1)[1]  # the page after the inlined plotly.js
    assert not re.search(r"""(src|href)=["']https?:""", ours)
    for model in ("mlp", "nnt-conv2d"):
        for chart in ("layout", "live", "peak", "latency"):
            assert f'id="{model}-64-{chart}"' in text
    assert 'id="overview-peaks"' in text
    assert '"orientation":"h"' in text and '"hovertemplate":"\\u003cb\\u003e%{customdata[0]}' in text  # rectangles + hover
    assert "budget" in text and "lower bound" in text
    assert "nntrainer+sort" in text and "no-interleave" in text


def test_markdown_summary_is_short(results):
    text = markdown_summary([load_results(results)])
    lines = text.strip().splitlines()
    assert lines[0].startswith("### onnxplan bench — ")
    assert len(lines) < 30 and len(text) < 4000
    # the best strategy: the least planned peak (with --budget, bench plans through the budget
    # layer: nntrainer+sort, 4.5 MiB plain, swaps below mlp's 4 MiB budget)
    mlp = [r for r in load_results(results)["rows"] if r["model"] == "mlp"]
    best = min(mlp, key=lambda r: r["planned_peak_bytes"])["strategy"]
    assert any(line.startswith(f"| mlp | 64 | {best}") for line in lines)
    assert "not measured in this run" in text


def test_several_results_files_merge(results, tmp_path):
    other = tmp_path / "other.json"
    res = runner.invoke(app, ["bench", "mlp", "--no-measure", "--strategies", "given+naive", "-o", str(other)])
    assert res.exit_code == 0
    html = render_html([load_results(results), load_results(other)])
    assert "given+naive" in html and "nntrainer+sort" in html


def test_unusable_input_exits_2(tmp_path, results):
    bad = tmp_path / "bad.json"
    bad.write_text("nope")
    out = tmp_path / "r.html"
    for args in ([str(bad)], [str(tmp_path / "missing.json")], [str(results), "-o", "/nonexistent/x.html"]):
        res = runner.invoke(app, ["report", *args] + ([] if "-o" in args else ["-o", str(out)]))
        assert res.exit_code == 2, res.output
        assert "Traceback" not in res.output
    assert not out.exists()
    empty = tmp_path / "empty.json"
    empty.write_text('{"schema_version": 1, "rows": []}')
    assert runner.invoke(app, ["report", str(empty), "-o", str(out)]).exit_code == 2
