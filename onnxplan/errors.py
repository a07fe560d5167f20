"""User-facing errors: each maps to one line on stderr and a documented exit code."""

__all__ = [
    "OnnxplanError",
    "UsageError",
    "ModelError",
    "UnsupportedOpError",
    "DynamicDimError",
    "BudgetError",
    "EXIT_OK",
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "EXIT_BUDGET",
    "EXIT_BUG",
]

EXIT_OK = 0
EXIT_FAILURE = 1  # a check failed: mismatch against ONNX Runtime, a regression
EXIT_USAGE = 2  # bad input: path, model, size string, option
EXIT_BUDGET = 3  # no plan reaches the requested budget
EXIT_BUG = 4  # an unexpected internal error: a bug in onnxplan (cli.core)


class OnnxplanError(Exception):
    """An error the user can cause and fix; printed as one line, no traceback."""

    exit_code = EXIT_USAGE


class UsageError(OnnxplanError):
    """A malformed option or argument (size string, unknown name...)."""


class ModelError(OnnxplanError):
    """A model path or file that cannot be used (missing, truncated, refused)."""


class UnsupportedOpError(ModelError):
    """An op without a shape rule (or kernel)."""


class DynamicDimError(ModelError):
    """A dynamic dimension with no value given (--batch / --dim)."""


class BudgetError(OnnxplanError):
    """No plan reaches the requested memory budget."""

    exit_code = EXIT_BUDGET
