"""The onnxplan version (recorded in every plan and results file)."""

__version__ = "0.1.0"
