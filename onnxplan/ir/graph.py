"""The step graph: one training step (forward, backward, accumulation, optimizer) as one IR."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from onnxplan.ir.tensor import TensorSpec

__all__ = ["PERSISTENT_CLASSES", "Node", "StepGraph", "Value", "ValueClass", "original_name", "recompute_suffix",
           "recomputed_from", "swap_in_suffix"]


# The names of copies, written and read here only: a recomputed node or value is `NAME@rcK` (its
# K-th recomputation), a swapped-in value `NAME@inK` (the swap-in of segment K) or `NAME@start`
# (the first segment of an evicted persistent value).
_COPY_SUFFIX = re.compile(r"@(?:rc\d+|in\d+|start)$")
_RECOMPUTE_SUFFIX = re.compile(r"@rc\d+$")


def recompute_suffix(k: int) -> str:
    """The suffix of the k-th recomputed copy of a node and of its outputs."""
    return f"@rc{k}"


def swap_in_suffix(segment: str) -> str:
    """The suffix of a value's copy made by the swap-in of `segment` (a number, or "start")."""
    return "@start" if segment == "start" else f"@in{segment}"


def recomputed_from(name: str) -> str | None:
    """The node (or value) that `name` is a recomputed copy of (`NAME@rcK`), or None."""
    m = _RECOMPUTE_SUFFIX.search(name)
    return None if m is None else name[: m.start()]


def original_name(name: str) -> str:
    """The node or value a copy stands for: swap-ins (`NAME@inK`, `NAME@start`) and recomputed
    nodes and values (`NAME@rcK`) carry the original name before those suffixes (a swap-in of
    a recomputed value carries both). Only these suffixes are copies: an '@' of the model's own
    names (`layer@2`) stays part of the name."""
    while (m := _COPY_SUFFIX.search(name)) is not None:
        name = name[: m.start()]
    return name


class ValueClass(str, Enum):  # noqa: UP042 - StrEnum changes str() of a member (in messages and files)
    """What a value is in a training step (NNTrainer's temporal relations, made explicit)."""

    PARAMETER = "parameter"  # weights, trainable or frozen; persist across steps
    OPTIMIZER_STATE = "optimizer_state"  # moments, step counter; persist across steps
    CONSTANT = "constant"  # small initializers of the graphs (axes, shapes, scalars)
    INPUT = "input"  # data and labels fed each step, learning rate
    GRADIENT = "gradient"  # gradient of the loss w.r.t. a parameter (incl. accumulation)
    ACTIVATION = "activation"  # forward values (some kept for the backward pass)
    TEMPORARY = "temporary"  # backward intermediates, flags, scratch


PERSISTENT_CLASSES = frozenset(
    {ValueClass.PARAMETER, ValueClass.OPTIMIZER_STATE, ValueClass.CONSTANT}
)


@dataclass
class Value:
    """One tensor of the step: its static spec and class."""

    name: str
    spec: TensorSpec | None
    vclass: ValueClass
    trainable: bool = False  # parameters only

    @property
    def nbytes(self) -> int:
        return self.spec.nbytes if self.spec is not None else 0

    @property
    def known_spec(self) -> TensorSpec:
        """The spec, where the code needs one (a planned step's values all have one)."""
        if self.spec is None:
            raise RuntimeError(f"value {self.name!r} has no static shape and dtype")
        return self.spec

    @property
    def persistent(self) -> bool:
        return self.vclass in PERSISTENT_CLASSES


@dataclass
class Node:
    """One op. `inputs` may hold "" for an omitted optional input."""

    name: str
    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    phase: str = "forward"  # forward | backward | optimizer
    # output -> (input it shares a buffer with, "rv" read-only view | "mv" modify view)
    aliases: dict[str, tuple[str, str]] = field(default_factory=dict)
    # control dependencies: names of nodes that must run before this one
    after: list[str] = field(default_factory=list)

    def copy(self) -> Node:
        return Node(self.name, self.op_type, self.domain, list(self.inputs), list(self.outputs),
                    dict(self.attrs), self.phase, dict(self.aliases), list(self.after))

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op_type)

    def __str__(self) -> str:
        op = f"{self.domain}.{self.op_type}" if self.domain else self.op_type
        return f"{self.name} = {op}({', '.join(self.inputs)}) -> {', '.join(self.outputs)}"


@dataclass
class StepGraph:
    """One training step over values with static shapes.

    `nodes` are in a valid topological order (the file order of the training model,
    then the optimizer). `initializers` holds the numeric contents of parameters,
    optimizer state and constants. `optimizer` describes the update rule:
    {"type": "AdamW" | "SGD", "attrs": {...}, "params": [...], "grads": [...]}.
    """

    name: str
    nodes: list[Node]
    values: dict[str, Value]
    inputs: list[str]
    outputs: list[str]
    initializers: dict[str, np.ndarray] = field(default_factory=dict)
    opsets: dict[str, int] = field(default_factory=dict)
    optimizer: dict[str, Any] = field(default_factory=dict)
    loss: str = ""
    # values whose contents are known statically (folded shape subgraphs), by name
    folded: dict[str, np.ndarray] = field(default_factory=dict)
    # how a forward .onnx was made trainable (onnxplan.forward's report, onnxplan.json "forward")
    source: dict[str, Any] = field(default_factory=dict)
    # what the passes that made this graph ensure ("realized", "inplace", ...: onnxplan.passes);
    # a pipeline's requirements are checked against it (not part of the fingerprint)
    ensured: tuple[str, ...] = ()

    # ---- queries -------------------------------------------------------
    def producers(self) -> dict[str, Node]:
        return {out: n for n in self.nodes for out in n.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {name: [] for name in self.values}
        for n in self.nodes:
            for inp in n.inputs:
                if inp:
                    users.setdefault(inp, []).append(n)
        return users

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def values_of(self, vclass: ValueClass) -> list[Value]:
        return [v for v in self.values.values() if v.vclass == vclass]

    def bytes_by_class(self) -> dict[str, int]:
        """Bytes per class; the optimizer's updated copies of persistent state are in place,
        so they are not counted a second time."""
        totals = {c.value: 0 for c in ValueClass}
        produced = self.producers()
        for v in self.values.values():
            if not (v.persistent and v.name in produced):
                totals[v.vclass.value] += v.nbytes
        return totals

    def op_histogram(self) -> Counter:
        return Counter((f"{n.domain}.{n.op_type}" if n.domain else n.op_type) for n in self.nodes)

    def unshaped_values(self) -> list[str]:
        return [v.name for v in self.values.values() if v.spec is None]

    def fingerprint(self) -> str:
        """sha256 of the graph's canonical form: nodes in file order (name, op, inputs,
        outputs, attributes), every value's class, dtype and shape, the step's inputs and
        outputs, opsets, optimizer settings, loss and constant tensors. A plan records it, so
        a plan made for another model, batch, --dim, optimizer or loss is refused."""
        import hashlib

        h = hashlib.sha256()

        def put(*parts: Any) -> None:
            for p in parts:
                if isinstance(p, np.ndarray):
                    arr = np.ascontiguousarray(p)
                    h.update(f"<{arr.dtype.str}{arr.shape}>".encode())
                    h.update(arr.tobytes())
                elif isinstance(p, (bytes, bytearray)):
                    h.update(b"b" + bytes(p))
                else:
                    h.update(repr(p).encode("utf-8", "backslashreplace"))
                h.update(b"\x00")

        for n in self.nodes:
            put("node", n.name, n.op_type, n.domain, tuple(n.inputs), tuple(n.outputs), n.phase)
            for k in sorted(n.attrs):
                put(k, n.attrs[k])
        for name in sorted(self.values):
            v = self.values[name]
            put("value", name, v.vclass.value, v.trainable,
                None if v.spec is None else (v.spec.dtype, v.spec.shape))
        put("io", tuple(self.inputs), tuple(self.outputs), sorted(self.opsets.items()),
            sorted((k, repr(v)) for k, v in self.optimizer.items()), self.loss)
        for name in sorted(self.initializers):
            put("init", name, np.asarray(self.initializers[name]))
        return h.hexdigest()

    @property
    def persistent_bytes(self) -> int:
        """Bytes of the state that persists across steps (parameters, optimizer state,
        constants), counted once: updated copies written by the optimizer are in place."""
        produced = self.producers()
        return sum(v.nbytes for v in self.values.values() if v.persistent and v.name not in produced)

    def copy(self) -> StepGraph:
        """A copy whose node list, nodes and values can be rewritten independently."""
        import copy

        def value_copy(v: Value) -> Value:  # the plain constructor is much faster than copy.copy
            return Value(v.name, v.spec, v.vclass, v.trainable) if type(v) is Value else copy.copy(v)

        return StepGraph(
            name=self.name,
            nodes=[n.copy() for n in self.nodes],
            values={k: value_copy(v) for k, v in self.values.items()},
            inputs=list(self.inputs),
            outputs=list(self.outputs),
            initializers=dict(self.initializers),
            opsets=dict(self.opsets),
            optimizer=dict(self.optimizer),
            loss=self.loss,
            folded=dict(self.folded),
            source=dict(self.source),
            ensured=self.ensured,
        )
