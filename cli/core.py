"""The click classes behind every onnxplan command: how the CLI ends and what its usage says.

Every way out is one line on stderr and a documented exit code: a usage error (click's own:
a missing argument, an unknown option, a value of the wrong type) is exit 2; an error the
user can fix (OnnxplanError) is turned into its line by cli.common.handle_errors; anything
else is a bug in onnxplan: exit 4 with one line that says so, and the traceback only under
`onnxplan --debug` or ONNXPLAN_DEBUG=1.
"""

from __future__ import annotations

import re
import sys
import traceback
from typing import Any

from typer import Abort
from typer.core import TyperCommand, TyperGroup

try:  # recent typer runs on its own copy of click; older releases on click itself
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.exceptions import ClickException, NoArgsIsHelpError, UsageError

from onnxplan import settings
from onnxplan.errors import EXIT_BUDGET, EXIT_BUG, EXIT_USAGE
from onnxplan.settings import ENV

__all__ = ["DEBUG_ENV", "OnnxplanCommand", "OnnxplanGroup", "debug_enabled", "set_debug"]

DEBUG_ENV = ENV["debug"]
_debug = {"on": False}  # set by `onnxplan --debug` (the root callback), reset by every main()


def set_debug(on: bool) -> None:
    _debug["on"] = on


def debug_enabled() -> bool:
    return _debug["on"] or settings.current().debug


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _error(message: str, code: int) -> None:
    sys.stderr.write(f"onnxplan: error: {_one_line(message)}\n")
    sys.stderr.flush()
    sys.exit(code)


class OnnxplanGroup(TyperGroup):
    """The root group: runs a command and turns every way it can end into an exit code."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        set_debug(False)
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)
        except NoArgsIsHelpError as exc:  # `onnxplan` alone: the help, as click does
            exc.show()
            code = exc.exit_code
        except UsageError as exc:
            where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            _error(f"{exc.format_message().rstrip('.')}{where}", EXIT_USAGE)
        except ClickException as exc:
            _error(exc.format_message(), exc.exit_code)
        except Abort:
            _error("aborted", 130)
        except MemoryError:
            _error("out of memory (MemoryError): the step does not fit this machine", EXIT_BUDGET)
        except Exception as exc:  # noqa: BLE001 - the last line of defence: a bug, said as one
            if debug_enabled():
                traceback.print_exc()
            _error(f"internal error, a bug in onnxplan ({type(exc).__name__}: {exc}); please report it "
                   f"with the traceback that `onnxplan --debug ...` or {DEBUG_ENV}=1 prints", EXIT_BUG)
        else:
            code = rv if isinstance(rv, int) else 0
        if not standalone_mode:
            return code
        sys.exit(code)


_LIST_TYPE = re.compile(r"list\[(.*?)\]")


class OnnxplanCommand(TyperCommand):
    """A command whose usage line and help name arguments in capitals (`plan [OPTIONS] MODEL`,
    `report [OPTIONS] RESULTS...`) and show list types as their element (`<str>`, not
    `<list[str]>`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.param_type_name == "argument" and param.metavar is None:
                param.metavar = param.name.upper().removesuffix("_FILE")
            if hasattr(param, "display_type_rich"):
                param.display_type_rich = _element_type(param.display_type_rich)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = param.metavar if param.required else f"[{param.metavar}]"
                pieces.append(name + ("..." if param.nargs != 1 else ""))
        return pieces


def _element_type(display):
    def display_type(ctx: Any) -> str | None:
        text = display(ctx)
        return _LIST_TYPE.sub(r"\1", text) if text else text

    return display_type
