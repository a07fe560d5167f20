"""Load an artifact folder into one StepGraph: training model and optimizer joined."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from onnxplan.errors import DynamicDimError, ModelError
from onnxplan.ir.graph import Node, StepGraph, Value, ValueClass
from onnxplan.ir.metadata import read_metadata
from onnxplan.ir.onnx_files import load_onnx
from onnxplan.ir.tensor import TensorSpec, onnx_to_numpy_dtype
from onnxplan.ort import CHECKPOINT, LEARNING_RATE, OPTIMIZER_MODEL, TRAINING_MODEL

__all__ = ["input_spec", "parameter_names", "read_step", "tensor_array"]

ACC_SUFFIX = "_grad.accumulation.buffer"
RESET_FLAG = "lazy_reset_grad"
OPTIMIZER_OPS = {"AdamWOptimizer": "AdamW", "SGDOptimizerV2": "SGD"}


def parameter_names(folder: Path, meta: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(trainable, frozen) parameter names, from the metadata or else the checkpoint."""
    if "trainable" in meta:
        return list(meta["trainable"]), list(meta.get("frozen", []))
    ckpt = folder / CHECKPOINT
    if not ckpt.is_file():
        raise ModelError(f"{folder}: no checkpoint file and no onnxplan.json to name the parameters")
    from onnxplan.ort import import_training

    import_training()  # slow: only when needed; on its own thread (see import_training)
    from onnxruntime.training.api import CheckpointState

    try:
        state = CheckpointState.load_checkpoint(str(ckpt))
    except Exception as exc:  # noqa: BLE001 - ORT raises plain RuntimeErrors
        from onnxplan.ort import ort_cause

        raise ModelError(f"{ckpt}: {ort_cause(str(exc))}") from None
    trainable = [name for name, p in state.parameters if p.requires_grad]
    frozen = [name for name, p in state.parameters if not p.requires_grad]
    return trainable, frozen


def tensor_array(t: onnx.TensorProto, what: str) -> np.ndarray:
    """The numpy array of an initializer or tensor attribute; ModelError (exit 2) when its data
    does not match its dims or type (truncated, wrong length, unknown type)."""
    try:
        onnx_to_numpy_dtype(t.data_type)  # a numeric type
        if any(d < 0 for d in t.dims):
            raise ValueError(f"negative dimension in {list(t.dims)}")
        return numpy_helper.to_array(t)
    except (ModelError, ValueError, TypeError, KeyError, OverflowError, MemoryError) as exc:
        raise ModelError(f"{what} '{t.name}': unreadable tensor data ({type(exc).__name__}: {exc})") from None


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        try:
            v = onnx.helper.get_attribute_value(a)
            if isinstance(v, bytes):
                v = v.decode()
            elif isinstance(v, list) and v and isinstance(v[0], bytes):
                v = [x.decode() for x in v]
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            raise ModelError(f"node '{node.name}' ({node.op_type}): attribute '{a.name}' is unreadable ({exc})") from None
        if isinstance(v, onnx.TensorProto):
            v = tensor_array(v, f"attribute '{a.name}' of node '{node.name}'")
        out[a.name] = v
    return out


def input_spec(vi: onnx.ValueInfoProto, dims: dict[str, int], batch: int | None) -> TensorSpec:
    tt = vi.type.tensor_type
    shape = []
    for axis, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value"):
            if d.dim_value < 0:
                raise ModelError(f"input '{vi.name}' has a negative dimension {d.dim_value} (axis {axis})")
            if d.dim_value == 0:  # a step of no samples trains nothing (and ORT's kernels divide by it)
                raise ModelError(f"input '{vi.name}' has a zero-sized dimension (axis {axis}): a step with no "
                                 "elements trains nothing; export it with a positive size or a dynamic axis")
            shape.append(d.dim_value)
            continue
        name = d.dim_param or "?"
        if name in dims:
            shape.append(dims[name])
        elif batch is not None and axis == 0:
            shape.append(batch)
        else:
            raise DynamicDimError(
                f"input '{vi.name}' has a dynamic dimension '{name}' (axis {axis}); "
                f"give its value with --batch N or --dim {name}=N"
            )
    try:
        dtype = onnx_to_numpy_dtype(tt.elem_type)
    except ModelError as exc:
        raise ModelError(f"input '{vi.name}': {exc}") from None
    return TensorSpec(dtype.name, tuple(shape))


def _check_total_bytes(values: dict[str, Value], folder: Path) -> None:
    """Refuse a step whose tensors add up to more than sizes.MAX_BYTES: past it byte counts
    are no longer exact in JSON or safe from int64 overflow in the planners."""
    from onnxplan.sizes import MAX_BYTES, format_bytes

    total = sum(v.spec.nbytes for v in values.values() if v.spec is not None)
    if total > MAX_BYTES:
        raise ModelError(f"{folder}: the step's tensors add up to {format_bytes(total)} ({total:.3g} B), more "
                         f"than onnxplan plans for ({format_bytes(MAX_BYTES)}); use a smaller batch or dimension")


def _forward_nodes(nodes: list[onnx.NodeProto], loss: str) -> set[int]:
    """Indices of the nodes the loss depends on (the forward pass)."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output}
    todo, seen = [loss], set()
    while todo:
        i = producer.get(todo.pop())
        if i is None or i in seen:
            continue
        seen.add(i)
        todo.extend(x for x in nodes[i].input if x)
    return seen


def _optimizer_node(opt: onnx.ModelProto, path: Path) -> onnx.NodeProto:
    found = [n for n in opt.graph.node if n.op_type in OPTIMIZER_OPS]
    if len(found) != 1:
        raise ModelError(f"{path}: expected one AdamWOptimizer or SGDOptimizerV2 node, found {len(found)}")
    return found[0]


def _check_checkpoint(folder: Path, params: set[str], known: dict[str, TensorSpec]) -> None:
    """The checkpoint must be readable and hold every parameter with the model's shape (a nominal
    checkpoint records names only: checkpoint_file.CheckpointIndex)."""
    from onnxplan.ir.checkpoint_file import checkpoint_parameters

    path = folder / CHECKPOINT
    if not path.is_file():
        return  # resolve_artifacts refuses a folder without one
    stored = checkpoint_parameters(path)
    for name in sorted(params):
        if name not in stored:
            raise ModelError(f"{path}: corrupt checkpoint (parameter {name!r} is missing)")
        shape = stored[name]
        if shape is not None and name in known and shape != known[name].shape:
            raise ModelError(f"{path}: corrupt checkpoint (parameter {name!r} has shape {list(shape)}, "
                             f"the model {list(known[name].shape)})")


def _graph_inputs(tg: onnx.GraphProto, path: Path, dims: dict[str, int], batch: int | None,
                  trainable: list[str], frozen: list[str]) -> tuple[dict[str, Value], dict[str, TensorSpec],
                                                                    dict[str, np.ndarray], list[str]]:
    """The training graph's initializers and inputs: (values, specs, constant contents, step inputs)."""
    params = set(trainable) | set(frozen)
    values: dict[str, Value] = {}
    known: dict[str, TensorSpec] = {}
    constants: dict[str, np.ndarray] = {}
    step_inputs: list[str] = []
    for t in tg.initializer:
        constants[t.name] = tensor_array(t, "initializer")
        values[t.name] = Value(t.name, None, ValueClass.CONSTANT)
    for vi in tg.input:
        if vi.name in known:
            raise ModelError(f"{path}: graph input '{vi.name}' is listed twice")
        spec = input_spec(vi, dims, batch)
        known[vi.name] = spec
        if vi.name in params:
            values[vi.name] = Value(vi.name, None, ValueClass.PARAMETER, trainable=vi.name in trainable)
        elif vi.name.endswith(ACC_SUFFIX):
            values[vi.name] = Value(vi.name, None, ValueClass.GRADIENT)
        elif vi.name == RESET_FLAG:
            constants[vi.name] = np.ones(spec.shape, dtype=bool)  # one fresh step: reset
            values[vi.name] = Value(vi.name, None, ValueClass.CONSTANT)
        else:
            values[vi.name] = Value(vi.name, None, ValueClass.INPUT)
            step_inputs.append(vi.name)
    missing = [p for p in [*trainable, *frozen] if p not in known]
    if missing:
        raise ModelError(f"{path}: parameter '{missing[0]}' is not a graph input"
                         + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return values, known, constants, step_inputs


def _training_nodes(tg: onnx.GraphProto, path: Path, loss: str,
                    values: dict[str, Value]) -> tuple[list[Node], dict[str, str]]:
    """The training graph's nodes (unique names, phases; InPlaceAccumulatorV2 with its updated
    buffer as a second output), their outputs added to `values`; and accumulator -> updated name."""
    forward = _forward_nodes(list(tg.node), loss)
    nodes: list[Node] = []
    updated_grad: dict[str, str] = {}
    param_grads = set()
    produced = set(values)  # initializers and graph inputs
    names: set[str] = set()
    for i, n in enumerate(tg.node):
        outputs = list(n.output)
        phase = "forward" if i in forward else "backward"
        name = n.name or f"{n.op_type}_{i}"
        while name in names:  # ONNX does not require unique node names; the IR keys nodes by name
            name = f"{name}#{i}"
        names.add(name)
        twice = next((o for o in outputs if o and o in produced), None)
        if twice is not None:
            raise ModelError(f"{path}: value '{twice}' is produced twice (again by node "
                             f"'{name}'); an ONNX graph assigns every value once")
        produced.update(o for o in outputs if o)
        if n.op_type == "InPlaceAccumulatorV2":
            if len(n.input) < 2 or len(n.output) < 1 or not n.input[0] or not n.input[1]:
                raise ModelError(f"{path}: node '{name}' (InPlaceAccumulatorV2) needs a "
                                 f"buffer and a gradient input and an output")
            buf = n.input[0]
            updated_grad[buf] = f"{buf}.updated"
            outputs = [outputs[0], updated_grad[buf]]
            param_grads.add(n.input[1])
        nodes.append(Node(name, n.op_type, n.domain, list(n.input), outputs, _attrs(n), phase))
    for n in nodes:
        for o in n.outputs:
            if not o:
                continue
            if o in param_grads or o in updated_grad.values():
                vc = ValueClass.GRADIENT
            else:
                vc = ValueClass.ACTIVATION if n.phase == "forward" else ValueClass.TEMPORARY
            values[o] = Value(o, None, vc)
    return nodes, updated_grad


def _optimizer_step(opt: onnx.ModelProto, folder: Path, trainable: list[str], updated_grad: dict[str, str],
                    lr_spec: TensorSpec, values: dict[str, Value], known: dict[str, TensorSpec]) -> tuple[Node, list[str]]:
    """The optimizer as one node over every trainable parameter (its state values added to
    `values` and `known`), and the step's state outputs (updated moments)."""
    opt_node = _optimizer_node(opt, folder / OPTIMIZER_MODEL)
    kind = OPTIMIZER_OPS[opt_node.op_type]
    found = [updated_grad.get(p + ACC_SUFFIX) for p in trainable]
    if None in found:
        missing = trainable[found.index(None)]
        raise ModelError(f"{folder}: trainable parameter '{missing}' has no gradient accumulator")
    grads = [g for g in found if g is not None]
    known[LEARNING_RATE] = lr_spec
    values[LEARNING_RATE] = Value(LEARNING_RATE, None, ValueClass.INPUT)
    p_out = [f"{p}.updated" for p in trainable]
    m = [f"{p}.exp_avg" for p in trainable]
    v = [f"{p}.exp_avg_sq" for p in trainable]
    if kind == "AdamW":
        known["step"] = TensorSpec("int64", (1,))
        values["step"] = Value("step", None, ValueClass.OPTIMIZER_STATE)
        for name in m + v:
            values[name] = Value(name, None, ValueClass.OPTIMIZER_STATE)
        opt_inputs = [LEARNING_RATE, "step", *trainable, *grads, *m, *v]
        state_outputs = [x + ".updated" for x in m + v]
    else:
        opt_inputs = [LEARNING_RATE, *trainable, *grads]
        state_outputs = []
    attrs = _attrs(opt_node)
    attrs["num_params"] = len(trainable)
    node = Node(opt_node.name or opt_node.op_type, opt_node.op_type, opt_node.domain,
                opt_inputs, ["optimizer.updated_flag", *p_out, *state_outputs], attrs, "optimizer")
    values["optimizer.updated_flag"] = Value("optimizer.updated_flag", None, ValueClass.TEMPORARY)
    for name in p_out:
        values[name] = Value(name, None, ValueClass.PARAMETER, trainable=True)
    for name in state_outputs:
        values[name] = Value(name, None, ValueClass.OPTIMIZER_STATE)
    if kind == "AdamW":  # moments have their parameter's spec
        for p, mm, vv in zip(trainable, m, v):
            known[mm] = known[vv] = known[p]
    return node, state_outputs


def read_step(
    folder: Path | str, *, dims: dict[str, int] | None = None, batch: int | None = None
) -> StepGraph:
    """Join training_model.onnx and optimizer_model.onnx of `folder` into one StepGraph.

    The optimizer's sequence inputs are flattened per parameter; InPlaceAccumulatorV2 gets
    its optional second output (the updated buffer) so the optimizer reads gradients in SSA
    form. Shapes come from the graph inputs and our static shape rules.
    """
    from onnxplan.ir.shapes import infer_shapes  # the rules are large: import on use

    folder = Path(folder)
    dims = dict(dims or {})
    meta = read_metadata(folder, required=False)
    train = load_onnx(folder / TRAINING_MODEL)
    opt = load_onnx(folder / OPTIMIZER_MODEL)
    trainable, frozen = parameter_names(folder, meta)
    tg = train.graph
    loss = tg.output[0].name
    values, known, constants, step_inputs = _graph_inputs(tg, folder / TRAINING_MODEL, dims, batch, trainable, frozen)
    _check_checkpoint(folder, set(trainable) | set(frozen), known)
    nodes, updated_grad = _training_nodes(tg, folder / TRAINING_MODEL, loss, values)
    lr_spec = next((input_spec(vi, dims, batch) for vi in opt.graph.input if vi.name == LEARNING_RATE),
                   TensorSpec("float32", (1,)))
    opt_node, state_outputs = _optimizer_step(opt, folder, trainable, updated_grad, lr_spec, values, known)
    nodes.append(opt_node)
    opsets = {o.domain: o.version for o in train.opset_import}
    for o in opt.opset_import:
        opsets.setdefault(o.domain, o.version)
    specs, folded = infer_shapes(nodes, known, constants, opsets)
    for name, val in values.items():
        val.spec = specs.get(name)
    _check_total_bytes(values, folder)
    return StepGraph(
        name=meta.get("model", folder.name),
        nodes=nodes,
        values=values,
        inputs=step_inputs + [LEARNING_RATE],
        outputs=[loss, *(f"{p}.updated" for p in trainable), *state_outputs],
        initializers=constants,
        opsets=opsets,
        optimizer={"type": OPTIMIZER_OPS[opt_node.op_type], "attrs": opt_node.attrs, "params": trainable,
                   "grads": [updated_grad[p + ACC_SUFFIX] for p in trainable]},
        loss=loss,
        folded={k: v for k, v in folded.items() if k not in constants},
        source=dict(meta.get("forward") or {}),
    )
