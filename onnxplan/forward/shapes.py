"""Static input shapes for a forward model: dynamic axes from --batch / --dim, and re-batching
a model exported with a fixed batch, verified by strict ONNX shape inference."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import numpy as np
import onnx

from onnxplan.errors import DynamicDimError, ModelError
from onnxplan.forward._names import NameSource
from onnxplan.ir.onnx_files import SMALL_TENSOR

__all__ = ["StaticShapes", "fix_shapes"]


@dataclass
class StaticShapes:
    inputs: dict[str, tuple[int, ...]]
    output: tuple[int, ...]
    rebatched: tuple[int, int] | None  # (exported batch, new batch)
    values: dict[str, tuple[int, ...]]  # every value and initializer inference gave a static shape


def _dims(vi: onnx.ValueInfoProto) -> list:
    return list(vi.type.tensor_type.shape.dim)


def _set_shape(vi: onnx.ValueInfoProto, shape: tuple[int, ...]) -> None:
    dims = vi.type.tensor_type.shape.dim
    del dims[:]
    for v in shape:
        dims.add().dim_value = v


def _input_shape(vi, dims: Mapping[str, int], batch: int | None) -> tuple[int, ...]:
    shape = []
    for i, d in enumerate(_dims(vi)):
        if d.HasField("dim_value"):
            shape.append(d.dim_value)
        elif d.dim_param and d.dim_param in dims:
            shape.append(int(dims[d.dim_param]))
        elif i == 0 and batch is not None:
            shape.append(int(batch))
        else:
            label = d.dim_param or "?"
            raise DynamicDimError(f"'{vi.name}' has dynamic dimension {i} ({label}); "
                                  f"give --batch or --dim {label}=N")
    return tuple(shape)


def _fixed_batch(inputs: list[onnx.ValueInfoProto]) -> int | None:
    """The exported batch when every data input has a fixed leading dim (the first one's)."""
    firsts = []
    for vi in inputs:
        d = _dims(vi)
        if not d:
            continue
        if not d[0].HasField("dim_value"):
            return None
        firsts.append(d[0].dim_value)
    return firsts[0] if firsts else None


def _infer(model: onnx.ModelProto, strict: bool) -> onnx.ModelProto:
    """onnx's shape inference; a graph it refuses even when not strict (a node missing a required
    input, an op of a domain the model imports no opset for) is malformed: a ModelError (exit 2)
    with onnx's reason."""
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=strict, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        if strict:
            raise
        raise ModelError(f"malformed model: onnx shape inference refuses it ({_first_inference_error(str(exc))})") \
            from None


_FOLD_LIMIT = SMALL_TENSOR  # elements: shape arithmetic, never weights (read by load_onnx(weights=False))
_NO_FOLD = frozenset({"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike",
                      "Multinomial", "Bernoulli", "Dropout"})


def _eval_node(node: onnx.NodeProto, feeds: dict, opsets) -> list | None:
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for n, v in feeds.items()]
    outs = [helper.make_value_info(o, onnx.TypeProto()) for o in node.output if o]
    mini = helper.make_model(helper.make_graph([node], "fold", ins, outs), opset_imports=list(opsets))
    try:
        return cast(list, ReferenceEvaluator(mini).run(None, feeds))  # a list: no intermediate=True
    except Exception:  # noqa: BLE001 - anything it cannot evaluate stays a node
        return None


def fold_shape_subgraphs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with its shape arithmetic evaluated (Shape of static values, and small
    nodes whose inputs are all constant): what onnx shape inference's data propagation misses
    (Cast, Max, Mod... on shapes), so the copy's inferred shapes are static where the model's
    are. Only for checking shapes: the model ORT trains keeps its nodes."""
    import copy

    from onnx import numpy_helper

    model = copy.deepcopy(model)
    graph = model.graph
    # a tensor still on disk (load_onnx(weights=False)) is a weight: its shape is enough
    consts = {t.name: t for t in graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL}
    for _ in range(16):
        inferred = _infer(model, strict=False)
        static = {}
        for vi in (*inferred.graph.input, *inferred.graph.value_info):
            d = _dims(vi)
            if vi.type.tensor_type.HasField("shape") and all(x.HasField("dim_value") for x in d):
                static[vi.name] = [x.dim_value for x in d]
        kept, folded = [], False
        for node in graph.node:
            out = None
            if node.domain in ("", "ai.onnx") and node.op_type == "Shape" and node.input[0] in static:
                dims = np.array(static[node.input[0]], np.int64)
                start = next((a.i for a in node.attribute if a.name == "start"), 0)
                end = next((a.i for a in node.attribute if a.name == "end"), len(dims))
                out = [dims[start:end]]
            elif (node.domain in ("", "ai.onnx") and node.op_type not in _NO_FOLD
                  and not any(a.HasField("g") or a.graphs for a in node.attribute)
                  and all(not i or i in consts for i in node.input)
                  and sum(int(np.prod(consts[i].dims)) for i in node.input if i) <= _FOLD_LIMIT):
                feeds = {i: numpy_helper.to_array(consts[i]) for i in node.input if i}
                out = _eval_node(node, feeds, model.opset_import)
            if out is None or any(np.asarray(v).size > _FOLD_LIMIT for v in out):
                kept.append(node)
                continue
            for name, value in zip([o for o in node.output if o], out):
                t = numpy_helper.from_array(np.asarray(value), name)
                graph.initializer.append(t)
                consts[name] = t
            folded = True
        del graph.node[:]
        graph.node.extend(kept)
        if not folded:
            break
    return model


def _unshaped(inferred: onnx.ModelProto) -> list[str]:
    """Values (node outputs) whose shape inference left a dimension unknown."""
    known = {vi.name: vi for vi in (*inferred.graph.value_info, *inferred.graph.output)}
    missing = []
    for node in inferred.graph.node:
        for o in node.output:
            if not o:
                continue
            vi = known.get(o)
            if vi is None or not vi.type.tensor_type.HasField("shape") or any(
                    not d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim):
                missing.append(o)
    return missing


def _leading_dims(model: onnx.ModelProto) -> dict[str, int]:
    """Fixed leading dim of every value non-strict shape inference can give one."""
    try:
        inferred = _infer(model, strict=False)
    except Exception:  # noqa: BLE001 - best effort
        return {}
    out = {}
    for vi in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        d = _dims(vi)
        if d and d[0].HasField("dim_value"):
            out[vi.name] = d[0].dim_value
    return out


def _batch_following_reshapes(model: onnx.ModelProto, exported: int) -> int:
    """Rewrite, in place, Reshape shapes [B, ...] of inputs with leading dim B to [0, ...].

    Reshape keeps row-major order, so when the output's leading dim equals the input's, output
    row i holds exactly input row i's elements: copying the leading dim (0, allowzero=0) is
    the same reshape for any batch. Returns how many Reshape nodes were rewritten.
    """
    graph = model.graph
    leading = _leading_dims(model)
    inits = {t.name: t for t in graph.initializer}
    from onnx import numpy_helper


    names = NameSource(graph)
    count = 0
    for node in graph.node:
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        shape_t = inits.get(node.input[1])
        if (shape_t is None or shape_t.data_location == onnx.TensorProto.EXTERNAL
                or leading.get(node.input[0]) != exported):
            continue
        shape = numpy_helper.to_array(shape_t)
        if shape.ndim != 1 or not len(shape) or int(shape[0]) != exported or (shape == 0).any():
            continue
        # no 0 in the shape: allowzero changes nothing, so it can be dropped for the copy below
        keep = [a for a in node.attribute if a.name != "allowzero"]
        del node.attribute[:]
        node.attribute.extend(keep)
        shape = shape.copy()
        shape[0] = 0
        new = names.fresh(f"{node.input[1]}.batch_copy")
        graph.initializer.append(numpy_helper.from_array(shape, new))
        node.input[1] = new
        count += 1
    return count


_INFER_ERROR = re.compile(r"\(op_type:(\w+), node name: ([^)]*)\): \[\w+\] (.*?)(?= \(op_type:|$)")


def _first_inference_error(text: str) -> str:
    """The first of onnx's shape inference errors, as 'Op node N: message'."""
    text = " ".join(text.split())
    m = _INFER_ERROR.search(text)
    return f"{m.group(1)} node {m.group(2)}: {m.group(3).strip()}" if m else text


def fix_shapes(model: onnx.ModelProto, init_names: set[str], dims: Mapping[str, int],
               batch: int | None, name: str, notes: list[str]) -> StaticShapes:
    """Give every data input and the output a static shape, in place.

    A dynamic dim takes its value from `dims` (by name) or, leading, from `batch`. When every
    input's leading dim is fixed at B and `batch` differs, the model is re-batched: the inputs'
    leading dims become `batch` and strict shape inference must give every value a static
    shape and the output a leading dim of `batch`; otherwise ModelError (one line).
    """
    graph = model.graph
    data = [vi for vi in graph.input if vi.name not in init_names]
    exported = _fixed_batch(data)
    # (exported batch, new batch) when re-batching
    rebatch = (exported, batch) if exported is not None and batch is not None and batch != exported else None
    if rebatch:
        rewritten = _batch_following_reshapes(model, rebatch[0])
        if rewritten:
            notes.append(f"{rewritten} Reshape shape(s) [{exported}, ...] that keep the batch rows now copy "
                         f"the leading dim (0)")
    shapes = {}
    for vi in data:
        shape = _input_shape(vi, dims, batch)
        if rebatch and shape and shape[0] == exported:
            shape = (rebatch[1], *shape[1:])
        shapes[vi.name] = shape
        _set_shape(vi, shape)
    out = graph.output[0]
    try:  # the declared output shape, dynamic dims resolved as the inputs' (a fallback only)
        declared = _input_shape(out, dims, batch) if out.type.tensor_type.HasField("shape") else None
    except DynamicDimError:
        declared = None
    del graph.value_info[:]  # stale symbolic hints: inference recomputes them
    out.type.tensor_type.ClearField("shape")
    refuse = f"cannot re-batch {name} from its exported batch {exported} to --batch {batch}"
    folded = fold_shape_subgraphs(model)
    try:
        inferred = _infer(folded, strict=True)
    except Exception as exc:  # noqa: BLE001 - onnx raises InferenceError / ValidationError
        cause = _first_inference_error(str(exc))
        if rebatch:
            raise ModelError(f"{refuse}: shape inference fails ({cause})") from None
        inferred = _infer(folded, strict=False)
    if rebatch:
        missing = _unshaped(inferred)
        if missing:
            raise ModelError(f"{refuse}: shape inference leaves {len(missing)} value(s) without a static "
                             f"shape (first: {missing[0]})")
    got = inferred.graph.output[0].type.tensor_type
    got_dims = [d.dim_value if d.HasField("dim_value") else None for d in got.shape.dim] if got.HasField(
        "shape") else None
    if got_dims is None or None in got_dims:
        if rebatch or declared is None:
            raise ModelError(f"the output '{out.name}' of {name} gets no static shape; give every dynamic "
                             f"dimension with --batch / --dim NAME=N")
        shape = declared  # an op onnx cannot infer (a contrib op): trust the declaration
    else:
        shape = tuple(d for d in got_dims if d is not None)
    if rebatch:
        if not shape or shape[0] != batch:
            raise ModelError(f"{refuse}: the output's leading dimension stays {shape[0] if shape else '?'} "
                             f"(a constant in the graph bakes the batch in, e.g. a Reshape shape)")
        notes.append(f"re-batched from the exported batch {exported} to {batch} (every shape re-inferred)")
    _set_shape(out, tuple(shape))
    return StaticShapes(shapes, tuple(shape), rebatch, _static_values(inferred))


def _static_values(inferred: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    g = inferred.graph
    out = {t.name: tuple(int(d) for d in t.dims) for t in g.initializer}
    for vi in (*g.input, *g.value_info, *g.output):
        d = _dims(vi)
        if vi.type.tensor_type.HasField("shape") and all(x.HasField("dim_value") for x in d):
            out[vi.name] = tuple(x.dim_value for x in d)
    return out
