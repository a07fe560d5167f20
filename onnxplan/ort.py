"""What onnxplan knows about ONNX Runtime (onnxruntime-training 1.19.2), in one place: the
facts several stages rely on, and its failures as one readable line (the cause, without C++
locations and signatures).

generate_artifacts failures (onnxplan.loading.artifacts) and runtime load refusals
(onnxplan.verification.reference, onnxplan.ir.load) all go through ort_cause. This module imports nothing
of onnxplan: the loader, the import path and verification all read it.
"""

from __future__ import annotations

import importlib
import re
import sys
import threading
from pathlib import Path
from types import ModuleType

__all__ = [
    "CHECKPOINT",
    "DEFAULT_LEARNING_RATE",
    "EVAL_MODEL",
    "LEARNING_RATE",
    "MAX_IR_VERSION",
    "MS",
    "OPTIMIZER_MODEL",
    "ORT_TRAINING",
    "RUNTIME_IR_VERSION",
    "TRAINING_MODEL",
    "import_training",
    "log_errors",
    "ort_cause",
]

ORT_TRAINING = "onnxruntime-training 1.19.2"
MS = "com.microsoft"  # the domain of ORT's contrib and gradient ops
MAX_IR_VERSION = 10  # the newest IR onnxruntime 1.19 loads
# what the artifact builder stamps: generate_artifacts writes the optimizer model with the onnx
# package's newest IR, which onnxruntime then refuses
RUNTIME_IR_VERSION = 9
DEFAULT_LEARNING_RATE = 1e-3  # onnxruntime.training.api.Optimizer's initial learning rate
LEARNING_RATE = "learning_rate"  # the optimizer model's learning-rate input
# the files onnxruntime.training.artifacts.generate_artifacts writes into an artifact folder
TRAINING_MODEL = "training_model.onnx"
OPTIMIZER_MODEL = "optimizer_model.onnx"
EVAL_MODEL = "eval_model.onnx"
CHECKPOINT = "checkpoint"

_STATUS = re.compile(r"\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*[A-Z_]+\s*:\s*")
# "/onnxruntime_src/.../file.cc:123 <C++ signature> <condition> was false. <message>"
_LOCATION = re.compile(r"/onnxruntime_src/\S+?/([\w.]+:\d+)\s+")
_NO_BUILDER = re.compile(r"gradient builder has not been registered:\s*(\S+)\s+for node\s*(.*)$")
_LOAD = re.compile(r"Load model from (\S+) failed:\s*")
_SHORT_LOCATION = re.compile(r"^[\w.-]+\.(?:cc|h|cpp):\d+\s+(?:[A-Z]\w*\s+(?=[A-Z]))?")
_NEW_OPSET = re.compile(r"Opset (\d+) is under development.*?support for domain (\S+) is till opset (\d+)")
_UNREGISTERED = re.compile(r"(?:Fatal error:\s*)?([\w.]+):(\w+)\(-?\d+\) is not a registered function/op")
_NO_OP = re.compile(r"No Op registered for (\S+) with domain_version of (\d+)")
_BAD_NODE = re.compile(r"Name:\s*(\S*)\s+OpType:\s*(\S+)")
_NO_KERNEL = re.compile(r"Could not find an implementation for (\w+)\((\d+)\) node with name '([^']*)'")


def _strip_signature(text: str) -> str:
    """Drop a leading 'path.cc:N signature(args) [const] ' and keep what follows."""
    m = _LOCATION.search(text)
    if not m:
        return text
    rest = text[m.end():]
    if " was false." in rest:  # ORT_ENFORCE(condition, message)
        cond_and_sig, _, message = rest.partition(" was false.")
        message = message.strip()
        if message:
            return message
        # no message: keep the condition (after the signature's last ')') and the location
        condition = cond_and_sig.rsplit(") ", 1)[-1].removeprefix("const ").strip()
        return f"internal check failed: {condition} ({m.group(1)})"
    depth, end = 0, -1  # ORT_THROW: skip the balanced signature
    for i, ch in enumerate(rest):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                end = i
                break
    return rest[end + 1:].removeprefix(" const").strip() if end >= 0 else rest


def ort_cause(text: str) -> str:
    """The cause in an ONNX Runtime exception text (or C++ log line), on one line, untruncated."""
    loading = _LOAD.search(" ".join(str(text).split()))
    cause = _cause(text)
    return f"{cause} (loading {Path(loading.group(1)).name})" if loading else cause


def _cause(text: str) -> str:
    text = " ".join(str(text).split())
    status = list(_STATUS.finditer(text))
    if status:  # what follows ORT's status marker is the message; before it, a pybind location
        text = text[status[-1].end():]
    text = _LOAD.sub("", text)
    text = _strip_signature(text)
    text = _SHORT_LOCATION.sub("", text)
    m = _NEW_OPSET.search(text)
    if m:
        return (f"opset {m.group(1)} of {m.group(2)} is newer than onnxruntime 1.19.2 supports "
                f"(at most {m.group(3)})")
    m = _UNREGISTERED.search(text)
    if m:
        return (f"unknown custom op {m.group(1)}::{m.group(2)}: onnxruntime 1.19.2 has no kernel for it "
                f"(not a registered function/op)")
    m = _NO_BUILDER.search(text)
    if m:
        node = m.group(2).strip()
        return f"{ORT_TRAINING} has no gradient for {m.group(1)}" + (f" (node {node})" if node else "")
    m = _NO_OP.search(text)
    if m:
        where = _BAD_NODE.search(text)
        node = f" (node {where.group(1)})" if where and where.group(1) else ""
        return (f"onnxruntime has no operator {m.group(1)} for opset {m.group(2)} of its domain{node}; "
                f"unknown custom op or opset too new")
    m = _NO_KERNEL.search(text)
    if m:
        return (f"onnxruntime 1.19.2 (CPU) has no kernel for {m.group(1)}-{m.group(2)} on the input types "
                f"of node {m.group(3)}")
    if text.startswith("Checkpoint verification failed"):
        return "unreadable checkpoint (not an onnxruntime-training checkpoint, or corrupt)"
    return text.strip() or "unknown error"


def log_errors(log_path: Path) -> list[str]:
    """Error lines of ORT's captured C++ log ([E:...] lines), as causes."""
    try:
        lines = Path(log_path).read_text(errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        if "[E:" in line:
            out.append(ort_cause(line.split("] ", 1)[-1]))
    return out


def import_training() -> ModuleType:
    """`onnxruntime.training`, imported on a thread of its own the first time.

    Importing it stores an exception in a module global (ORTModule's missing torch extensions,
    onnxruntime.training.ortmodule), and the exception's traceback holds the frames that were
    importing it and, through each frame's caller, the whole stack above: Python keeps every
    local of a frame a traceback holds, after the function has returned. Imported lazily from
    run_plan (initial_parameters), that stack held the finished run's executor, its arena and
    state region (2.9 GB of GPT-2 small's 3 GB left after `run`, before `--verify` started;
    reports/real-size.md). A thread's stack ends at the thread: nothing of the caller's is held."""
    name = "onnxruntime.training"
    if name in sys.modules:
        return sys.modules[name]
    failed: list[BaseException] = []

    def load() -> None:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=load, name="onnxplan-import-ort-training")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return sys.modules[name]
