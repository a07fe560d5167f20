"""Build (and cache) onnxruntime-training artifacts for a forward model."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np
import onnx

from onnxplan import settings
from onnxplan.errors import ModelError, UsageError
from onnxplan.files import write_atomic
from onnxplan.forward.spec import LOSSES, OPTIMIZERS, ForwardModel
from onnxplan.ir.metadata import (
    ARTIFACT_FILES,
    FORWARD_DATA,
    FORWARD_MODEL,
    METADATA_FILE,
    SCHEMA_VERSION,
    read_metadata,
)
from onnxplan.loading.by_reference import generate_by_reference, load_constants, save_forward_by_reference
from onnxplan.ort import EVAL_MODEL, OPTIMIZER_MODEL, RUNTIME_IR_VERSION, TRAINING_MODEL

__all__ = [
    "ARTIFACT_FILES",
    "METADATA_FILE",
    "SCHEMA_VERSION",
    "build_artifacts",
    "content_hash",
    "default_cache_dir",
    "generate_from_onnx",
    "quiet_fds",
    "read_metadata",
    "recipe_artifacts",
]

FAILED_SUFFIX = ".failed"  # <hash>.failed: the one-line cause of a build that failed
RECIPES_DIR = "recipes"  # recipes/<key>: the content hash a deterministic recipe built


class ArtifactBuildError(ModelError):
    """onnxruntime-training refused the model: deterministic, so cached as a failure."""




def default_cache_dir() -> Path:
    """Root of the artifact cache: $ONNXPLAN_CACHE, else ~/.cache/onnxplan/artifacts (onnxplan.settings)."""
    return settings.current().cache_dir


def _ort_version() -> str:
    # from the package metadata: importing onnxruntime.training pulls in torch (seconds)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("onnxruntime-training-cpu")
    except PackageNotFoundError:
        import onnxruntime

        return onnxruntime.__version__


def _meta_without_hash(fm: ForwardModel, optimizer: str) -> dict:
    leading = fm.inputs[0] if fm.inputs and fm.inputs[0].shape else fm.labels
    if leading is None:
        raise ModelError(f"{fm.name}: no input has a batch dimension")
    batch = leading.shape[0]
    return {
        "schema_version": SCHEMA_VERSION,
        "model": fm.name,
        "batch": int(batch),
        "loss": fm.loss,
        "optimizer": optimizer,
        "inputs": [spec.to_dict() for spec in fm.inputs],
        "labels": None if fm.labels is None else fm.labels.to_dict(),  # causal-lm: the token ids
        "trainable": list(fm.trainable),
        "frozen": list(fm.frozen),
        **({"forward": fm.prep} if fm.prep is not None else {}),
        **({"weights": "by reference"} if _by_reference(fm) else {}),  # and a nominal checkpoint
    }


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _parts(msg, number: int, skip: tuple[int, ...] = ()) -> tuple[bytes, bytes]:
    """`msg` serialised without field `number` (nor `skip`), split where that field would go:
    protobuf writes known fields in field-number order."""
    before, after = type(msg)(), type(msg)()
    for field, value in msg.ListFields():
        if field.number == number or field.number in skip:
            continue
        dest = before if field.number < number else after
        repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
        if repeated:
            getattr(dest, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(dest, field.name).CopyFrom(value)
        else:
            setattr(dest, field.name, value)
    return before.SerializeToString(), after.SerializeToString()


_RAW_DATA, _INITIALIZER, _GRAPH = 9, 5, 7  # TensorProto.raw_data, GraphProto.initializer, ModelProto.graph
_EXTERNAL_FIELDS = (13, 14)  # TensorProto.external_data, data_location


def _hash_model(h, model: onnx.ModelProto, weights_dir: Path | None) -> None:
    """Feed `h` the bytes model.SerializeToString() would give with every external initializer
    loaded inline (as load_weights leaves it), streaming each one's data from `weights_dir`
    instead of holding the whole serialisation: a large model is hashed in little memory."""
    from onnxplan.ir.onnx_files import external_chunks, tensor_bytes

    tensors = []  # inline TensorProto | (before, after, length, tensor)
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            tensors.append(t)  # serialised one at a time below: never the whole model at once
            continue
        if weights_dir is None:
            raise ModelError(f"initializer '{t.name}' has external data but no folder to read it from")
        before, after = _parts(t, _RAW_DATA, _EXTERNAL_FIELDS)
        tensors.append((before, after, tensor_bytes(t), t))

    def size(item) -> int:
        if isinstance(item, onnx.TensorProto):
            return item.ByteSize()
        before, after, n, _ = item
        return len(before) + 1 + len(_varint(n)) + n + len(after)

    g_before, g_after = _parts(model.graph, _INITIALIZER)
    m_before, m_after = _parts(model, _GRAPH)
    graph_len = len(g_before) + len(g_after) + sum(1 + len(_varint(size(x))) + size(x) for x in tensors)
    h.update(m_before)
    h.update(bytes([_GRAPH << 3 | 2]) + _varint(graph_len))
    h.update(g_before)
    for item in tensors:
        h.update(bytes([_INITIALIZER << 3 | 2]) + _varint(size(item)))
        if isinstance(item, onnx.TensorProto):
            h.update(item.SerializeToString())
            continue
        before, after, n, t = item
        assert weights_dir is not None  # an external initializer without it was refused above
        h.update(before)
        h.update(bytes([_RAW_DATA << 3 | 2]) + _varint(n))
        for chunk in external_chunks(t, weights_dir, weights_dir):
            h.update(chunk)
        h.update(after)
    h.update(g_after)
    h.update(m_after)


def content_hash(fm: ForwardModel, optimizer: str) -> str:
    """sha256 of the forward model bytes (its weights inline: external data streamed from
    fm.weights_dir, never held whole), the metadata (loss, optimizer, specs, parameter
    lists) and the onnxruntime version: equal hashes mean interchangeable artifacts."""
    h = hashlib.sha256()
    _hash_model(h, fm.model, fm.weights_dir)
    meta = _meta_without_hash(fm, optimizer)
    meta["onnxruntime"] = _ort_version()
    h.update(json.dumps(meta, sort_keys=True).encode())
    return h.hexdigest()


@contextlib.contextmanager
def quiet_fds() -> Iterator[Path]:
    """Send fds 1 and 2 to a temp file (ORT's C++ INFO logging ignores Python's sys.stdout).

    Yields the log path so a failure can quote it. Process-wide while active.
    """
    import sys

    with tempfile.NamedTemporaryFile("w+b", prefix="onnxplan-ort-", suffix=".log", delete=False) as log:
        log_path = Path(log.name)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = [os.dup(1), os.dup(2)]
    fd = os.open(log_path, os.O_WRONLY)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield log_path
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (*saved, fd):
            os.close(f)


def _restart_graph_names() -> None:
    """onnxblock names the nodes and values it adds from one counter per process
    (onnx::SoftmaxCrossEntropyLoss::16): without a restart the same model built after another one
    gets other names, so another graph fingerprint, and a plan or a stored profile made in one
    process would not match the same model built in the next. Start every build at 0."""
    from onnxplan.ort import import_training

    import_training()  # on its own thread: its stored exception holds none of the build's frames
    from onnxruntime.training.onnxblock import _graph_utils

    if hasattr(_graph_utils, "_GRAPH_TOKEN"):
        _graph_utils._GRAPH_TOKEN = 0


def _by_reference(fm: ForwardModel) -> bool:
    """Whether `fm` is built with its parameters left on disk (by_reference.py)."""
    return fm.by_reference and fm.weights_dir is not None


def _run_generate_artifacts(fm: ForwardModel, optimizer: str, out: Path) -> None:
    """Call onnxruntime-training's generate_artifacts quietly into the existing dir `out` (for a
    model built by reference, its pieces with the parameters left on disk: by_reference.py)."""
    if not fm.trainable:  # ORT's own message for this is "list index out of range"
        raise ModelError(f"{fm.name!r} has no trainable parameters (no float initializer"
                         f"{'' if not fm.frozen else ' that is not frozen'}): a training step needs at least one")
    import onnxruntime

    from onnxplan.ort import import_training, log_errors, ort_cause

    import_training()  # on its own thread: its stored exception holds none of the build's frames
    from onnxruntime.training import artifacts

    from onnxplan.losses import loss_block

    onnxruntime.set_default_logger_severity(3)
    _restart_graph_names()
    loss = loss_block(fm)
    optim = {"adamw": artifacts.OptimType.AdamW, "sgd": artifacts.OptimType.SGD}[optimizer]
    with quiet_fds() as log_path:
        try:
            if _by_reference(fm):
                generate_by_reference(fm, loss, optimizer, out)
            else:
                artifacts.generate_artifacts(fm.model, requires_grad=list(fm.trainable),
                                             frozen_params=list(fm.frozen), loss=loss, optimizer=optim,
                                             artifact_directory=str(out))
        except OSError:  # the disk, not the model: not a failure to remember
            raise
        except Exception as exc:  # noqa: BLE001 - ORT raises RuntimeError/Fail/InvalidGraph... as one line
            cause = ort_cause(str(exc)) if str(exc).strip() else ""
            if not cause or cause == "unknown error":
                cause = (log_errors(log_path) or [f"{type(exc).__name__} with no message"])[-1]
            raise ArtifactBuildError(f"onnxruntime-training could not build the training graph of "
                                     f"'{fm.name}': {cause}") from None
        finally:
            log_path.unlink(missing_ok=True)


def _fix_runtime_ir(path: Path) -> None:
    """Rewrite a generated model's ir_version down to one the runtime loads."""
    model = onnx.load(str(path))
    if model.ir_version > RUNTIME_IR_VERSION:
        model.ir_version = RUNTIME_IR_VERSION
        onnx.save(model, str(path))


def _fix_eval_batchnorm(path: Path) -> None:
    """generate_artifacts' eval model flips BatchNormalization to training_mode=0 but keeps
    its 3 outputs, which onnx shape inference then rejects: drop the unused extra outputs."""
    model = onnx.load(str(path))
    used = {name for node in model.graph.node for name in node.input}
    used |= {out.name for out in model.graph.output}
    changed = False
    for node in model.graph.node:
        if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        training = any(a.name == "training_mode" and a.i for a in node.attribute)
        if not training and len(node.output) > 1 and not (set(node.output[1:]) & used):
            del node.output[1:]
            changed = True
    if changed:
        onnx.save(model, str(path))


def _write_entry(fm: ForwardModel, optimizer: str, digest: str, tmp: Path) -> None:
    """Fill directory `tmp` with forward.onnx, the ORT artifacts and onnxplan.json (built by
    reference: the parameters left on disk, forward.data/ and a nominal checkpoint)."""
    if _by_reference(fm):
        save_forward_by_reference(fm, tmp)
    else:
        onnx.save(fm.model, str(tmp / FORWARD_MODEL))
    _run_generate_artifacts(fm, optimizer, tmp)
    for name in (TRAINING_MODEL, OPTIMIZER_MODEL, EVAL_MODEL):
        _fix_runtime_ir(tmp / name)
    _fix_eval_batchnorm(tmp / EVAL_MODEL)
    meta = _meta_without_hash(fm, optimizer)
    meta["content_hash"] = digest
    (tmp / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def _write_note(path: Path, message: str) -> None:
    """Record a one-line note at `path` (temp name + rename): a failed build's cause, a
    recipe's content hash."""
    with contextlib.suppress(OSError):  # best effort: an unwritable cache only loses the shortcut
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, message + "\n")


def _complete(entry: Path) -> bool:
    return entry.is_dir() and all((entry / name).exists() for name in ARTIFACT_FILES)


def _ensure_cached(fm: ForwardModel, optimizer: str, root: Path) -> Path:
    """The cache entry for (fm, optimizer), built into a temp dir and renamed into place."""
    digest = content_hash(fm, optimizer)
    entry = root / digest
    if _complete(entry):
        return entry
    failed = root / f"{digest}{FAILED_SUFFIX}"
    if failed.is_file():  # the same build failed before: fail fast with the same line
        raise ArtifactBuildError(failed.read_text().strip())
    weights_dir = fm.weights_dir
    if weights_dir is not None:  # a cache miss: onnxruntime-training needs the constants' values
        source = weights_dir / f"{fm.name}.onnx"
        if _by_reference(fm):  # the parameters stay on disk
            load_constants(fm, weights_dir, source)
        else:  # and every weight's
            from onnxplan.ir.onnx_files import load_weights

            load_weights(fm.model, weights_dir, source)
            fm.weights_dir = None
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=root))
    try:
        try:
            _write_entry(fm, optimizer, digest, tmp)
        except ArtifactBuildError as exc:
            _write_note(failed, str(exc))
            raise
        if entry.exists():  # incomplete leftover (e.g. files deleted by hand): set it aside
            trash = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-old-", dir=root))
            with contextlib.suppress(OSError):
                entry.rename(trash / "entry")
            shutil.rmtree(trash, ignore_errors=True)
        try:
            tmp.rename(entry)
        except OSError:
            if not _complete(entry):  # lost a race to a writer that failed: surface it
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


def _copy_out(entry: Path, out_dir: Path) -> Path:
    """Copy a cache entry's files into out_dir, each through a temp name + rename."""
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".onnxplan-", dir=out_dir))
    try:
        names = [*ARTIFACT_FILES, *([FORWARD_DATA] if (entry / FORWARD_DATA).is_dir() else [])]
        for name in names:
            src = entry / name
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, staging / name)
        for name in names:
            dest = out_dir / name
            if dest.is_dir() and not dest.is_symlink():
                shutil.rmtree(dest)
            os.replace(staging / name, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def build_artifacts(fm: ForwardModel, out_dir: Path | None, optimizer: str = "adamw",
                    cache_dir: Path | None = None) -> Path:
    """Training artifacts for `fm`: forward.onnx, training/optimizer/eval models, checkpoint
    and onnxplan.json. Built once per content hash into the cache (`cache_dir`, else
    $ONNXPLAN_CACHE, else ~/.cache/onnxplan/artifacts) at <root>/<hash>; returns that entry,
    or `out_dir` after copying the files there when it is given."""
    if optimizer not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {optimizer!r}; known: {', '.join(OPTIMIZERS)}")
    if fm.loss not in LOSSES:
        raise UsageError(f"unknown loss {fm.loss!r}; known: {', '.join(LOSSES)}")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    try:
        entry = _ensure_cached(fm, optimizer, root.expanduser())
        return _copy_out(entry, Path(out_dir)) if out_dir is not None else entry
    except OSError as exc:
        raise ModelError(f"cannot write artifacts: {exc}") from None


def recipe_artifacts(recipe: Mapping, make: Callable[[], ForwardModel], optimizer: str = "adamw",
                     cache_dir: Path | None = None) -> Path:
    """build_artifacts(make(), None, optimizer), skipping make() when the cache already holds
    what this recipe built. `recipe` must name everything make()'s output depends on
    (onnxplan.models.build_recipe: entry, batch, loss, builder sources, numpy and onnx
    versions); with the optimizer, onnxruntime's version and SCHEMA_VERSION it keys
    <root>/recipes/<sha256>, a note holding the content hash of the entry it built. Building a
    zoo model's seeded weights and hashing them costs more than planning it."""
    if optimizer not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {optimizer!r}; known: {', '.join(OPTIMIZERS)}")
    root = (Path(cache_dir) if cache_dir is not None else default_cache_dir()).expanduser()
    key = {**recipe, "optimizer": optimizer, "onnxruntime": _ort_version(), "schema": SCHEMA_VERSION}
    note = root / RECIPES_DIR / hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    with contextlib.suppress(OSError, UnicodeDecodeError):
        digest = note.read_text().strip()
        if len(digest) == 64 and _complete(root / digest):
            return root / digest
    entry = build_artifacts(make(), None, optimizer=optimizer, cache_dir=root)
    _write_note(note, entry.name)
    return entry


# -- a user's own forward model ----------------------------------------------------------------

# protobuf refuses a message over 2 GiB, and onnxruntime-training's generate_artifacts takes the
# model as one in memory, every weight's value inline (it raises for a larger one and wants a
# path, then holds several copies): a forward model larger than this is built by reference
# (by_reference.py: its parameters left on disk, a nominal checkpoint)
MAX_FORWARD_BYTES = (1 << 31) - 1


def _load_forward(forward_path: Path) -> onnx.ModelProto:
    from onnxplan.ir.onnx_files import load_onnx

    return load_onnx(forward_path, weights=False)


def forward_bytes(model: onnx.ModelProto) -> int:
    """Bytes of `model` with every weight inline: its protobuf and the data still on disk."""
    from onnxplan.ir.onnx_files import external_bytes

    return model.ByteSize() + external_bytes(model)


def generate_from_onnx(forward_path: Path, loss: str, optimizer: str = "adamw",
                       out_dir: Path | None = None, cache_dir: Path | None = None,
                       train: list[str] | None = None, freeze: list[str] | None = None,
                       dims: Mapping[str, int] | None = None, batch: int | None = None,
                       model: onnx.ModelProto | None = None) -> Path:
    """Artifacts for a user's forward .onnx (one float output, the loss input).

    onnxplan.forward.prepare_forward makes it trainable as the zoo builders do (trained
    parameters chosen by reachability, `train` / `freeze` globs over initializer names,
    optional outputs completed, exporter quirks normalised, ops without a gradient
    decomposed, dynamic axes fixed from `dims` / `batch`, a fixed batch re-batched); its
    report is the metadata's "forward" entry. `model`, when given, is `forward_path`
    already loaded (it is not modified; its large external tensors may still be references:
    load_onnx(weights=False)). The model is prepared from shapes alone; its weights are streamed
    through the content hash and read whole only to build artifacts the cache lacks, and never
    for one over MAX_FORWARD_BYTES (built by reference: by_reference.py). Returns the artifact
    directory, as build_artifacts does.
    """
    from onnxplan.forward import prepare_forward

    if loss not in LOSSES:
        raise UsageError(f"unknown loss {loss!r}; known: {', '.join(LOSSES)}")
    forward_path = Path(forward_path)
    if model is None:
        model = _load_forward(forward_path)
    if len(model.graph.output) != 1:
        raise ModelError(f"{forward_path}: the forward model must have exactly one output (the loss "
                         f"input); it has {len(model.graph.output)}")
    if optimizer not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {optimizer!r}; known: {', '.join(OPTIMIZERS)}")

    by_reference = forward_bytes(model) > MAX_FORWARD_BYTES  # then its parameters are never read

    def prepared() -> ForwardModel:
        fm = prepare_forward(model, forward_path.stem, loss, dims=dims, batch=batch, train=train, freeze=freeze)
        fm.weights_dir = forward_path.parent  # prepared from shapes: the weights are read on a cache miss only
        fm.by_reference = by_reference
        return fm

    # keyed by the file as given (its weights streamed through the hash) and every option: a
    # later command on the same file finds its artifacts without preparing the model again
    # (shape inference over a real-size model takes longer than planning it)
    h = hashlib.sha256()
    _hash_model(h, model, forward_path.parent)
    recipe = {"forward": h.hexdigest(), "name": forward_path.stem, "loss": loss, "batch": batch,
              "dims": sorted((dims or {}).items()), "train": list(train or ()), "freeze": list(freeze or ()),
              **({"weights": "by reference"} if by_reference else {}),
              "library": _library_sources(), "numpy": np.__version__, "onnx": onnx.__version__}
    entry = recipe_artifacts(recipe, prepared, optimizer=optimizer, cache_dir=cache_dir)
    try:
        return _copy_out(entry, Path(out_dir)) if out_dir is not None else entry
    except OSError as exc:
        raise ModelError(f"cannot write artifacts: {exc}") from None


@functools.cache
def _library_sources() -> str:
    """sha256 of onnxplan's own source (what prepares a forward model and builds its artifacts):
    a changed onnxplan prepares a forward file again instead of trusting an older preparation.
    Read once per process (some 180 files: the source does not change under a running process)."""
    root = Path(__file__).parents[1]  # the onnxplan package
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()
