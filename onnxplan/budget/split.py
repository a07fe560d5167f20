"""Splitting for a budget below the floor (issue 28): which nodes to split, in how many chunks.

Swap stops at its floor (swap.driver.Floor): the node with the largest working set holds it all
while it runs. When a budget is below that floor, `split_to_fit` splits (passes/split.py) every
splittable node whose bound (the memory that stays resident + its working set + its scratch)
is above the budget, each in the smallest K whose chunk fits (the pieces of its sliced tensors
shrink by K; its broadcast inputs stay whole; K at most MAX_K), and plans swap again on the split
graph. A chunk still above the budget gets the next K that fits; when no working set is above
the budget's room and the plan still misses it, the node that sets the floor gets its next K. A transpose that folds into its products
(passes/split_fold.py: GPT-2's tied LM head) is folded (K = 1) when its working set is above the
room; a Gather split over a persistent table brings its optimizer update (which homes the table). Before any of it, a lower bound
computed without planning: of the nodes that split in no K, the largest bound (the resident
bytes, less the state a split update could home, + its working set + scratch); a budget below
it plans no split graph, and the floor reported is that node's, with why it does not split. Each round starts from the node that sets
the current floor: when it cannot be split (further; the reason is passes.split.why_not's) the
search ends, as splitting the others would lower nothing. Rounds stop when the plan fits, at
such a floor, or after MAX_ROUNDS; the plan of least peak is returned, and its swap floor names
the node that now sets it (a split the pass refuses ends the rounds: the best plan so far stands).
A budget at or above the floor never reaches here: plans are unchanged.
More chunks cost more calls and transfers: the price (swap.pricing.planned_step) counts each
piece transfer at the store's bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from onnxplan.budget.attempt import attempt, step_before_inplace
from onnxplan.ir.graph import Node, StepGraph
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


def _split_floor(pre: StepGraph, swapped: PlanOutcome, graph: StepGraph, floor: Floor) -> Floor | None:
    """The floor no split reaches below, without planning a split: of the nodes that split in no
    K, the largest bound (the resident bytes, less the state a split update could home, + its
    working set); None when every node splits."""
    pre_nodes = {n.name: n for n in pre.nodes}
    homeable = {v for n in pre.nodes if n.key in UPDATE_OPS and not _why_unsplit(pre, n)
                for v in sliced_inputs(pre, n) if pre.values[v].persistent}
    resident = max(floor.resident - sum(pre.values[v].nbytes for v in homeable), 0)
    best: Floor | None = None
    for s in _node_sets(swapped, graph):
        why = _why_unsplit(pre, pre_nodes.get(base_node(s.node)))
        cand = Floor(floor.peak_bytes, s.working_set, s.eo, s.node, s.scratch, resident, s.resident_touched, why)
        if why and (best is None or cand.bound > best.bound):
            best = cand
    return best


def _smallest_k(g: StepGraph, node: Node, touched: int, room: int, above: int) -> int | None:
    """The smallest K > `above` at which `node` (of `g`, the step the split pass sees) splits
    and a chunk's bytes fit `room`, its whole working set being `touched` (none fits: the
    largest K it splits in; None when it splits in none above `above`); 1 for a transpose that
    folds into its products (passes/split_fold.py), not folded yet."""
    if above < 1 and not fold_refusal(g, node):
        return 1
    rows = split_rows(g, node)
    valid = [k for k in range(max(above + 1, 2), min(rows, MAX_K) + 1) if not why_not(g, node, k)]
    if not valid:
        return None
    sliced = sum(align(g.values[v].nbytes) for v in {*sliced_inputs(g, node), *sliced_outputs(g, node)})
    whole = max(touched - sliced - sum(align(g.values[v].nbytes) for v in unread_inputs(g, node)), 0)
    return next((k for k in valid if whole + -(-sliced // k) <= room), valid[-1])


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
    docstring)."""
    budget = opts.budget
    floor = swapped.swap.floor if swapped.swap is not None else None
    if budget is None or floor is None or floor.bound <= budget:
        return swapped
    pre = step_before_inplace(graph, replace(opts, splits=()))
    lowest = _split_floor(pre, swapped, graph, floor)
    if lowest is not None and budget < lowest.bound and swapped.swap is not None:  # no split plan can fit
        swapped.swap.floor = lowest
        swapped.pass_notes.append(f"split: not tried: {lowest.node!r} does not split ({lowest.unsplit}), and its "
                                  f"floor {format_bytes(lowest.bound)} is above the budget {format_bytes(budget)}")
        return swapped
    pre_nodes = {n.name: n for n in pre.nodes}
    specs: dict[str, SplitSpec] = {}
    best, out = swapped, swapped
    for _ in range(MAX_ROUNDS):
        fl = out.swap.floor if out.swap is not None else None
        if fl is None:
            break
        room = budget - fl.resident
        floor_node = base_node(fl.node)
        k_floor = specs[floor_node].k if floor_node in specs else 0
        k_next = None if floor_node not in pre_nodes else \
            _smallest_k(pre, pre_nodes[floor_node], (fl.working_set + fl.scratch) * max(k_floor, 1), room, k_floor)
        if k_next is None:
            break  # the node that sets the floor cannot be split (further): splitting others lowers nothing
        chosen = dict(specs)
        for ns in _node_sets(out, graph):
            name, ws = ns.node, ns.touched
            base = base_node(name)
            if ws <= room or base not in pre_nodes:
                continue
            k_now = specs[base].k if base in specs else 0
            k = _smallest_k(pre, pre_nodes[base], ws * max(k_now, 1), room, k_now)
            if k is not None:
                chosen[base] = SplitSpec(base, k)
        if chosen == specs:  # no working set above the room, yet the plan misses: the floor's node in more chunks
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
    return best
