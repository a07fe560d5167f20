"""`onnxplan report RESULTS…`: one self-contained HTML report and a Markdown summary."""

from __future__ import annotations

from pathlib import Path

import typer

from onnxplan.bench import load_results
from onnxplan.cli.common import check_output, handle_errors, write_atomic
from onnxplan.errors import UsageError
from onnxplan.report import markdown_summary, render_html

__all__ = ["report_command"]


def report_command(
    results: list[Path] = typer.Argument(..., help="Results JSON files of `onnxplan bench` (later rows win)."),
    out: Path = typer.Option(Path("report.html"), "-o", "--out", help="The HTML file to write."),
    markdown: Path = typer.Option(None, "--markdown", help="Also write the Markdown summary here ('-': stdout)."),
    title: str = typer.Option("onnxplan bench report", "--title", help="Title of the HTML page."),
) -> None:
    """Write one HTML file (plotly embedded: opens offline) with, per model, the arena layout
    (each buffer a rectangle over its EO span and offset range, coloured by class), bytes live
    over the step against the lower bound and budget, peak and latency by strategy next to
    ONNX Runtime and PyTorch, and the tables; --markdown writes a summary short enough for a
    pull-request comment. Exit 0 on success, 2 on unusable input.
    """
    handle_errors(_report)(results, out, markdown, title)


def _report(results, out, markdown, title) -> None:
    check_output(out, markdown)
    docs = [load_results(p) for p in results]
    if not any(d["rows"] for d in docs):
        raise UsageError("the results hold no rows: nothing to report")
    write_atomic(out, render_html(docs, title))
    typer.echo(f"wrote {out}", err=True)
    if markdown is not None:
        text = markdown_summary(docs)
        if str(markdown) == "-":
            typer.echo(text)
        else:
            write_atomic(markdown, text)
            typer.echo(f"wrote {markdown}", err=True)
