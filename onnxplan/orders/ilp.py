"""The `ilp` order policy: OLLA's tensor-lifetime program, solved with OR-Tools CP-SAT."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from onnxplan.ir.graph import StepGraph, ValueClass
from onnxplan.limits import DEFAULT_TIME_LIMIT
from onnxplan.orders.given import given_order
from onnxplan.orders.greedy import greedy_order
from onnxplan.orders.memory_model import MemoryModel, OrderResult, check_order, peak_of_order
from onnxplan.orders.nntrainer import nntrainer_order
from onnxplan.orders.window import improve_by_windows
from onnxplan.progress import solve_cp_sat

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

__all__ = ["VARS_PER_SECOND", "step_windows", "update_pins", "pin_updates", "solve_order", "ilp_policy"]

# Models with more boolean variables than this many per second of time limit are not
# solved: building them alone would eat the budget. The seed order is returned instead.
VARS_PER_SECOND = 10_000  # measured: ~100k variables take ~10 s to build and presolve
TOO_LARGE = "model too large"


def step_windows(mm: MemoryModel) -> tuple[dict[str, int], dict[str, int]]:
    """ASAP and ALAP step of each node when exactly one node runs per step.

    ASAP(v) = number of ancestors of v, ALAP(v) = n - 1 - number of descendants: tighter
    than OLLA's longest-path levels, which allow several nodes per step.
    """
    n = len(mm.nodes)
    bit = {v: 1 << i for i, v in enumerate(mm.nodes)}
    anc: dict[str, int] = {}
    for v in mm.nodes:
        a = 0
        for p in mm.preds[v]:
            a |= anc[p] | bit[p]
        anc[v] = a
    succs = mm.succs()
    desc: dict[str, int] = {}
    for v in reversed(mm.nodes):
        d = 0
        for s in succs[v]:
            d |= desc[s] | bit[s]
        desc[v] = d
    asap = {v: anc[v].bit_count() for v in mm.nodes}
    alap = {v: n - 1 - desc[v].bit_count() for v in mm.nodes}
    return asap, alap


def update_pins(graph: StepGraph, mm: MemoryModel) -> dict[str, int]:
    """OLLA's early weight updates: per-parameter update -> slack after its last predecessor.

    A per-parameter update (an optimizer node that reads one parameter) that nothing
    depends on and whose created buffers nobody reads only frees memory when it runs: it
    is pinned to run within `slack` steps after the last of its predecessors (its
    gradient's producer, or the last reader of the parameter it overwrites). The slack
    counts the pinned updates sharing a predecessor with it, so stacking every update
    right after its last predecessor stays feasible in any order. An un-split optimizer
    (one node for all parameters) gets no pin.
    """
    names = set(mm.nodes)
    touchers = mm.touchers()
    succs = mm.succs()
    updates = []
    for node in graph.nodes:
        u = node.name
        if node.phase != "optimizer" or u not in names or succs[u] or not mm.preds[u]:
            continue
        params = {i for i in node.inputs if i in graph.values
                  and graph.values[i].vclass == ValueClass.PARAMETER}
        dead = all(len(touchers[b]) == 1 and b not in mm.outputs for b in mm.creates[u])
        if len(params) == 1 and dead:
            updates.append(u)
    by_pred: dict[str, set[str]] = {}
    for u in updates:
        for p in mm.preds[u]:
            by_pred.setdefault(p, set()).add(u)
    return {u: len(set().union(*(by_pred[p] for p in mm.preds[u]))) for u in updates}


def pin_updates(mm: MemoryModel, order: Sequence[str], pins: dict[str, int]) -> tuple[str, ...]:
    """`order` with each pinned update moved right after its last predecessor (still valid)."""
    pos = {v: i for i, v in enumerate(order)}
    after: dict[str, list[str]] = {}
    for v in order:
        if v in pins:
            after.setdefault(max(mm.preds[v], key=pos.__getitem__), []).append(v)
    out: list[str] = []
    for v in order:
        if v not in pins:
            out.append(v)
            out.extend(after.get(v, []))
    return tuple(out)


def _count_vars(mm: MemoryModel, asap: dict[str, int], alap: dict[str, int]) -> int:
    n = len(mm.nodes)
    total = sum(alap[v] - asap[v] + 1 for v in mm.nodes)
    creator = mm.creator()
    for b, ts in mm.touchers().items():
        if ts:
            lo = asap[creator[b]] if b in creator else 0 if b in mm.inputs else min(asap[t] for t in ts)
            hi = n - 1 if b in mm.outputs else max(alap[t] for t in ts)
            total += max(0, hi - lo)
    return total


class _Program:
    """OLLA's lifetime program for one memory model (eqs. 1-5, 10-13), CP-SAT flavoured."""

    def __init__(self, mm: MemoryModel, seed: Sequence[str], pins: dict[str, int],
                 asap: dict[str, int], alap: dict[str, int]) -> None:
        from ortools.sat.python import cp_model  # heavy: import on use

        self.mm, self.asap, self.alap, self.n = mm, asap, alap, len(mm.nodes)
        self.seed_pos = {v: i for i, v in enumerate(seed)}
        self.m = m = cp_model.CpModel()
        self.step_terms: list[list] = [[] for _ in range(self.n)]
        self.step_const = [0] * self.n
        self._nodes(pins)
        creator = mm.creator()
        for b, touchers in mm.touchers().items():
            self._buffer(b, creator.get(b), [t for t in touchers if t != creator.get(b)], bool(touchers))
        hint_peak = peak_of_order(mm, seed)
        self.peak = m.new_int_var(0, max(hint_peak, *self.step_const), "peak")
        for t in range(self.n):
            m.add(sum(self.step_terms[t]) + self.step_const[t] <= self.peak)
        m.add_hint(self.peak, hint_peak)
        m.minimize(self.peak)

    def _nodes(self, pins: dict[str, int]) -> None:
        """x[v,t]: one step per node, one node per step, precedences, pins."""
        m, n, sp = self.m, self.n, self.seed_pos
        self.x = {v: {t: m.new_bool_var(f"x[{v},{t}]") for t in range(self.asap[v], self.alap[v] + 1)}
                  for v in self.mm.nodes}
        at_step: list[list] = [[] for _ in range(n)]
        self.pos = {}
        for v, xs in self.x.items():
            m.add_exactly_one(xs.values())
            for t, var in xs.items():
                at_step[t].append(var)
                m.add_hint(var, sp[v] == t)
            self.pos[v] = m.new_int_var(self.asap[v], self.alap[v], f"pos[{v}]")
            m.add(self.pos[v] == sum(t * var for t, var in xs.items()))
            m.add_hint(self.pos[v], sp[v])
        for vars_at_t in at_step:
            m.add_exactly_one(vars_at_t)
        for v in self.mm.nodes:
            for p in self.mm.preds[v]:
                m.add(self.pos[p] + 1 <= self.pos[v])
        for u, slack in pins.items():
            last = m.new_int_var(0, n - 1, f"last_pred[{u}]")
            m.add_max_equality(last, [self.pos[p] for p in self.mm.preds[u]])
            m.add_hint(last, max(sp[p] for p in self.mm.preds[u]))
            m.add(self.pos[u] <= last + slack)

    def _buffer(self, b: str, creator: str | None, readers: list[str], touched: bool) -> None:
        """C (creation) and P (preservation) of one buffer, its bytes at each step.

        P is a constant 1 over OLLA's PRES range and absent outside its MUL range.
        """
        m, n, mm, x, sp = self.m, self.n, self.mm, self.x, self.seed_pos
        size, is_input, is_output = mm.size[b], b in mm.inputs, b in mm.outputs
        if not touched:  # an unread step input still arrives at EO 0
            for t in range(n if is_output else 1) if is_input else ():
                self.step_const[t] += size
            return
        first = -1 if is_input else min(sp[t] for t in [*readers, *([creator] if creator else [])])
        last = n - 1 if is_output else max(sp[t] for t in readers) if readers else first
        c: dict[int, cp_model.IntVar] = {}
        if creator is not None:
            c = x[creator]
            p_lo, fix_lo = self.asap[creator] + 1, self.alap[creator] + 1
        elif is_input:  # created before step 0
            p_lo, fix_lo = 0, 0
        else:  # created by whichever reader runs first
            for t in sorted({t for r in readers for t in x[r]}):
                c[t] = m.new_bool_var(f"c[{b},{t}]")
                m.add(c[t] <= sum(x[r][t] for r in readers if t in x[r]))
                m.add_hint(c[t], t == first)
            m.add_exactly_one(c.values())
            p_lo, fix_lo = min(self.asap[r] for r in readers) + 1, min(self.alap[r] for r in readers) + 1
        p_hi = n - 1 if is_output else max((self.alap[r] for r in readers), default=-1)
        fix_hi = n - 1 if is_output else max((self.asap[r] for r in readers), default=-1)
        p: dict[int, int | cp_model.IntVar] = {}
        for t in range(p_lo, p_hi + 1):
            if fix_lo <= t <= fix_hi:
                p[t] = 1
                self.step_const[t] += size
            else:
                p[t] = kept = m.new_bool_var(f"p[{b},{t}]")
                m.add_hint(kept, first < t <= last)
                self.step_terms[t].append(size * kept)
        for t, created in c.items():
            self.step_terms[t].append(size * created)
        for t, var in p.items():  # (1) not created and preserved at once; (2) preserved chain
            prev = [q for q in (p.get(t - 1), c.get(t - 1)) if q is not None]
            chained = (t > 0 or not is_input) and not any(isinstance(q, int) for q in prev)
            if isinstance(var, int):  # fixed: the chain into it must hold
                if t in c:
                    m.add(c[t] == 0)
                if chained:
                    m.add(sum(prev) >= 1)
                continue
            if t in c:
                m.add(var + c[t] <= 1)
            if chained:
                m.add(var <= sum(prev))
        for r in readers:  # (4) a reader runs only while the buffer is in memory
            for t, var in x[r].items():
                need = p.get(t, 0)
                if creator is None and not is_input:
                    m.add(var <= need + c.get(t, 0))
                elif not isinstance(need, int) or need == 0:  # 0: cannot happen, windows nest
                    m.add(var <= need)
        ends = [q for q in (p.get(n - 1), c.get(n - 1)) if q is not None]
        if is_output and not any(isinstance(q, int) for q in ends):
            m.add(sum(ends) >= 1)


def solve_order(mm: MemoryModel, seed: Sequence[str], *, pins: dict[str, int] | None = None,
                time_limit: float = DEFAULT_TIME_LIMIT, max_vars: int | None = None
                ) -> tuple[tuple[str, ...], bool, int | None, str]:
    """Minimise the peak of live bytes over orders with CP-SAT (OLLA eqs. 1-5, 10-14).

    One node per step: x[v,t] says v runs at step t, t within [ASAP(v), ALAP(v)]. A buffer
    is created (C) when its creator runs (a buffer fed from outside: by its first reader;
    a step input: before step 0), preserved (P) only if created or preserved the step
    before, must be preserved wherever a reader runs, and the bytes created or preserved
    at each step are at most the peak. `seed` (a valid order) is the complete hint;
    `pins` (update -> slack) add pos(update) <= max(pos(its predecessors)) + slack.
    Returns (order, optimal, bound, note), bound the proven lower bound on the peak; the
    seed with optimal False and bound None when the model is too large or no solution
    came back in time.
    """
    from ortools.sat.python import cp_model  # heavy: import on use

    start = time.perf_counter()
    pins, seed = pins or {}, tuple(seed)
    if not mm.nodes:
        return seed, True, 0, "empty graph"
    asap, alap = step_windows(mm)
    for u, slack in pins.items():
        alap[u] = min(alap[u], max(alap[p] for p in mm.preds[u]) + slack)
    nvars = _count_vars(mm, asap, alap)
    limit = max_vars if max_vars is not None else int(VARS_PER_SECOND * time_limit)
    if nvars > limit:
        return seed, False, None, f"{TOO_LARGE} ({nvars} variables > {limit}): kept the seed order"
    prog = _Program(mm, seed, pins, asap, alap)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, time_limit - (time.perf_counter() - start))
    solver.parameters.num_workers = max(1, min(8, os.cpu_count() or 1))
    # probing spends seconds in presolve on these models and rarely pays back (measured)
    solver.parameters.cp_model_probing_level = 0
    status = solve_cp_sat(solver, prog.m, "ILP order")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return seed, False, None, (f"no solution within {time_limit:g} s "
                                   f"({solver.status_name(status)}): kept the seed order")
    order = tuple(sorted(mm.nodes, key=lambda v: solver.value(prog.pos[v])))
    check_order(mm, order)
    bound = math.ceil(solver.best_objective_bound - 1e-6)  # a float, sometimes 93.999...
    note = f"cp-sat {solver.status_name(status).lower()} in {solver.wall_time:.2f} s, {nvars} variables"
    return order, status == cp_model.OPTIMAL, bound, note


def ilp_policy(graph: StepGraph, mm: MemoryModel, *, time_limit: float = DEFAULT_TIME_LIMIT) -> OrderResult:
    """OLLA's ILP seeded with the best heuristic order; never worse than that seed."""
    start = time.perf_counter()
    seeds = [given_order(mm), nntrainer_order(graph, mm), greedy_order(mm)]
    seed = min(seeds, key=lambda o: peak_of_order(mm, o))
    seed_peak = peak_of_order(mm, seed)
    pins = update_pins(graph, mm)
    hint = pin_updates(mm, seed, pins)
    if peak_of_order(mm, hint) > seed_peak:  # pinning never helps here: solve without pins
        pins, hint = {}, seed
    remaining = max(0.1, time_limit - (time.perf_counter() - start))
    order, optimal, bound, note = solve_order(mm, hint, pins=pins, time_limit=remaining)
    notes = [note]
    if bound is None and note.startswith(TOO_LARGE):  # decompose: one window of EOs at a time
        remaining = max(0.1, time_limit - (time.perf_counter() - start))
        res = improve_by_windows(mm, hint, time_limit=remaining, solve=solve_order)
        order, optimal = res.order, False
        notes.append(res.note)
        pins = {}
    peak = peak_of_order(mm, order)
    if pins and bound is not None:
        notes.append(f"{len(pins)} updates pinned after their gradients (early weight update); "
                     "optimality is proven within that restriction")
    if peak > seed_peak:  # cannot happen with the hint kept; guard the promise anyway
        order, peak, optimal = seed, seed_peak, False
        notes.append("kept the seed order (better than the solution found)")
    gap = None if bound is None else 0.0 if peak == 0 else max(0.0, (peak - bound) / peak)
    return OrderResult("ilp", order, peak, time.perf_counter() - start, optimal, gap, tuple(notes))
