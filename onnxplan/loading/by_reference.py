"""Training artifacts for a forward model whose weights stay on disk.

onnxruntime-training's generate_artifacts takes the forward model as one protobuf with every
weight's value inline (at most 2 GiB) and saves every value into the checkpoint. A model over
that (loading.artifacts.MAX_FORWARD_BYTES) is built here from the same onnxblock pieces
generate_artifacts is made of, with its parameters left as references to their files:
onnxblock moves every parameter to a graph input before it builds the gradient graph, so the
training, eval and optimizer models never hold a parameter's value, and the checkpoint is ONNX
Runtime's nominal one (the parameters' names only). Planning needs nothing more: shapes come from
the training model's inputs. The values stay on disk: forward.onnx of the entry refers to them under
forward.data/ (copies of the user's files, made by the kernel), nothing in memory holds them, and a
`run` of such artifacts is refused in one line (ir.checkpoint_file.require_values).
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import onnx

from onnxplan.forward.spec import ForwardModel
from onnxplan.ir.load import ACC_SUFFIX as GRADIENT_BUFFER
from onnxplan.ir.load import RESET_FLAG
from onnxplan.ir.metadata import FORWARD_DATA, FORWARD_MODEL
from onnxplan.ir.onnx_files import external_tensors, load_tensor
from onnxplan.ort import CHECKPOINT, EVAL_MODEL, OPTIMIZER_MODEL, TRAINING_MODEL

__all__ = ["generate_by_reference", "load_constants", "save_forward_by_reference"]


def load_constants(fm: ForwardModel, folder: Path, path: Path) -> None:
    """Read into fm.model, from `folder` (`path` names the file in errors), every external tensor
    that is not a parameter (a buffer, a constant table: the training graph keeps its value);
    the parameters stay references."""
    params = set(fm.trainable) | set(fm.frozen)
    for t, weight in external_tensors(fm.model):
        if not (weight and t.name in params):
            load_tensor(t, folder, path)


def _training_block(loss):
    """onnxblock's TrainingBlock that puts `loss` (a LossType or a Block) on the model's outputs,
    as generate_artifacts' own does."""
    from onnxruntime.training import artifacts, onnxblock

    blocks = {artifacts.LossType.MSELoss: onnxblock.loss.MSELoss,
              artifacts.LossType.CrossEntropyLoss: onnxblock.loss.CrossEntropyLoss}
    block = blocks[loss]() if isinstance(loss, artifacts.LossType) else loss

    class _Training(onnxblock.TrainingBlock):
        def __init__(self) -> None:
            super().__init__()
            self._loss = block

        def build(self, *outputs: str):
            return self._loss(*outputs)

    return _Training()


def _parameters_as_inputs(fm: ForwardModel) -> tuple[onnx.ModelProto, list[onnx.TensorProto], list[onnx.TensorProto]]:
    """fm.model with its parameters moved to graph inputs (as onnxblock moves them, in initializer
    order), and the (trainable, frozen) parameters as nominal tensors: name, type and dims, no
    value. onnxblock checks its base model after every block (onnx.checker, which would look for a
    reference's file in the working directory): with no parameter left an initializer, nothing is read."""
    trainable, frozen = set(fm.trainable), set(fm.frozen)
    model = onnx.ModelProto()
    model.CopyFrom(fm.model)  # small: its large tensors are references
    kept, found = [], []
    for t in model.graph.initializer:
        if t.name in trainable or t.name in frozen:
            found.append(onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims))
        else:
            kept.append(t)
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    model.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in found)
    return (model, [t for t in found if t.name in trainable], [t for t in found if t.name in frozen])


def _inputs_in_onnxblock_order(model: onnx.ModelProto, params: set[str]) -> None:
    """Move the parameter inputs where onnxblock puts them (after the inputs the loss added,
    before the gradient buffers): the same graph as generate_artifacts makes from the model."""
    inputs = list(model.graph.input)
    moved = [vi for vi in inputs if vi.name in params]
    rest = [vi for vi in inputs if vi.name not in params]
    at = next((i for i, vi in enumerate(rest) if vi.name.endswith(GRADIENT_BUFFER) or vi.name == RESET_FLAG),
              len(rest))
    del model.graph.input[:]
    model.graph.input.extend([*rest[:at], *moved, *rest[at:]])


def generate_by_reference(fm: ForwardModel, loss, optimizer: str, out: Path) -> None:
    """What generate_artifacts writes into `out` (training, eval and optimizer models, the
    checkpoint) for fm.model, without its parameters' values: the checkpoint is a nominal one.
    `loss` is losses.loss_block(fm); ORT's own errors propagate as from generate_artifacts."""
    from onnxruntime.training import onnxblock

    model, trainable, frozen = _parameters_as_inputs(fm)
    training = _training_block(loss)
    for t in trainable:
        training.requires_grad(t.name)
    for t in frozen:
        training.requires_grad(t.name, False)
    with onnxblock.base(model):
        training(*[o.name for o in model.graph.output])
        training_model, eval_model = training.to_model_proto()
    params = {t.name for t in (*trainable, *frozen)}
    for built, name in ((training_model, TRAINING_MODEL), (eval_model, EVAL_MODEL)):
        _inputs_in_onnxblock_order(built, params)
        onnx.save(built, str(out / name))
    onnxblock.save_checkpoint((trainable, frozen), str(out / CHECKPOINT), nominal_checkpoint=True)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    step = {"adamw": onnxblock.optim.AdamW, "sgd": onnxblock.optim.SGD}[optimizer]()
    with onnxblock.empty_base(opset_version=opset):
        step((trainable, frozen))
        onnx.save(step.to_model_proto(), str(out / OPTIMIZER_MODEL))


def _copy(src: Path, dest: Path) -> None:
    """A file's bytes copied by the kernel (sendfile: never in this process's memory). Not a hard
    link: onnx refuses to read external data from a file with several links (a "hardlink attack"),
    the user's file included."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)


def save_forward_by_reference(fm: ForwardModel, out: Path) -> None:
    """forward.onnx into `out` with its external tensors under forward.data/ (each file copied
    from fm.weights_dir, where the prepared model's references point): the entry stands alone."""
    if fm.weights_dir is None:
        raise ValueError("save_forward_by_reference: the model's weights are not on disk")
    model = copy.deepcopy(fm.model)  # small: its large tensors are references
    linked: set[str] = set()
    for t, _ in external_tensors(model):
        for entry in t.external_data:
            if entry.key == "location":
                if entry.value not in linked:
                    _copy(fm.weights_dir / entry.value, out / FORWARD_DATA / entry.value)
                    linked.add(entry.value)
                entry.value = f"{FORWARD_DATA}/{entry.value}"
    onnx.save(model, str(out / FORWARD_MODEL))
