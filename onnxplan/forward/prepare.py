"""A user's forward .onnx made into what the zoo builders produce, with a report of each step.

Order: warn when a dynamo export's optimizer changed the parameters (merged, folded, split:
exported.py) -> check ops and inline local functions (normalize) -> decompose ops without an ORT
gradient -> convert the opset to 17 and IR to 9 -> cast integer ArgMax/ArgMin inputs that
provably fit to int32 -> complete optional outputs -> static
shapes (dynamic axes, re-batching) -> explicit pads for Conv / AveragePool auto_pad -> SplitToSequence
read by SequenceAt rewritten to Split -> choose trained / frozen parameters and refuse an op
without a gradient on their path. Everything is deterministic, so the artifact cache key
(the prepared model and this report, with FORWARD_PREP_VERSION) names the result.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import onnx

from onnxplan.forward.complete import complete_outputs
from onnxplan.forward.decompose import decompose, value_types
from onnxplan.forward.exported import optimizer_warning, torchscript_warning
from onnxplan.forward.int_args import cast_integer_args
from onnxplan.forward.normalize import convert_opset, normalize
from onnxplan.forward.pads import explicit_auto_pads
from onnxplan.forward.select import select_parameters, torch_kinds
from onnxplan.forward.sequences import split_sequences
from onnxplan.forward.shapes import fix_shapes
from onnxplan.forward.spec import ForwardModel, InputSpec, labels_for_output

__all__ = ["FORWARD_PREP_VERSION", "prepare_forward"]

# bump when any rewrite here changes: old cache entries then no longer match
FORWARD_PREP_VERSION = 3


# ops that pass an integer input's values on unchanged (GPT-2 reshapes its ids before the lookup)
_VALUE_PRESERVING = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast", "Expand"})


def _int_input_high(model: onnx.ModelProto, name: str) -> int:
    """Upper bound for an integer input: the table size if it indexes a Gather (directly or through
    ops that keep its values: _VALUE_PRESERVING), else 1."""
    tables = {t.name: t.dims for t in model.graph.initializer}
    names, seen = [name], set()
    while names:
        value = names.pop()
        if value in seen:
            continue
        seen.add(value)
        for node in model.graph.node:
            if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == value:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                table = tables.get(node.input[0])
                if table:
                    return int(table[axis])
            elif node.op_type in _VALUE_PRESERVING and node.input and node.input[0] == value:
                names.extend(o for o in node.output if o)
    return 1


def prepare_forward(model: onnx.ModelProto, name: str, loss: str, *, dims: Mapping[str, int] | None = None,
                    batch: int | None = None, train: list[str] | None = None,
                    freeze: list[str] | None = None) -> ForwardModel:
    """The ForwardModel for a user's forward model (not modified); its `prep` says what was done."""
    model = copy.deepcopy(model)
    kinds = torch_kinds(model.graph)  # value_info is rebuilt below
    notes: list[str] = []
    warning = optimizer_warning(model) or torchscript_warning(model)  # before the metadata is dropped
    if warning:
        notes.append(warning)
    synthetic: set[str] = set()
    model = normalize(model, notes)
    decompose(model, notes, synthetic)
    model = convert_opset(model, notes)
    cast_integer_args(model, notes)
    complete_outputs(model, notes, synthetic)
    init_names = {t.name for t in model.graph.initializer}
    shapes = fix_shapes(model, init_names, dict(dims or {}), batch, name, notes)
    explicit_auto_pads(model, shapes.values, notes)
    split_sequences(model, shapes.values, notes)
    types = value_types(model)
    sel = select_parameters(model, types, train, freeze, synthetic, kinds)
    derived = [n for n in sel.trained if kinds and n not in kinds]
    if derived:
        notes.append(f"trained {len(derived)} unannotated initializer(s) the exporter derived from "
                     f"parameters "
                     f"({', '.join(derived[:3])}{', ...' if len(derived) > 3 else ''}); export with "
                     f"optimize=False to keep the parameter names")
    specs = []
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        shape = shapes.inputs[vi.name]
        if dtype.kind in "iu":
            specs.append(InputSpec(vi.name, dtype.name, shape, 0, _int_input_high(model, vi.name)))
        else:
            specs.append(InputSpec(vi.name, dtype.name, shape, -1.0, 1.0))
    prep = {
        "version": FORWARD_PREP_VERSION,
        "rewrites": notes,
        "trained": sel.trained,
        "frozen": sel.frozen,
        "constants": len(sel.constants),
        "rebatched": list(shapes.rebatched) if shapes.rebatched else None,
    }
    return ForwardModel(name, model, sel.trained, sel.frozen, specs, labels_for_output(shapes.output, loss, specs),
                        loss, prep=prep)
