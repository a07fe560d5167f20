"""Splitting for a budget below the floor (issue 28): which nodes to split, in how many chunks.

Swap stops at its floor (swap.driver.Floor): the node with the largest working set holds it all
while it runs. When a budget is below that floor, `split_to_fit` splits (passes/split.py) every
splittable node whose bound (the memory that stays resident + its working set + its scratch)
is above the budget, each in the smallest K whose chunk fits (the pieces of its sliced tensors
shrink by K; its broadcast inputs stay whole; K at most MAX_K), and plans swap again on the split
graph. A chunk still above the budget gets the next K that fits; when no working set is above
the budget's room and the plan still misses it, the node that sets the floor gets its next K. A transpose that folds into its products
(passes/split_fold.py: GPT-2's tied LM head) is folded (K = 1) when its working set is above the
room; a Gather split over a persistent table brings its optimizer update (which homes the table). Before any of it, the floor
of every split plan, computed without planning one (_split_floor): over the nodes, the largest
of the least each holds while it runs (the resident bytes, less the state a split update could
home, + its smallest chunk in the largest K it splits in, or its whole working set where it
splits in none, + scratch); a budget below it plans no split graph, and the floor reported names
that node, its chunks and why it goes no lower. Each round splits every node whose working set
is above the room in the smallest K that fits; when none is and the plan still misses, the node
that sets the plan's floor gets its next K, and when it has none the search ends. Rounds stop
when the plan fits, there, or after MAX_ROUNDS; the plan of least peak is returned, and where it
misses the budget its floor is the split floor (a split the pass refuses ends the rounds: the
best plan so far stands).
A budget at or above the floor never reaches here: plans are unchanged.
More chunks cost more calls and transfers: the price (swap.pricing.planned_step) counts each
piece transfer at the store's bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from onnxplan.budget.attempt import attempt, step_before_inplace
from onnxplan.ir.graph import Node, StepGraph, original_name
from onnxplan.offsets.buffers import align
from onnxplan.passes.lifetimes import SCRATCH_PREFIX, lifetimes
from onnxplan.passes.split import UPDATE_OPS, SplitRefused, SplitSpec, base_node, sliced_inputs, why_not
from onnxplan.passes.split_fold import fold_refusal
from onnxplan.passes.split_ops import MAX_K, sliced_outputs, split_rows, table_update, unread_inputs
from onnxplan.pipeline import run_pipeline
from onnxplan.planning import PlanOptions, PlanOutcome
from onnxplan.sizes import format_bytes
from onnxplan.swap.driver import Floor, resident_touched
from onnxplan.swap.insert import is_swap_node
from onnxplan.swap.model import swap_model

__all__ = ["MAX_K", "MAX_ROUNDS", "split_to_fit"]

MAX_ROUNDS = 4  # plans of the split graph tried (each a swap planning)


@dataclass(frozen=True)
class _NodeSet:
    """A node's working set under an order (the swap model's): bytes touched, of them resident, scratch."""

    node: str
    eo: int
    working_set: int
    resident_touched: int
    scratch: int

    @property
    def touched(self) -> int:
        return self.working_set + self.scratch


def _node_sets(out: PlanOutcome, graph: StepGraph) -> list[_NodeSet]:
    """Per node of `out`'s step (its passes, no swap nodes), its working set under `out`'s order."""
    g = run_pipeline(graph, list(out.plan.passes))[0]
    nodes = {n.name: n for n in g.nodes}
    order = [name for name in out.plan.order if name in nodes and not is_swap_node(nodes[name])]
    lt = lifetimes(g, order)
    model = swap_model(g, order, lt)
    scratch = {b.name[len(SCRATCH_PREFIX):]: b.padded for b in lt.buffers if b.name.startswith(SCRATCH_PREFIX)}
    return [_NodeSet(name, t, model.working_set(t), resident_touched(model, t), scratch.get(name, 0))
            for t, name in enumerate(order)]


def _why_unsplit(g: StepGraph, node: Node | None) -> str:
    """Why `node` (of the step the split pass sees; None: not one of its nodes) splits in no K
    of 2..MAX_K ("" when it splits in one)."""
    if node is None:
        return "not a node of the step the split pass sees"
    if not fold_refusal(g, node):  # a transpose that folds into its products: it leaves the step
        return ""
    whys = [why_not(g, node, k) for k in range(2, MAX_K + 1)]
    return "" if not all(whys) else whys[0]


def _valid_ks(g: StepGraph, node: Node, above: int = 0) -> list[int]:
    """The K > `above` (2..MAX_K) `node` splits in."""
    rows = split_rows(g, node)
    return [k for k in range(max(above + 1, 2), min(rows, MAX_K) + 1) if not why_not(g, node, k)]


def _chunk_bytes(g: StepGraph, node: Node, touched: int, k: int) -> int:
    """The bytes a chunk of `node` in `k` touches, its whole working set being `touched`: the
    K-th of its sliced tensors, and whole what every chunk reads whole (a weight, a broadcast
    input, the scratch; a dW ConvGrad's W, which its chunks do not read, left out)."""
    sliced = sum(align(g.values[v].nbytes) for v in {*sliced_inputs(g, node), *sliced_outputs(g, node)})
    whole = max(touched - sliced - sum(align(g.values[v].nbytes) for v in unread_inputs(g, node)), 0)
    return whole + -(-sliced // k)


def _split_floor(pre: StepGraph, sets: list[_NodeSet], floor: Floor) -> Floor | None:
    """The floor no split plan goes below, computed without planning one: the largest, over the
    nodes of the unsplit plan (`sets`), of the least a node holds while it runs: the resident
    bytes (less the state a split update could home: what a node reads of it joins its working
    set) + its smallest chunk's bytes (in the largest K it splits in) where it splits, its whole
    working set where it does not, + its scratch. A transpose that folds into its products leaves
    the step (its products read its input). None when the step has no node."""
    pre_nodes = {n.name: n for n in pre.nodes}
    homeable = {v for n in pre.nodes if n.key in UPDATE_OPS and not _why_unsplit(pre, n)
                for v in sliced_inputs(pre, n) if pre.values[v].persistent}
    resident = max(floor.resident - sum(align(pre.values[v].nbytes) for v in homeable), 0)
    best: Floor | None = None
    for s in sets:
        node = pre_nodes.get(base_node(s.node))
        if node is not None and not fold_refusal(pre, node):
            continue
        homed = sum(align(pre.values[v].nbytes) for v in {*node.inputs, *node.outputs} & homeable) if node else 0
        touched = max(s.resident_touched - homed, 0)
        ks = _valid_ks(pre, node) if node is not None else []
        if ks and node is not None:
            k = ks[-1]
            more = why_not(pre, node, k + 1) if k < MAX_K else f"at most MAX_K = {MAX_K}"
            cand = Floor(floor.peak_bytes, _chunk_bytes(pre, node, s.working_set, k), s.eo, s.node, s.scratch, resident,
                         touched, f"it splits in no more chunks: {more}", k)
        else:
            cand = Floor(floor.peak_bytes, s.working_set, s.eo, s.node, s.scratch, resident, touched,
                         f"it does not split: {_why_unsplit(pre, node)}")
        if best is None or cand.bound > best.bound:
            best = cand
    return best


def _smallest_k(g: StepGraph, node: Node, touched: int, room: int, above: int) -> int | None:
    """The smallest K > `above` at which `node` (of `g`, the step the split pass sees) splits
    and a chunk's bytes fit `room`, its whole working set being `touched` (none fits: the
    largest K it splits in; None when it splits in none above `above`); 1 for a transpose that
    folds into its products (passes/split_fold.py), not folded yet."""
    if above < 1 and not fold_refusal(g, node):
        return 1
    valid = _valid_ks(g, node, above)
    if not valid:
        return None
    return next((k for k in valid if _chunk_bytes(g, node, touched, k) <= room), valid[-1])


def _split_at_peak(out: PlanOutcome, pre: StepGraph, specs: dict[str, SplitSpec]) -> dict[str, SplitSpec]:
    """The split nodes (of `specs`, K > 1) that make or read a value live where `out`'s arena
    holds the most bytes (a piece, a running sum or a swapped-in copy standing for its whole
    value), each in its next K; empty when none splits further. Where no working set is above
    the room and the plan still misses, what swap keeps beside a node (a prefetched input, a
    piece not yet paged out) sets the peak: the swap floor's node need not be one of these."""
    if out.swap is None or not out.swap.lifetimes.buffers:
        return {}
    bufs = out.swap.lifetimes.buffers
    ends = max(b.last for b in bufs) + 2
    delta = [0] * ends
    for b in bufs:
        delta[b.first] += b.padded
        delta[b.last + 1] -= b.padded
    live, peak, t = 0, -1, 0
    for eo in range(ends - 1):
        live += delta[eo]
        if live > peak:
            peak, t = live, eo
    wholes = set()
    for b in bufs:
        if b.first <= t <= b.last:
            for v in (b.name, *b.aliases):
                head, sep, _ = original_name(v).rpartition("#")
                wholes.add(head if sep and head in pre.values else original_name(v))
    nxt = {}
    for n in pre.nodes:
        spec = specs.get(n.name)
        if spec is not None and spec.k > 1 and wholes & {*n.inputs, *n.outputs}:
            ks = _valid_ks(pre, n, spec.k)
            if ks:
                nxt[n.name] = SplitSpec(n.name, ks[0])
    return nxt


def _with_table_updates(g: StepGraph, chosen: dict[str, SplitSpec]) -> None:
    """A Gather split over a persistent table reads it by range from its home: its optimizer
    update is split too (in its smallest K, if not chosen already)."""
    for name in list(chosen):
        node = g.node(name)
        table = node.inputs[0] if node.op_type == "Gather" and node.inputs else ""
        update = table_update(g, table) if table and g.values[table].persistent else None
        if update is not None and update.name not in chosen:
            k = next((j for j in range(2, MAX_K + 1) if not why_not(g, update, j)), None)
            if k is not None:
                chosen[update.name] = SplitSpec(update.name, k)


def split_to_fit(graph: StepGraph, opts: PlanOptions, swapped: PlanOutcome) -> PlanOutcome:
    """`swapped` (swap's plan under opts.budget, made with `opts`) when the budget is at or
    above its floor; else the plan of least peak of the split graphs tried (see the module
    docstring). Where that plan misses the budget, its floor is the split floor (_split_floor)."""
    budget = opts.budget
    floor = swapped.swap.floor if swapped.swap is not None else None
    if budget is None or floor is None or floor.bound <= budget or swapped.swap is None:
        return swapped
    pre = step_before_inplace(graph, replace(opts, splits=()))
    sets = _node_sets(swapped, graph)
    lowest = _split_floor(pre, sets, floor)
    if lowest is not None and budget < lowest.bound:  # no split plan can fit
        swapped.swap.floor = lowest
        swapped.pass_notes.append(f"split: not tried: the least any split plan holds, {format_bytes(lowest.bound)} "
                                  f"at {lowest.node!r} ({lowest.unsplit}), is above the budget {format_bytes(budget)}")
        return swapped
    whole = {ns.node: ns.touched for ns in sets}  # each node's working set unsplit
    pre_nodes = {n.name: n for n in pre.nodes}
    specs: dict[str, SplitSpec] = {}
    best, out = swapped, swapped
    for _ in range(MAX_ROUNDS):
        fl = out.swap.floor if out.swap is not None else None
        if fl is None:
            break
        room = budget - fl.resident
        chosen = dict(specs)
        for ns in _node_sets(out, graph):  # every node above the room in the smallest K that fits
            base = base_node(ns.node)
            if ns.touched <= room or base not in pre_nodes:
                continue
            k_now = specs[base].k if base in specs else 0
            k = _smallest_k(pre, pre_nodes[base], whole.get(base, ns.touched * max(k_now, 1)), room, k_now)
            if k is not None:
                chosen[base] = SplitSpec(base, k)
        if chosen == specs:  # no working set above the room, yet the plan misses: the split nodes at its peak
            chosen.update(_split_at_peak(out, pre, specs))
        if chosen == specs:  # ... or the floor's node in more chunks
            floor_node = base_node(fl.node)
            k_floor = specs[floor_node].k if floor_node in specs else 0
            k_next = None if floor_node not in pre_nodes else \
                _smallest_k(pre, pre_nodes[floor_node], whole.get(floor_node, fl.working_set + fl.scratch), room,
                            k_floor)
            if k_next is None:
                break  # the node that sets the floor cannot be split (further), and no other is above the room
            chosen[floor_node] = SplitSpec(floor_node, k_next)
        _with_table_updates(pre, chosen)
        specs = chosen
        try:
            out = attempt(graph, replace(opts, splits=tuple(sorted(specs.values()))))
        except SplitRefused:  # a split the pass cannot make: the best plan so far stands
            break
        if out.plan.peak_bytes < best.plan.peak_bytes:
            best = out
        if out.plan.peak_bytes <= budget:
            break
    if best is not swapped:
        best.pass_notes.append(f"split: swap's floor {format_bytes(floor.bound)} at {floor.node!r} is above the budget "
                               f"{format_bytes(budget)}; split {len(best.plan.splits)} node(s) "
                               f"({', '.join(f'{s.node} x{s.k}' for s in best.plan.splits)})")
    if best.plan.peak_bytes > budget and best.swap is not None and lowest is not None:
        best.swap.floor = lowest  # the step's floor, not that of the order the best plan happens to have
    return best
