"""The onnxplan command line: thin typer commands over the library."""

from __future__ import annotations

import typer

from onnxplan import settings
from onnxplan._version import __version__
from onnxplan.cli.bench_cmd import bench_command
from onnxplan.cli.check_cmd import check_command
from onnxplan.cli.core import DEBUG_ENV, OnnxplanCommand, OnnxplanGroup, set_debug
from onnxplan.cli.explain_cmd import explain_command
from onnxplan.cli.inspect_cmd import inspect_command
from onnxplan.cli.models_cmd import models_app
from onnxplan.cli.plan_cmd import plan_command
from onnxplan.cli.report_cmd import report_command
from onnxplan.cli.run_cmd import run_command
from onnxplan.loading.zoo import register_source
from onnxplan.models.source import SOURCE as ZOO

register_source(ZOO)  # the CLI hands the zoo to the load stage (the library never imports it)

__all__ = ["app", "main"]

app = typer.Typer(
    name="onnxplan",
    help=(
        "Plan, run and benchmark the memory of one ONNX training step.\n\n"
        "MODEL arguments accept a zoo name (see `onnxplan models list`), a forward .onnx "
        "file (artifacts are generated with onnxruntime-training into a cache), or a folder "
        "of onnxruntime-training artifacts.\n\n"
        "Exit codes: 0 ok, 1 a check failed, 2 bad input or usage, 3 budget not reachable, "
        f"4 an internal error (a bug; --debug or {DEBUG_ENV}=1 prints its traceback)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    cls=OnnxplanGroup,
)
app.add_typer(models_app, name="models")
app.command("inspect", cls=OnnxplanCommand)(inspect_command)
app.command("plan", cls=OnnxplanCommand)(plan_command)
app.command("run", cls=OnnxplanCommand)(run_command)
app.command("bench", cls=OnnxplanCommand)(bench_command)
app.command("report", cls=OnnxplanCommand)(report_command)
app.command("check", cls=OnnxplanCommand)(check_command)
app.command("explain", cls=OnnxplanCommand)(explain_command)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"onnxplan {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help=f"Print the traceback of an internal error (exit 4); "
                               f"also {DEBUG_ENV}=1."),
) -> None:
    """Plan, run and benchmark the memory of one ONNX training step."""
    settings.reload()  # each command reads the environment once, as it starts (onnxplan.settings)
    set_debug(debug)


def main() -> None:
    app()
