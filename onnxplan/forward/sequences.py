"""SplitToSequence read only by SequenceAt at constant positions, rewritten to Split.

PyTorch's dynamo exporter without its optimizer (`optimize=False`, what its own warning advises
to keep the parameters as exported) emits `tensor.split(...)` followed by indexing as a
SplitToSequence whose sequence is read by SequenceAt nodes (GPT-2's attention: q, k, v =
c_attn(x).split(d, dim=2)). A sequence is no tensor: nothing in a training step plans or runs
it. The same values come from one Split (its piece sizes: the split input's, or the static
axis length cut into chunks of the scalar split, the last one shorter, or pieces of one element
squeezed when split is absent and keepdims=0) with each SequenceAt an Identity of its piece.
A sequence read by anything else, or a graph output, is left as it is (and refused later with
the op named).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxplan.forward._names import NameSource

__all__ = ["split_sequences"]

_DEFAULT = ("", "ai.onnx")


def _constants(graph: onnx.GraphProto, wanted: set[str]) -> dict[str, np.ndarray]:
    """Values of the `wanted` inline initializers and Constant nodes (tensor, value_int,
    value_ints): only those (a model's weights are never read here), and only those that read
    as what they say (a malformed one is left to the checks that name it)."""
    out: dict[str, np.ndarray] = {}
    for t in graph.initializer:
        if t.name in wanted and t.data_location != onnx.TensorProto.EXTERNAL:
            try:
                out[t.name] = numpy_helper.to_array(t)
            except ValueError:
                continue
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in _DEFAULT and node.attribute and node.output[0] in wanted:
            value = helper.get_attribute_value(node.attribute[0])
            if isinstance(value, onnx.TensorProto):
                try:
                    out[node.output[0]] = numpy_helper.to_array(value)
                except ValueError:
                    continue
            elif node.attribute[0].name in ("value_int", "value_ints"):
                out[node.output[0]] = np.asarray(value, np.int64)
    return out


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), default)


def _pieces(node: onnx.NodeProto, consts: Mapping[str, np.ndarray],
            shapes: Mapping[str, tuple[int, ...]]) -> tuple[list[int], int, bool] | None:
    """(piece sizes, axis, squeeze) of a SplitToSequence, or None when they are not known statically."""
    shape = shapes.get(node.input[0])
    if shape is None:
        return None
    axis = _attr(node, "axis", 0)
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis < len(shape):
        return None
    length = shape[axis]
    split = node.input[1] if len(node.input) > 1 else ""
    if not split:
        return [1] * length, axis, _attr(node, "keepdims", 1) == 0
    sizes = consts.get(split)
    if sizes is None or sizes.ndim > 1:
        return None
    if sizes.ndim == 1:
        return [int(s) for s in sizes], axis, False
    chunk = int(sizes)
    if chunk <= 0:
        return None
    return [chunk] * (length // chunk) + ([length % chunk] if length % chunk else []), axis, False


def _positions(readers: list[onnx.NodeProto], consts: Mapping[str, np.ndarray], count: int) -> list[int] | None:
    """The piece each SequenceAt reads (a constant, possibly negative), or None."""
    found = []
    for node in readers:
        position = consts.get(node.input[1]) if len(node.input) > 1 else None
        if node.op_type != "SequenceAt" or node.domain not in _DEFAULT or position is None or position.ndim:
            return None
        k = int(position) + (count if int(position) < 0 else 0)
        if not 0 <= k < count:
            return None
        found.append(k)
    return found


def split_sequences(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]], notes: list[str]) -> None:
    """Rewrite, in place, every SplitToSequence whose sequence only SequenceAt nodes read at
    constant positions into a Split (`shapes`: the static shapes of values, forward.shapes)."""
    graph = model.graph
    nodes = list(graph.node)
    wanted = {name for n in nodes if n.domain in _DEFAULT and n.op_type in ("SplitToSequence", "SequenceAt")
              for name in n.input[1:2]}
    if not any(n.op_type == "SplitToSequence" for n in nodes):
        return
    consts = _constants(graph, wanted)
    readers: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        for name in node.input:
            readers[name].append(i)
    outputs = {o.name for o in graph.output}
    names = NameSource(graph)
    rewritten = 0
    for i, node in enumerate(list(nodes)):
        if node.op_type != "SplitToSequence" or node.domain not in _DEFAULT or node.output[0] in outputs:
            continue
        found = _pieces(node, consts, shapes)
        users = readers.get(node.output[0], [])
        positions = _positions([nodes[j] for j in users], consts, len(found[0])) if found and users else None
        if found is None or positions is None:
            continue
        sizes, axis, squeeze = found
        split = names.fresh(f"{node.output[0]}_sizes")
        graph.initializer.append(numpy_helper.from_array(np.asarray(sizes, np.int64), split))
        pieces = [names.fresh(f"{node.output[0]}_{k}") for k in range(len(sizes))]
        nodes[i] = helper.make_node("Split", [node.input[0], split], pieces, name=node.name, axis=axis)
        axes = names.fresh(f"{node.output[0]}_axis")
        if squeeze:
            graph.initializer.append(numpy_helper.from_array(np.asarray([axis], np.int64), axes))
        for j, k in zip(users, positions):
            user = nodes[j]
            nodes[j] = (helper.make_node("Squeeze", [pieces[k], axes], list(user.output), name=user.name)
                        if squeeze else helper.make_node("Identity", [pieces[k]], list(user.output), name=user.name))
        rewritten += 1
    if rewritten:
        del graph.node[:]
        graph.node.extend(nodes)
        notes.append(f"rewrote {rewritten} SplitToSequence node(s) read by SequenceAt to Split")
