"""Node splitting: a node that is parallel along an axis becomes K chunk nodes, each on a piece
of its tensors, so the node's working set is a piece, not the whole (issue 28).

Rewrite rules, for every split `(node N, axis a, K)` (SplitSpec; the pass `split:` + JSON):
  - K = 1: N, a Transpose of a weight or of a weight gradient, is folded into the products around
    it (passes/split_fold.py), before any split.
  - N becomes chunk nodes `N#0` .. `N#K-1`: the same op, domain and attributes on pieces. Chunk
    k covers rows [k R/K, (k+1) R/K) of axis a (R rows; K divides R). Which inputs a chunk
    reads a piece of and which outputs it makes a piece of is the op's (passes/split_ops.py:
    elementwise and row-wise ops, products over rows, views, sums over rows, a conv dW over its
    output channels, a loss over rows: its chunks are onnxplan.SoftmaxCrossEntropyLoss(Grad)Rows
    on rows [start, stop), the loss a sum over the rows; a Gather / GatherGrad over its table's
    rows: onnxplan.GatherRows / GatherGradRows on table rows [start, stop), not K equal parts,
    the pieces flat); any other input (a broadcast bias, a weight) is read whole by every chunk.
    Only the leading axis (a = 0) is split, so every piece is one contiguous byte range; where K
    does not divide it, a node that flattens (split_ops.flattens: a view, a product whose left
    operand is batched against an unbatched right one) splits the rows of the tensor flattened
    over every axis but the last (split_ops.piece_shape), the same byte ranges.
  - An output that is a sum over the rows (a weight or bias gradient, a norm's dscale) is made
    whole: each chunk adds into a running sum `OUT#accJ` (a Gemm as its C, any other op through
    a partial sum `OUT#partJ` and an Add `N#J.addI`); the last chunk makes OUT (_Sums).
  - A sliced input whose pieces are off the store's page and that is small (split_ops.ROW_COPY_MAX)
    is read whole and its rows copied into each chunk's piece (`piece-rows:V:...`, op PieceRows,
    in the arena); so are a dW ConvGrad's dY channels (axis 1).
  - A piece is a value of its own, `V#k` (a fresh buffer of the piece's size): lifetimes, the
    offset planners, the verifier, swap planning and the executor see a normal buffer.
  - Pieces of a value V move through the host store's slot `V` (the whole tensor's bytes), by
    byte range, with two node kinds (domain onnxplan, phase of the node they serve):
      `piece-out:V` (op PieceOut) saves V whole to slot V (V's producer is not split), or
      `piece-out:V:k` saves the piece V#k to its range of slot V (V's producer is split);
      `piece-in:V:k` (op PieceIn) reads a range of slot V into a piece V#k, and
      `piece-in:V` reads the whole slot into V (for a reader of V that is not split the same
      way, and for a step output). Attributes: slot, offset, nbytes. A PieceIn runs after the
      PieceOuts that wrote its range (control dependencies).
    A piece made by a split producer is read by a split consumer of the same layout directly
    (no transfer); the whole V never exists unless something not split reads it.
  - What is copied: every piece-in and piece-out moves its bytes between the arena and the host
    store (the store's file, as swap's); a PieceRows copies a small input's rows (or a dW
    ConvGrad's dY channels) in the arena. Nothing else: a chunk computes its piece in place of
    the whole, the same op on fewer rows.
  - An optimizer update (UPDATE_OPS, passes/interleave.py: AdamWUpdate, SGDUpdate) is elementwise over
    its parameter, gradient and moments. Split, its parameter and moments become HomedValues:
    their home between steps is their slot (not the state region), chunk k reads its range
    (`piece-in:P:k`, no write before it in the step: the slot holds the state) and writes the
    updated range back (`piece-out:P:k`); a reader of the parameter whole (the forward pass, a
    split node broadcasting it) reads it from the slot first (`piece-in:P`, once), and every
    write-back of a range of P runs after every whole read of P (control dependencies added
    once the node list is built, so a whole read placed after the update is held too). The
    updated copies leave the step's outputs; the executor loads and reads the homed state in
    the piece store (executor/piece_io.py).
Exact semantics (split_ops' docstring has each kind's): elementwise and row-wise ops and the
updates give the same bits (tests/test_split.py on seeded random inputs, and two steps of the
mlp with a split AdamW and SGD update); products over rows and the conv dW the same dot products
on fewer rows (bitwise where BLAS blocks them alike, else a few ulps); sums over rows change the
summation order (tested within a few ulps of the sum of |terms|, tests/test_split_products.py;
verified against ONNX Runtime by `run --verify`). Piece byte offsets are multiples of
PIECE_ALIGN (the store's page: O_DIRECT transfers move whole pages). Refused, with the reason
(SplitRefused, `why_not`, split_ops.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from onnxplan.errors import OnnxplanError
from onnxplan.ir.graph import PERSISTENT_CLASSES, Node, StepGraph, Value, ValueClass, original_name
from onnxplan.ir.tensor import TensorSpec
from onnxplan.passes._infra import PassFn, PassResult
from onnxplan.passes.interleave import UPDATE_OPS
from onnxplan.passes.split_fold import fold, fold_refusal
from onnxplan.passes.split_ops import (
    KIND_CHANNELS,
    KIND_VIEW,
    MATMUL_OPS,
    OFF_PAGE_MIN,
    PIECE_ALIGN,
    ROW_OPS,
    SPLITTABLE_OPS,
    chunk_attrs,
    chunk_op,
    copied_rows,
    flat_elems,
    piece_shape,
    sliced_inputs,
    sliced_outputs,
    split_kind,
    summed_outputs,
    why_not,
)
from onnxplan.plan import PlannedPiece as Piece
from onnxplan.plan import PlannedSplit
from onnxplan.verify import RowChunk

__all__ = ["OFF_PAGE_MIN", "PIECE_ALIGN", "PIECE_DOMAIN", "ROW_OPS", "SPLITTABLE_OPS", "SPLIT_PASS", "UPDATE_OPS", "HomedValue", "Piece", "SplitRefused", "SplitSpec",
           "base_node", "chunk_name", "homed_slots", "is_piece_node", "piece_ranges", "row_chunks", "slot_bytes", "split_pass", "split_pass_name",
           "sliced_inputs", "split_records", "split_specs", "why_not"]

PIECE_DOMAIN = "onnxplan"
SPLIT_PASS = "split"


@dataclass
class HomedValue(Value):
    """A parameter or optimizer state an optimizer update is split over: its home between steps
    is its host slot (read by range into the update's chunks, written back by range), so it is
    not persistent: inside the step, a reader of it whole reads it from the slot (PieceIn)."""

    @property
    def persistent(self) -> bool:
        return False


class SplitRefused(OnnxplanError):
    """A split the pass cannot make (the node, op, K or layout); exit 2: the request is at fault."""

    exit_code = 2


@dataclass(frozen=True, order=True)
class SplitSpec:
    """Split node `node` into `k` chunks along `axis` of its output."""

    node: str
    k: int
    axis: int = 0


def split_pass_name(specs: list[SplitSpec] | tuple[SplitSpec, ...]) -> str:
    """The pipeline name of the split pass for `specs` (sorted: one name per set of splits)."""
    return f"{SPLIT_PASS}:" + json.dumps([[s.node, s.axis, s.k] for s in sorted(specs)], separators=(",", ":"))


def split_specs(arg: str) -> tuple[SplitSpec, ...]:
    """The specs of a split pass's argument (the JSON after `split:`); malformed: SplitRefused."""
    try:
        raw = json.loads(arg)
        specs = tuple(SplitSpec(str(n), int(k), int(a)) for n, a, k in raw)
    except (ValueError, TypeError) as exc:
        raise SplitRefused(f"malformed split pass argument {arg[:60]!r} ({exc})") from None
    if len({s.node for s in specs}) != len(specs):
        raise SplitRefused("a node is split twice in one split pass")
    return specs


def chunk_name(node: str, k: int) -> str:
    return f"{node}#{k}"


def base_node(name: str) -> str:
    """The node a chunk `N#k` (or an accumulation's add `N#k.addI`) was split from (`name`
    itself otherwise)."""
    head, sep, tail = name.rpartition("#")
    return head if sep and tail.partition(".")[0].isdigit() else name


def is_piece_node(node: Node) -> bool:
    return node.domain == PIECE_DOMAIN and node.op_type in ("PieceIn", "PieceOut")


@dataclass
class _Layout:
    """The pieces of one value in the arena: K, their names, and elements per piece when cut
    over the flattened value (split_ops.flat_elems; 0: by its leading rows)."""

    k: int
    names: tuple[str, ...]
    flat: int = 0
    reusable: bool = True  # False: a homed table's range read by a Gather's chunks (not kept for its update)


class _Splitter:
    """The rewrite of one split pass (see the module docstring)."""

    def __init__(self, graph: StepGraph, specs: tuple[SplitSpec, ...]) -> None:
        self.g = graph.copy()
        self.specs = {s.node: s for s in specs}
        self.nodes: list[Node] = []
        self.pieces: dict[str, _Layout] = {}  # value -> its pieces in the arena (its first layout)
        self.layouts: dict[tuple[str, int, int], _Layout] = {}  # (value, K, flat) -> a further layout read from its slot
        self.split_made: set[str] = set()  # values made only as pieces (by split producers)
        self.slot_writes: dict[str, list[str]] = {}  # value -> the PieceOut nodes that filled its slot
        self.whole: set[str] = set()  # split-made values assembled whole
        self.consumers = graph.consumers()
        self.homes: dict[str, list[str]] = {}  # homed state -> the PieceIn nodes reading it whole
        self.home_ranges: dict[str, list[str]] = {}  # homed state -> PieceIns of its ranges by nodes not its update

    def _home(self) -> None:
        """Parameters and state of the split updates become HomedValues; their updated copies
        leave the step's outputs (their home is the slot)."""
        for n in self.g.nodes:
            spec = self.specs.get(n.name)
            if spec is None or n.key not in UPDATE_OPS or why_not(self.g, n, spec.k, spec.axis):
                continue
            for v in sliced_inputs(self.g, n):
                old = self.g.values[v]
                if old.persistent:
                    self.g.values[v] = HomedValue(old.name, old.spec, old.vclass, old.trainable)
                    self.homes[v] = []
            updated = set(n.outputs)
            self.g.outputs = [o for o in self.g.outputs if o not in updated]

    def run(self) -> StepGraph:
        names = {n.name for n in self.g.nodes}
        for s in self.specs.values():
            if s.node not in names:
                raise SplitRefused(f"split of {s.node!r}: no such node")
        for s in sorted(self.specs.values()):  # K = 1: a transpose folded into its products (split_fold)
            if s.k == 1:
                node = self.g.node(s.node)
                why = fold_refusal(self.g, node)
                if why:
                    raise SplitRefused(f"fold of {s.node!r}: {why}")
                fold(self.g, node)
        self.consumers = self.g.consumers()
        self._home()
        for n in self.g.nodes:
            spec = self.specs.get(n.name)
            if spec is None:
                for i in n.inputs:
                    if i in self.split_made:
                        self._assemble(i, n.phase)
                    elif i in self.homes:
                        self._read_home(i, n.phase)
                self.nodes.append(n)
            else:
                self._split(n, spec)
        for o in self.g.outputs:
            if o in self.split_made:
                self._assemble(o, "backward")
        self._order_write_backs()
        self.g.nodes = self.nodes
        return self.g

    def _read_home(self, v: str, phase: str) -> None:
        """Homed `v` whole, read from its slot (once: the old bytes, before any write-back)."""
        if self.homes[v]:
            return
        self.homes[v].append(f"piece-in:{v}")
        self.nodes.append(Node(f"piece-in:{v}", "PieceIn", PIECE_DOMAIN, [], [v],
                               {"slot": v, "offset": 0, "nbytes": self.g.values[v].nbytes}, phase))

    def _order_write_backs(self) -> None:
        """Every write-back of a homed slot's range runs after every whole read of that slot
        (a whole read placed later in the node list than the split update included)."""
        for n in self.nodes:
            slot = str(n.attrs.get("slot", ""))
            reads = [*self.homes.get(slot, ()), *self.home_ranges.get(slot, ())]
            if n.op_type == "PieceOut" and n.domain == PIECE_DOMAIN and reads:
                n.after = list(dict.fromkeys([*n.after, *reads]))

    def _piece_value(self, v: str, j: int, k: int, first: bool, flat: int = 0) -> str:
        """A new value for piece j of K of `v`: `V#j` (`V#K.j` for a second layout of `v`;
        `V#K.fj` over the flattened value)."""
        whole = self.g.values[v]
        spec = whole.known_spec
        name = f"{v}#{j}" if first else f"{v}#{k}.{'f' if flat else ''}{j}"
        if name in self.g.values:
            raise SplitRefused(f"split: the piece name {name!r} is already a value of the step")
        kind = HomedValue if whole.vclass in PERSISTENT_CLASSES else Value  # a piece of state lives in the arena
        shape = (min(flat, spec.numel - j * flat),) if flat else piece_shape(spec.shape, k)
        if shape is None:
            raise SplitRefused(f"split: {v!r} {spec.shape} has no piece shape in {k} (its rows do not divide)")
        self.g.values[name] = kind(name, TensorSpec(spec.dtype, shape), whole.vclass, whole.trainable)
        return name

    def _span(self, v: str, j: int, k: int, flat: int) -> tuple[int, int]:
        """Piece j of K of `v`: its byte offset in the slot and its bytes."""
        spec = self.g.values[v].known_spec
        if flat:
            return j * flat * spec.itemsize, min(flat, spec.numel - j * flat) * spec.itemsize
        return j * (spec.nbytes // k), spec.nbytes // k

    def _split(self, n: Node, spec: SplitSpec) -> None:
        why = why_not(self.g, n, spec.k, spec.axis)
        if not why and n.key == ("", "Gather") and self.g.values[n.inputs[0]].persistent:
            why = f"its table {n.inputs[0]!r} is a parameter: its optimizer update must split in the same pass (homing it)"
        if why:
            raise SplitRefused(f"split of {n.name!r} in {spec.k}: {why}")
        k = spec.k
        sliced = sliced_inputs(self.g, n)
        flat = flat_elems(self.g, n, k)  # over its flattened tensors (0: by rows)
        copied = [] if flat else copied_rows(self.g, n, k)
        for i in n.inputs:
            if i in sliced and i not in copied:
                continue
            if i in self.split_made:  # read whole by every chunk
                self._assemble(i, n.phase)
            elif i in self.homes:
                self._read_home(i, n.phase)
        reads = {v: self._rows_of(v, k, n.phase) if v in copied else self._pieces_of(v, k, n.phase, flat)
                 for v in sliced}
        for v in sliced:  # a homed table's ranges read by a Gather: held before the update writes them back
            if v in self.homes and n.key not in UPDATE_OPS:
                self.home_ranges.setdefault(v, []).extend(x.name for x in reads[v][1])
                for lay in (self.pieces.get(v), self.layouts.get((v, k, flat))):
                    if lay is not None and lay.names == reads[v][0]:
                        lay.reusable = False
        channels = split_kind(self.g, n) == KIND_CHANNELS
        if channels:  # dY by channels, copied from the whole (split_ops, KIND_CHANNELS)
            dy = n.inputs[0]
            if dy in self.split_made:
                self._assemble(dy, n.phase)
            reads[dy] = self._rows_of(dy, k, n.phase, axis=1)
        view = split_kind(self.g, n) == KIND_VIEW
        outs = sliced_outputs(self.g, n)
        made = {o: tuple(self._piece_value(o, j, k, True, flat) for j in range(k)) for o in outs}
        for o in outs:
            self.pieces[o] = _Layout(k, made[o], flat)
            self.split_made.add(o)
        back = self._written_back(n)  # an update's outputs -> the state slot they go home to
        kept = [o for o in outs if o not in back and self._read_otherwise(o, k)]  # also saved to their slot
        sums = _Sums(self, n, k)
        for j in range(k):  # chunk by chunk: its pieces read, the chunk, its pieces saved
            self.nodes.extend(new[j] for _, new in reads.values() if new)
            ins = sums.inputs(j, [reads[i][0][j] if i in reads else i for i in n.inputs])
            outs_j = [made[o][j] if o in made else sums.part(o, j) if o else "" for o in n.outputs]
            aliases = {outs_j[0]: (ins[0], "rv")} if view else {}  # piece j of a view: piece j of its input
            if channels:
                self.nodes.append(self._weight_chunk(n, j, ins, made[n.outputs[1]][j]))
            else:
                domain, op = sums.op(j) or chunk_op(n)
                self.nodes.append(Node(chunk_name(n.name, j), op, domain, ins, outs_j,
                                       chunk_attrs(self.g, n, k, j, sums.attrs(j)), n.phase, aliases))
            self.nodes.extend(sums.adds(j))
            for o in kept:
                self.nodes.append(self._piece_out(o, made[o][j], j, k, n.phase, flat))
            for o, home in back.items():  # after every whole read of the old bytes (_order_write_backs)
                self.nodes.append(self._piece_out(home, made[o][j], j, k, n.phase, flat))
        for o in kept:
            self.slot_writes[o] = [f"piece-out:{o}:{j}" for j in range(k)]
        for o in back:  # made only as pieces, which go home: the whole updated copy is no value of the step
            del self.g.values[o]

    def _rows_of(self, v: str, k: int, phase: str, axis: int = 0) -> tuple[tuple[str, ...], list[Node]]:
        """The K pieces of `v` along `axis` (split_ops.copied_rows; a dW ConvGrad's dY by
        channels) copied from `v` whole in the arena (PieceRows: indices [j R/K, (j+1) R/K) of
        the axis), and the nodes that copy them."""
        key = (v, -k, axis)
        if key in self.layouts:
            return self.layouts[key].names, []
        spec = self.g.values[v].known_spec
        rows, tag = spec.shape[axis], "rows" if axis == 0 else f"axis{axis}."
        names, nodes = [], []
        for j in range(k):
            name = f"{v}#{tag}{k}.{j}"
            if name in self.g.values:
                raise SplitRefused(f"split: the piece name {name!r} is already a value of the step")
            shape = (*spec.shape[:axis], rows // k, *spec.shape[axis + 1:])
            self.g.values[name] = Value(name, TensorSpec(spec.dtype, shape), self.g.values[v].vclass)
            nodes.append(Node(f"piece-rows:{v}:{tag}{k}.{j}", "PieceRows", PIECE_DOMAIN, [v], [name],
                              {"start": j * rows // k, "stop": (j + 1) * rows // k, "axis": axis}, phase))
            names.append(name)
        self.layouts[key] = _Layout(k, tuple(names))
        return tuple(names), nodes

    def _weight_chunk(self, n: Node, j: int, ins: list[str], piece: str) -> Node:
        """Chunk j of a dW ConvGrad: onnxplan.ConvGradWeight(dY's channels, X) -> its piece of dW."""
        shape = [int(d) for d in self.g.values[piece].known_spec.shape]
        return Node(chunk_name(n.name, j), "ConvGradWeight", PIECE_DOMAIN, ins[:2], [piece],
                    {**n.attrs, "w_shape": shape}, n.phase)

    def _acc_value(self, whole: Value, name: str) -> str:
        """A running sum of an accumulation: a temporary of the whole output's spec."""
        if name in self.g.values:
            raise SplitRefused(f"split: the value name {name!r} is already a value of the step")
        self.g.values[name] = Value(name, whole.spec, ValueClass.TEMPORARY)
        return name

    def _written_back(self, n: Node) -> dict[str, str]:
        """A split update's outputs and the homed state each updates (output k of the kernel's
        overwrites: its input); empty for any other node."""
        if n.key not in UPDATE_OPS:
            return {}
        from onnxplan.kernels.registry import find_decl

        decl = find_decl(n.domain, n.op_type)
        over = decl.overwrites if decl is not None and isinstance(decl.overwrites, dict) else {}
        out = {}
        for k, o in enumerate(n.outputs):
            src = [n.inputs[i] for i in over.get(k, ()) if i < len(n.inputs) and n.inputs[i] in self.homes]
            if o and src:
                if any(c for c in self.consumers.get(o, ())):
                    raise SplitRefused(f"split of {n.name!r}: its updated {o!r} is read in the step")
                out[o] = src[0]
        return out

    def _read_otherwise(self, v: str, k: int) -> bool:
        """Whether something reads `v` other than chunks of K laid out alike (a node not split,
        split otherwise, or the step's outputs): then its slot is filled as its pieces are made."""
        if v in self.g.outputs:
            return True
        for c in self.consumers.get(v, ()):
            spec = self.specs.get(c.name)
            if spec is None or spec.k != k or v not in sliced_inputs(self.g, c):
                return True
        return False

    def _piece_out(self, v: str, piece: str, j: int, k: int, phase: str, flat: int = 0) -> Node:
        offset, nbytes = self._span(v, j, k, flat)
        return Node(f"piece-out:{v}:{j}", "PieceOut", PIECE_DOMAIN, [piece], [],
                    {"slot": v, "offset": offset, "nbytes": nbytes}, phase)

    def _pieces_of(self, v: str, k: int, phase: str, flat: int = 0) -> tuple[tuple[str, ...], list[Node]]:
        """The K pieces of `v` a chunk set reads, and the PieceIn nodes that make them (none
        when they are in the arena, laid out alike; else read by range from its slot, filled
        first)."""
        have = self.pieces.get(v)
        if have is not None and have.k == k and have.flat == flat and have.reusable:
            return have.names, []
        if (v, k, flat) in self.layouts and self.layouts[v, k, flat].reusable:  # a second layout, read before
            return self.layouts[v, k, flat].names, []
        writes = [] if v in self.homes else self._fill_slot(v, phase)  # a home holds the state already
        names, nodes = [], []
        for j in range(k):
            piece = self._piece_value(v, j, k, have is None, flat)
            suffix = f"{j}" if have is None else f"{k}.{'f' if flat else ''}{j}"
            offset, nbytes = self._span(v, j, k, flat)
            nodes.append(Node(f"piece-in:{v}:{suffix}", "PieceIn", PIECE_DOMAIN, [], [piece],
                              {"slot": v, "offset": offset, "nbytes": nbytes}, phase, {}, list(writes)))
            names.append(piece)
        if have is None:
            self.pieces[v] = _Layout(k, tuple(names), flat)
        else:
            self.layouts[v, k, flat] = _Layout(k, tuple(names), flat)
        return tuple(names), nodes

    def _fill_slot(self, v: str, phase: str) -> list[str]:
        """The PieceOut nodes that fill slot `v` (added on first use): one per piece of a
        split-made value, else one of the whole value."""
        if v in self.slot_writes:
            return self.slot_writes[v]
        if v in self.split_made:  # filled chunk by chunk (_split) unless nothing was to read it whole
            lay = self.pieces[v]
            self.nodes.extend(self._piece_out(v, p, j, lay.k, phase, lay.flat) for j, p in enumerate(lay.names))
            writes = [f"piece-out:{v}:{j}" for j in range(lay.k)]
        else:
            self.nodes.append(Node(f"piece-out:{v}", "PieceOut", PIECE_DOMAIN, [v], [],
                                   {"slot": v, "offset": 0, "nbytes": self.g.values[v].nbytes}, phase))
            writes = [self.nodes[-1].name]
        self.slot_writes[v] = writes
        return writes

    def _assemble(self, v: str, phase: str) -> None:
        """`v` whole, read back from its slot (for a reader that is not split like its producer)."""
        if v in self.whole:
            return
        self.whole.add(v)
        writes = self._fill_slot(v, phase)
        self.nodes.append(Node(f"piece-in:{v}", "PieceIn", PIECE_DOMAIN, [], [v],
                               {"slot": v, "offset": 0, "nbytes": self.g.values[v].nbytes}, phase, {},
                               list(writes)))


class _Sums:
    """The outputs of one split node that are sums over its rows (split_ops.summed_outputs):
    each made whole, chunk by chunk. A Gemm adds into its running sum itself (chunk j > 0 reads
    the sum so far as C, beta 1; chunk 0 has the node's own C and beta); any other op makes a
    partial sum per chunk, added to the running one by an Add (`N#j.addI`). The running sums
    are temporaries `OUT#accJ`; the last chunk makes OUT. A Gemm's chunks are onnxplan.GemmAdd,
    whose chunk j > 0 may write the new sum over the old one (in place). A Gather's output is
    chained alike (not a sum: chunk j > 0 writes its positions into the output so far,
    onnxplan.GatherRows, in place where the in-place pass lets it)."""

    def __init__(self, sp: _Splitter, n: Node, k: int) -> None:
        self.sp, self.n, self.k = sp, n, k
        self.outs = summed_outputs(sp.g, n)
        self.chained = n.op_type in ("Gemm", "Gather") and bool(self.outs)  # Gather: the output written in place
        self.target = {(o, j): o if j == k - 1 else sp._acc_value(sp.g.values[o], f"{o}#acc{j}")
                       for o in self.outs for j in range(k)}

    def part(self, o: str, j: int) -> str:
        """What chunk j writes for summed output `o`: the running sum itself (chunk 0, or a
        Gemm), else a partial sum."""
        if j == 0 or self.chained:
            return self.target[o, j]
        return self.sp._acc_value(self.sp.g.values[o], f"{o}#part{j}")

    def op(self, j: int) -> tuple[str, str] | None:
        """Chunk j's op when it is not the node's: a Gemm's chunks are onnxplan.GemmAdd
        (kernels/split_chunks.py: by blocks of rows; chunk j > 0 adds into the running sum in
        place: one dW-sized buffer, not two)."""
        return (PIECE_DOMAIN, "GemmAdd") if self.chained and self.n.op_type == "Gemm" else None

    def inputs(self, j: int, ins: list[str]) -> list[str]:
        return [*ins[:2], self.target[self.outs[0], j - 1]] if self.chained and j else ins

    def attrs(self, j: int) -> dict:
        gemm = self.chained and self.n.op_type == "Gemm"
        return {**self.n.attrs, "beta": 1.0} if gemm and j else dict(self.n.attrs)

    def adds(self, j: int) -> list[Node]:
        """The Adds of chunk j's partial sums to the running ones (none for chunk 0 or a Gemm)."""
        if j == 0 or self.chained:
            return []
        return [Node(f"{chunk_name(self.n.name, j)}.add{i}", "Add", "",
                     [self.target[o, j - 1], f"{o}#part{j}"], [self.target[o, j]], {}, self.n.phase)
                for i, o in enumerate(self.outs)]


def split_pass(arg: str) -> PassFn:
    """The split pass of a pipeline name `split:ARG` (ARG: split_pass_name's JSON)."""
    specs = split_specs(arg)

    def run(graph: StepGraph) -> PassResult:
        if not specs:
            return PassResult(graph, False, [])
        g = _Splitter(graph, specs).run()
        moved = sum(1 for n in g.nodes if is_piece_node(n))
        what = ", ".join(f"{s.node} x{s.k}" for s in sorted(specs))
        return PassResult(g, True, [f"split: {len(specs)} node(s) into chunks ({what}); {moved} piece transfers"])

    return run


def piece_ranges(g: StepGraph) -> tuple[Piece, ...]:
    """Every PieceIn / PieceOut of `g` as a Piece (the plan's record), by node name."""
    return tuple(sorted((Piece(n.name, "in" if n.op_type == "PieceIn" else "out", str(n.attrs["slot"]),
                               int(n.attrs["offset"]), int(n.attrs["nbytes"])) for n in g.nodes if is_piece_node(n)),
                        key=lambda p: p.node))


def split_records(g: StepGraph, passes: list[str] | tuple[str, ...]) -> tuple[PlannedSplit, ...]:
    """The plan's split records of a pass list, for `g` (the step after those passes: the op
    is that of each node's first chunk)."""
    arg = next((p.partition(":")[2] for p in passes if p.startswith(f"{SPLIT_PASS}:")), None)
    if arg is None:
        return ()
    ops = {n.name: (f"{n.domain}.{n.op_type}" if n.domain else n.op_type) for n in g.nodes}
    return tuple(PlannedSplit(s.node, "fold" if s.k == 1 else ops.get(chunk_name(s.node, 0), "?"), s.axis, s.k)
                 for s in sorted(split_specs(arg)))


def _piece_of(g: StepGraph, name: str) -> tuple[Value, int] | None:
    """The whole value a piece `name` is of and the piece's index in its layout (the names
    _piece_value and _rows_of give: `V#j`, `V#K.j`, `V#rowsK.j`; a swapped-in or recomputed copy
    stands for its original); None: not a piece by rows."""
    head, sep, tail = original_name(name).rpartition("#")
    index = tail.rpartition(".")[2]
    if not sep or head not in g.values or not index.isdigit() or not g.values[head].spec:
        return None
    return g.values[head], int(index)


def _product_chunk(g: StepGraph, n: Node) -> RowChunk | None:
    """The checker's record of a product's chunk over rows (split_ops: a MatMul, FusedMatMul or
    Gemm over the rows of its left operand, by its leading axis or its flattened rows): the rows
    of the output its piece holds, by the piece's index and rows (piece j of equal pieces is
    bytes [j n, (j+1) n)), and the rows of the left operand's piece it reads, in output rows."""
    y, a = _piece_of(g, n.outputs[0]), _piece_of(g, n.inputs[0]) if n.inputs else None
    if y is None:
        return None
    whole_y, jy = y
    width = whole_y.known_spec.shape[-1] if whole_y.known_spec.shape else 1
    rows = whole_y.known_spec.numel // max(width, 1)
    per = g.values[n.outputs[0]].known_spec.numel // max(width, 1)
    a_start, a_rows = -1, -1
    if a is not None:  # bytes of its left operand's piece, in the output's rows (-1: no whole number of them)
        whole_a, ja = a
        nbytes, total = g.values[n.inputs[0]].nbytes, whole_a.nbytes
        if total and (ja * nbytes * rows) % total == 0 and (nbytes * rows) % total == 0:
            a_start, a_rows = ja * nbytes * rows // total, nbytes * rows // total
    return RowChunk(base_node(n.name), int(n.name.rpartition("#")[2]), jy * per, (jy + 1) * per, rows, a_rows,
                    a_start)


def row_chunks(g: StepGraph) -> tuple[RowChunk, ...]:
    """The chunks over rows of `g` as the checker's records (verify.verify_row_chunks): the table
    chunks (onnxplan.GatherRows / GatherGradRows: their rows [start, stop) of `rows` and the rows
    of the table piece each reads, writes) and the chunks of products over rows (_product_chunk)."""
    out = []
    for n in g.nodes:
        if n.key in MATMUL_OPS and base_node(n.name) != n.name:
            chunk = _product_chunk(g, n)
            if chunk is not None:
                out.append(chunk)
            continue
        if n.domain != PIECE_DOMAIN or n.op_type not in ("GatherRows", "GatherGradRows"):
            continue
        piece = n.inputs[0] if n.op_type == "GatherRows" else n.outputs[0]
        whole = g.values.get(piece.rpartition("#")[0] or piece, g.values[piece]).known_spec
        rows = int(n.attrs["rows"])
        per_row = max(whole.numel // max(rows, 1), 1)
        out.append(RowChunk(base_node(n.name), int(n.name.rpartition("#")[2]), int(n.attrs["start"]),
                            int(n.attrs["stop"]), rows, g.values[piece].known_spec.numel // per_row))
    return tuple(out)


def homed_slots(g: StepGraph) -> set[str]:
    """The slots of `g` that are homes of state (HomedValue): full at the step's start."""
    return {str(n.attrs["slot"]) for n in g.nodes
            if is_piece_node(n) and isinstance(g.values.get(str(n.attrs["slot"])), HomedValue)}


def slot_bytes(g: StepGraph) -> dict[str, int]:
    """The bytes of every host slot of `g`'s piece nodes (the whole value each holds)."""
    return {str(n.attrs["slot"]): g.values[str(n.attrs["slot"])].nbytes for n in g.nodes
            if is_piece_node(n) and str(n.attrs["slot"]) in g.values}
