"""The kernel registry: per (domain, op_type, opset range) the implementation, which inputs
it may overwrite, whether it updates persistent state, the scratch bytes it needs, and
optionally a bind rule that specialises the kernel to one node's arrays once, when the
executor binds (views, parsed attributes, the chosen code path), so a step only computes."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnxplan import settings
from onnxplan.errors import UnsupportedOpError
from onnxplan.ir.graph import Node
from onnxplan.ir.tensor import TensorSpec

__all__ = [
    "DECLS",
    "BindRule",
    "KernelContext",
    "KernelDecl",
    "KernelFn",
    "PAIRABLE",
    "Prepare",
    "bind_prepared",
    "bound_kernel",
    "declare",
    "find_decl",
    "find_kernel",
    "is_random",
    "kernel",
    "may_overwrite",
    "prepared_call",
    "random_ops",
    "scratch_bytes",
    "updates_state",
]

# The attribute a bound kernel carries when the executor may run it together with another node of
# its kind (kernels.matmul.ProductWork: two products as one GEMM-pool job; executor/interop.py).
PAIRABLE = "pairable"

# output index -> input indices the kernel can write that output into (in place)
Overwrites = Mapping[int, tuple[int, ...]]
# (node, input specs, output specs) -> bytes of scratch the kernel needs at its EO
ScratchRule = Callable[[Node, list, list], int]


@dataclass(slots=True)
class KernelContext:
    """What a kernel gets besides its input and output arrays."""

    xp: Any  # the array module: numpy, or cupy on a GPU
    node: Node
    in_specs: list[TensorSpec | None]
    out_specs: list[TensorSpec | None]
    scratch: Any = None  # 1-D uint8 array: the node's planned scratch (None when it needs none)
    random: Any = None  # random ops draw here (onnxplan.kernels.random.Randomness; None: a seeded default)

    @property
    def attrs(self) -> dict[str, Any]:
        return self.node.attrs

    def scratch_array(self, offset: int, shape, dtype) -> Any:
        """A typed view of the planned scratch at byte `offset` (the kernel's own layout)."""
        dtype = np.dtype(dtype)
        n = math.prod(int(d) for d in shape) * dtype.itemsize  # np.prod costs ~10 us a call
        if self.scratch is None or offset + n > self.scratch.size:
            raise RuntimeError(f"{self.node.name}: scratch request {offset}+{n} beyond the planned "
                               f"{0 if self.scratch is None else self.scratch.size} bytes")
        return self.scratch[offset:offset + n].view(dtype).reshape(shape)


# fn(ctx, inputs, outputs): writes every output array in place (outputs may alias inputs
# that the kernel declared it may overwrite); inputs[i] is None for an omitted optional input
KernelFn = Callable[[KernelContext, list, list], None]
# bind(ctx, inputs, outputs) -> a KernelFn for exactly these arrays, or None (the plain fn serves).
# Called once per node when the executor binds; the arrays' memory is fixed from then on, their
# values are not (read them when called). It must compute the same bits as the plain fn.
BindRule = Callable[[KernelContext, list, list], "KernelFn | None"]
# prepare(ctx, inputs, outputs, bound) -> a KernelFn for exactly these arrays: a kernel written
# once. Its plain fn prepares and calls at once (prepared_call); its bind rule (bind_prepared)
# prepares once, on numpy, with bound=True, which may pick torch's out= passes (the same bits).
Prepare = Callable[[KernelContext, list, list, bool], KernelFn]


def call_step(call: Callable[[], Any] | None) -> KernelFn | None:
    """A bound node's step running `call` (its arrays bound already: the step's arguments are
    ignored); None for None."""
    return None if call is None else lambda ctx, inputs, outputs: call()


def prepared_call(prepare: Prepare, ctx: KernelContext, inputs: list, outputs: list) -> None:
    """The plain kernel of `prepare`: prepared for this call alone, then run."""
    prepare(ctx, inputs, outputs, False)(ctx, inputs, outputs)


def bind_prepared(prepare: Prepare) -> BindRule:
    """The bind rule of `prepare`: prepared once for the node's arrays (numpy only; None elsewhere:
    the plain fn serves)."""

    def bind(ctx: KernelContext, inputs: list, outputs: list) -> KernelFn | None:
        return prepare(ctx, inputs, outputs, True) if ctx.xp is np else None

    return bind


@dataclass
class KernelDecl:
    """One kernel: its op, opset range, implementation and memory behaviour."""

    domain: str
    op_type: str
    since: int = 1
    until: int | None = None
    overwrites: Overwrites | Callable[[Node], Overwrites] = field(default_factory=dict)
    updates_state: bool = False  # the overwrites update persistent state in place
    # the op draws at random: a second run of the node would not reproduce the first (so it is
    # never recomputed), and verification feeds it what ONNX Runtime drew
    random: bool = False
    draw_output: int | None = None  # random ops: the output holding what was drawn (Dropout: its mask)
    fn: KernelFn | None = None
    scratch: ScratchRule | None = None
    bind: BindRule | None = None

    def covers(self, version: int | None) -> bool:
        return version is None or (self.since <= version and (self.until is None or version <= self.until))


DECLS: dict[tuple[str, str], list[KernelDecl]] = {}
_LOADED = False


def declare(op_type: str, domain: str = "", *, since: int = 1, until: int | None = None,
            overwrites: Overwrites | Callable[[Node], Overwrites] | None = None,
            updates_state: bool = False, random: bool = False, draw_output: int | None = None,
            fn: KernelFn | None = None, scratch: ScratchRule | None = None,
            bind: BindRule | None = None) -> KernelDecl:
    """Register a kernel (or, without fn, only its memory and random behaviour)."""
    if random and draw_output is None:
        raise ValueError(f"random op {op_type}: declare the output that holds the draw")
    for d in DECLS.get((domain, op_type), []):
        if d.since == since and d.until == until:  # one declaration per op and range
            d.overwrites = overwrites if overwrites is not None else d.overwrites
            d.updates_state = d.updates_state or updates_state
            d.random = d.random or random
            d.draw_output = draw_output if draw_output is not None else d.draw_output
            d.fn = fn or d.fn
            d.scratch = scratch or d.scratch
            d.bind = bind or d.bind
            return d
    decl = KernelDecl(domain, op_type, since, until, overwrites or {}, updates_state, random, draw_output,
                      fn, scratch, bind)
    DECLS.setdefault((domain, op_type), []).append(decl)
    return decl


def kernel(op_type: str, domain: str = "", *, since: int = 1, until: int | None = None,
           overwrites: Overwrites | Callable[[Node], Overwrites] | None = None,
           updates_state: bool = False, random: bool = False, draw_output: int | None = None,
           scratch: ScratchRule | None = None, bind: BindRule | None = None) -> Callable[[KernelFn], KernelFn]:
    """Decorator: `@kernel("Relu", overwrites={0: (0,)})` above fn(ctx, inputs, outputs)."""

    def deco(fn: KernelFn) -> KernelFn:
        declare(op_type, domain, since=since, until=until, overwrites=overwrites,
                updates_state=updates_state, random=random, draw_output=draw_output, fn=fn,
                scratch=scratch, bind=bind)
        return fn

    return deco


# The kernel modules, listed: each declares its kernels when imported (_load_all, on first lookup).
KERNEL_MODULES = ("batch_norm", "conv", "conv_grad", "conv_grad_input", "conv_transpose", "elementwise",
                  "elementwise_more", "indexing", "matmul", "norm", "optimizer", "pool", "random", "reduce", "resize",
                  "softmax_loss", "split_chunks", "tensor_ops")


def _load_all() -> None:
    """Import every module of KERNEL_MODULES once, so each declares its kernels."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for name in KERNEL_MODULES:
        importlib.import_module(f"onnxplan.kernels.{name}")


def find_decl(domain: str, op_type: str, version: int | None = None) -> KernelDecl | None:
    _load_all()
    domain = "" if domain == "ai.onnx" else domain
    for decl in DECLS.get((domain, op_type), []):
        if decl.covers(version):
            return decl
    return None


def find_kernel(node: Node, version: int | None = None) -> KernelDecl:
    """The implemented kernel of a node, or UnsupportedOpError."""
    decl = find_decl(node.domain, node.op_type, version)
    if decl is None or decl.fn is None:
        op = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
        raise UnsupportedOpError(f"no kernel for op {op} (node '{node.name}')")
    return decl


def bound_kernel(decl: KernelDecl, ctx: KernelContext, inputs: list, outputs: list) -> KernelFn:
    """The kernel to call for one node on these very `inputs`/`outputs` lists: the bind rule's
    specialisation (made now, once) when it gives one, else the plain fn. The specialisation
    runs only when called with the same two list objects; any other arrays (a verification
    hook re-running the kernel on |inputs|) go to the plain fn."""
    plain = decl.fn
    if plain is None:  # find_kernel gives only declarations with a kernel
        raise RuntimeError(f"{decl.op_type}: a declaration without a kernel cannot be bound")
    fast = None
    # ONNXPLAN_BIND_KERNELS=0 (onnxplan.settings): every node calls its plain fn (the benchmark's "before")
    if decl.bind is not None and settings.current().bind_kernels:
        try:
            fast = decl.bind(ctx, inputs, outputs)
        except Exception:  # noqa: BLE001 - a node the rule cannot take: the plain fn reports it when called
            fast = None
    if fast is None:
        return plain

    def run(ctx_, inputs_, outputs_):
        if inputs_ is inputs and outputs_ is outputs:
            return fast(ctx_, inputs_, outputs_)
        return plain(ctx_, inputs_, outputs_)

    run.__name__ = run.__qualname__ = f"bound_{getattr(plain, '__name__', 'kernel')}"
    if hasattr(fast, PAIRABLE):
        setattr(run, PAIRABLE, getattr(fast, PAIRABLE))
    return run


def may_overwrite(node: Node, version: int | None = None) -> Overwrites:
    """Output index -> input indices the node's kernel may write that output into."""
    decl = find_decl(node.domain, node.op_type, version)
    if decl is None:
        return {}
    ow = decl.overwrites
    return _plan_time(node, ow, node) if callable(ow) else ow


def updates_state(node: Node, version: int | None = None) -> bool:
    """True when the node's in-place outputs are persistent state updated in place."""
    decl = find_decl(node.domain, node.op_type, version)
    return bool(decl and decl.updates_state)


def is_random(node: Node, version: int | None = None) -> bool:
    """True when the node's kernel draws at random (KernelDecl.random)."""
    decl = find_decl(node.domain, node.op_type, version)
    return bool(decl and decl.random)


def random_ops() -> dict[tuple[str, str], int]:
    """(domain, op_type) -> the output holding the draw, for every op declared random."""
    _load_all()
    return {key: d.draw_output for key, decls in DECLS.items() for d in decls
            if d.random and d.draw_output is not None}


def scratch_bytes(node: Node, in_specs: list, out_specs: list, version: int | None = None) -> int:
    """Bytes of scratch the node's kernel needs at its EO (0 when none)."""
    decl = find_decl(node.domain, node.op_type, version)
    if decl is None or decl.scratch is None:
        return 0
    return int(_plan_time(node, decl.scratch, node, in_specs, out_specs))


def _plan_time(node: Node, fn: Callable, *args: Any) -> Any:
    """A kernel declaration's plan-time answer; attributes or shapes it cannot take refuse the
    node (exit 2) rather than crash."""
    try:
        return fn(*args)
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError) as exc:
        raise UnsupportedOpError(f"node '{node.name}' ({node.op_type}): its kernel cannot take this node "
                                 f"({type(exc).__name__}: {exc})") from None
