"""What a dynamo export's optimizer did to the parameters, from the metadata the export keeps.

torch.onnx.export(dynamo=True) runs onnxscript's optimizer by default (optimize=True), and
three of its rewrites make the file a different model to train than the PyTorch one:
- DeduplicateInitializersPass merges initializers of equal content (up to 1024 elements): every
  zero bias and every LayerNorm weight of ones of a freshly initialised model becomes one
  initializer, and ORT trains ONE shared parameter (hf-bert: 15 biases in one);
- constant folding treats parameters as constants: `1 + p` becomes a new initializer, a zero
  bias can vanish from a Gemm (never trained);
- folding Transpose(weight) makes a new initializer: a tied weight used raw elsewhere (embedding
  and LM head) is then trained as two.
None of this can be undone from the file: which uses were which parameter survives only as
text (each node's `pkg.torch.onnx.fx_node` names the FX placeholders it read, %p_<name> for a
parameter, %b_<name> for a buffer; each initializer's `pkg.torch.onnx.original_node_name` is
its own placeholder), and a folded or removed parameter has no initializer left to copy. So the
forward path does not try to repair it: it says so in one line naming the cases and the fix,
re-exporting with optimize=False (which keeps every parameter and every tie).

The TorchScript exporter (dynamo=False) does the same with its defaults (eval mode, constant
folding on), with no metadata to say what was what, but with two marks of its own: parameters of
equal value merged into one become Identity copies of the one kept (GPT-2's LayerNorm biases),
and what folding computed from parameters (a transposed LM head, BatchNorm folded into a
convolution's weights) are float initializers named `onnx::<Op>_<N>`, trained as parameters of
their own. An export in training mode without folding has neither (the corpus's exports).
"""

from __future__ import annotations

import ast
import re

import onnx

__all__ = ["FOLDED_FROM", "FX_NODE", "ORIGINAL_NAME", "optimizer_warning", "torchscript_warning"]

FX_NODE = "pkg.torch.onnx.fx_node"
ORIGINAL_NAME = "pkg.torch.onnx.original_node_name"
FOLDED_FROM = "pkg.onnxscript.optimizer.folded_from"
_PLACEHOLDER = re.compile(r"%([pb]_\w+)")


def _value_props(graph: onnx.GraphProto, key: str) -> dict[str, str]:
    return {vi.name: p.value for vi in (*graph.value_info, *graph.input) for p in vi.metadata_props
            if p.key == key}


def _placeholder(fqn: str) -> str:
    return "p_" + fqn.replace(".", "_")


def _shown(items: list[str], limit: int = 3) -> str:
    return ", ".join(items[:limit]) + (f", ... ({len(items)})" if len(items) > limit else "")


def optimizer_warning(model: onnx.ModelProto) -> str | None:
    """One line when the export's optimizer merged, folded away or split parameters, else None.
    Needs a dynamo export's metadata (nothing is said of a file without it)."""
    graph = model.graph
    own = _value_props(graph, ORIGINAL_NAME)  # initializer -> its placeholder
    inits = {t.name for t in graph.initializer}
    own = {n: p for n, p in own.items() if n in inits}
    if not own:
        return None
    present = set(own.values())
    sources: dict[str, list[str]] = {}  # folded initializer -> the initializers it was computed from
    for name, text in _value_props(graph, FOLDED_FROM).items():
        try:
            sources[name] = [s for s in ast.literal_eval(text) if isinstance(s, str)]
        except (ValueError, SyntaxError):
            continue
    derived = {_placeholder(s) for ss in sources.values() for s in ss}  # folded, still trained
    split = {f: [s for s in ss if s in own] for f, ss in sources.items()}
    split = {f: ss for f, ss in split.items() if ss}  # a parameter still trained, and a copy computed from it
    merged: dict[str, set[str]] = {}  # initializer -> placeholders of other parameters it stands for
    mentioned: set[str] = set()
    for node in graph.node:
        fx = next((p.value for p in node.metadata_props if p.key == FX_NODE), "")
        read = set(_PLACEHOLDER.findall(fx.split("args =", 1)[-1]))
        mentioned |= read
        for i in node.input:
            if i in own and read and own[i] not in read:
                others = read - present - derived
                leaf = {p for p in others if p.endswith("_" + i.rsplit(".", 1)[-1])}  # bias for a bias
                merged.setdefault(i, set()).update(leaf or others)
    lost = sorted(mentioned - present - derived - {p for ps in merged.values() for p in ps})
    parts = []
    if merged:
        first = min(merged)
        also = sorted(p[2:] for p in merged[first])
        parts.append(f"{len(merged)} initializer(s) of equal value merged, each now trains as one parameter for "
                     f"several ('{first}' also for {_shown(also) or 'other modules'})")
    if lost:
        parts.append(f"{len(lost)} parameter(s) folded into constants or removed ({_shown([p[2:] for p in lost])})")
    if split:
        first = min(split)
        parts.append(f"{len(split)} initializer(s) computed from a parameter that is also trained, so that "
                     f"parameter trains as two ('{first}' from {_shown(split[first])})")
    if not parts:
        return None
    return ("warning: the dynamo exporter's optimizer (torch.onnx.export optimize=True, the default) changed "
            "the parameters, so this is not the PyTorch model to train: " + "; ".join(parts)
            + "; re-export with torch.onnx.export(..., dynamo=True, optimize=False)")


_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def torchscript_warning(model: onnx.ModelProto) -> str | None:
    """One line when a TorchScript export with its defaults (eval mode, constant folding) merged
    parameters or folded them into new ones, else None (and None for a dynamo export:
    optimizer_warning reads its metadata)."""
    graph = model.graph
    if model.producer_name != "pytorch" or _value_props(graph, ORIGINAL_NAME):
        return None
    floats = {t.name for t in graph.initializer if t.data_type in _FLOAT_TYPES}
    merged = sorted((n.output[0], n.input[0]) for n in graph.node
                    if n.op_type == "Identity" and n.input and n.input[0] in floats and n.output and n.output[0])
    folded = sorted(name for name in floats if name.startswith("onnx::"))
    parts = []
    if merged:
        copy, kept = merged[0]
        parts.append(f"{len(merged)} parameter(s) of equal value merged into others, each now trained as the "
                     f"one it copies ('{copy}' is '{kept}')")
    if folded:
        parts.append(f"{len(folded)} initializer(s) computed from parameters at export time (a folded "
                     f"Transpose, BatchNorm folded into a convolution: {_shown(folded)}) train as parameters "
                     "of their own")
    if not parts:
        return None
    return ("warning: this TorchScript export (torch.onnx.export dynamo=False with its defaults: eval mode, "
            "constant folding) changed the parameters, so this is not the PyTorch model to train: "
            + "; ".join(parts) + "; re-export with torch.onnx.export(..., dynamo=False, "
            "training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)")
