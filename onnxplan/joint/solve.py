"""The joint CP-SAT model: recompute (Checkmate) and paging (POET) per buffer per stage, one budget.

Variables, over the stages t = 1..T of a JointProblem (onnxplan.joint.problem):
  R[t,n]  recompute forward node n right before stage t's anchor (only deterministic nodes);
  S[t,b]  keep buffer b in memory from stage t-1 into t (S[1,b]: held past the forward pass);
  O[b]    write b to the swap store after its last forward use (swappable buffers, a bandwidth given);
  I[t,b]  page b in for stage t, issued at the start of stage t-1 (one stage of lookahead);
  E[t,b]  page b in for stage t, issued early: at the start of the latest stage s(t,b) <= t-2
          whose compute up to stage t hides its transfer (evaluate.early_issue), held from there.
Present P[t,b] = S[t,b] + R[t,producer(b)] + I[t,b] + E[t,b] <= 1. Constraints: an anchor's buffers are
present; a recomputation's input buffers are present (recomputed earlier in the same stage
counts); S[t+1,b] <= P[t,b]; I <= O; a paged buffer is never recomputed. Memory, in 64-byte
units, with each EO's fixed bytes (scratch included):
  forward EO e: fixed + decided buffers between producer and last forward reader
                + sum S[1,b] (buffers past their last forward reader) + O[b] while its write
                runs (the forward EOs after its last reader whose compute hides it, at least one);
  stage t, its anchor: max fixed over the stage + sum S[t,b] + the restored buffers the anchor reads
                or that are kept into t+1 (Z[t,b] >= S[t+1,b] - S[t,b]) + I[t+1,b] (prefetch)
                [+ writes still pending];
  stage t, recomputing n (forward order): fixed bytes carried into the stage + sum S[t,b] + the
                restored buffers still held (made by n or before it and read by n or a later
                node, else only if held for the anchor) + prefetch + scratch of n.
Objective: extra seconds = sum R[t,n] * cost(n) + TRANSFER_SECONDS per page-out and page-in
+ the larger of the I/O thread's CPU (problem.io_cpu_per_byte per byte moved) and the exposed
transfer time, where one I/O worker hides the writes behind the forward pass and
stage t's page-ins behind stage t-1's compute (its recomputations included): stall_t >= in_t /
bandwidth - compute_{t-1}; an early page-in costs what its window leaves exposed (the worker's
other transfers not counted: evaluate.step_seconds prices every schedule returned on
onnxplan.swap.pricing's worker, shared, and the rounds and the descent compare by it). Every
solve of one call shares its time limit (a deadline for the whole call).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from onnxplan.ir.graph import StepGraph
from onnxplan.joint.bounds import recompute_stages, relaxation_bound
from onnxplan.joint.evaluate import (
    alive_at,
    consumers,
    early_issue,
    memory,
    minimal_keeps,
    step_seconds,
    violations,
)
from onnxplan.joint.hints import RotorColumns, keep_all, page_hint, recompute_all, rotor_hint
from onnxplan.joint.lower import encode_recompute
from onnxplan.joint.problem import Decisions, JointProblem, build_problem
from onnxplan.limits import DEFAULT_TIME_LIMIT
from onnxplan.swap.pricing import TRANSFER_SECONDS

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

__all__ = ["TIME_UNIT", "JointSchedule", "descend", "solve_joint", "solve_problem"]

TIME_UNIT = 1e-7  # seconds per unit of the integer objective
BYTE_UNIT = 64  # every size in the model is aligned to it
MIN_SOLVE_SECONDS = 0.1  # the least time limit a CP-SAT solve is given (past the deadline: a last try)


@dataclass
class JointSchedule:
    """The solver's answer: its decisions, what the model predicts, and how it was found."""

    problem: JointProblem
    decisions: Decisions
    budget: int  # the budget solved for (bytes, persistent included)
    estimate_bytes: int  # the model's peak for the decisions (persistent included)
    predicted_seconds: float  # step time: every node once + recomputations + exposed transfers
    recompute_seconds: float
    stall_seconds: float
    status: str  # OPTIMAL | FEASIBLE | UNKNOWN (no solution: the warm start is returned) | "INFEASIBLE
    # (OPTIMAL least memory)": nothing fits the budget, the model's least-peak schedule is returned
    gap: float  # (objective - bound) / objective of the extra seconds; 0 when optimal
    wall_seconds: float
    warm_start: str  # the hint given to the solver
    bandwidth: float | None = None
    notes: list[str] = field(default_factory=list)
    cpsat_limits: list[float] = field(default_factory=list)  # every CP-SAT time limit this solve set (seconds)

    @property
    def fits(self) -> bool:
        return self.estimate_bytes <= self.budget

    @property
    def code(self) -> str:
        """The recompute pass argument that replays the recomputations ('' for none)."""
        return encode_recompute(self.problem, self.decisions)


def solve_joint(graph: StepGraph, budget_bytes: int, costs: Mapping[str, float] | None = None,
                swap_bandwidth: float | None = None, time_limit: float = DEFAULT_TIME_LIMIT, warm_start="auto", *,
                policy: str = "nntrainer", swap_min_bytes: int = 1024, workers: int = 1,
                deterministic_limit: float | None = None, io_cpu_per_byte: float = 0.0) -> JointSchedule:
    """Solve the joint model for `graph` (the step after realize / interleave, as the recompute
    pass sees it) under `budget_bytes` (persistent bytes included). `costs`: seconds per node
    name (a profile; else the FLOP estimate). `swap_bandwidth`: bytes/s of the swap store
    (None: recompute only). `warm_start`: "auto" (the best of no recomputation and rotor's
    schedule for the budget), "none", "rotor", or Decisions."""
    prob = build_problem(graph, costs, policy=policy,
                         swap_min_bytes=swap_min_bytes if swap_bandwidth else None, swap_bandwidth=swap_bandwidth,
                         io_cpu_per_byte=io_cpu_per_byte)
    return solve_problem(prob, budget_bytes, swap_bandwidth, time_limit, warm_start, costs=costs, workers=workers,
                         deterministic_limit=deterministic_limit)


@dataclass
class _Model:
    """The CP-SAT model of one solve and its variables (the module docstring names them)."""

    m: cp_model.CpModel
    cap: int | cp_model.IntVar  # the budget in units (an IntVar when the least memory is what is asked)
    nb: list[int]  # each decided buffer's size in units
    R: dict
    S: dict
    O: dict
    I: dict
    E: dict
    lead: dict  # (t, b) -> (issue stage, exposed seconds) of an early page-in
    held: dict  # stage u -> early page-ins in flight or held there
    jit: list  # node -> the stages it may be recomputed in

    def present(self, prob: JointProblem, t: int, b: int) -> list:
        """The variables that make buffer b present at stage t (at most one is true)."""
        p = prob.buffers[b].producer
        return [x for x in (self.S.get((t, b)), self.I.get((t, b)), self.E.get((t, b)),
                            self.R.get((t, p)) if p >= 0 else None) if x is not None]


def _variables(prob: JointProblem, budget_bytes: int, swap_bandwidth: float | None, least_memory: bool) -> _Model:
    """The model's variables, in the order CP-SAT gets them (it decides the search)."""
    from ortools.sat.python import cp_model  # heavy: import on use

    B = prob.buffers
    m = cp_model.CpModel()
    cap: int | cp_model.IntVar = (budget_bytes - prob.persistent) // BYTE_UNIT
    if least_memory:  # the budget is what to find: the least peak, then the least time at it
        top = (max(prob.fixed) + 2 * sum(b.nbytes for b in B) + max(prob.node_scratch, default=0)) // BYTE_UNIT
        cap = m.new_int_var(0, top, "peak")
    jit = recompute_stages(prob)
    R = {(t, n): m.new_bool_var(f"R{t}_{n}") for n in range(len(prob.nodes)) for t in sorted(jit[n])}
    S = {(t, b): m.new_bool_var(f"S{t}_{b}") for b in range(len(B)) for t in range(1, B[b].last_need + 1)}
    swap = bool(swap_bandwidth) and any(b.swappable for b in B)
    O = {b: m.new_bool_var(f"O{b}") for b in range(len(B)) if swap and B[b].swappable}
    # a page-in is issued a stage ahead: none for stage 1 (keep what the first stage reads)
    I = {(t, b): m.new_bool_var(f"I{t}_{b}") for b in O for t in range(2, B[b].last_need + 1)}
    lead = {}
    for t, b in I:  # (empty without a bandwidth)
        got = early_issue(prob, t, b, swap_bandwidth) if swap_bandwidth else None
        if got is not None:
            lead[t, b] = got
    E = {key: m.new_bool_var(f"E{key[0]}_{key[1]}") for key in lead}
    held: dict[int, list[tuple[int, int]]] = {}
    for (t, b), (s, _) in lead.items():
        for u in range(s, t):
            held.setdefault(u, []).append((t, b))
    return _Model(m, cap, [b.nbytes // BYTE_UNIT for b in B], R, S, O, I, E, lead, held, jit)


def _presence(v: _Model, prob: JointProblem) -> None:
    """At most one way present; an anchor's and a recomputation's inputs present; kept only
    when present the stage before; paged in only when paged out, never recomputed then."""
    m, B = v.m, prob.buffers
    for b in range(len(B)):
        for t in range(1, B[b].last_need + 1):
            terms = v.present(prob, t, b)
            m.add(sum(terms) <= 1)
            if t in B[b].reads:
                m.add_bool_or(terms)
            if t > 1:
                m.add(v.S[t, b] <= sum(v.present(prob, t - 1, b)))
        if b in v.O:
            _paged(v, prob, b)
    for (t, n), r in v.R.items():
        for b in prob.node_inputs[n]:
            m.add(sum(v.present(prob, t, b)) >= r)


def _paged(v: _Model, prob: JointProblem, b: int) -> None:
    for t in range(2, prob.buffers[b].last_need + 1):
        v.m.add_implication(v.I[t, b], v.O[b])
        if (t, b) in v.E:
            v.m.add_implication(v.E[t, b], v.O[b])
    p = prob.buffers[b].producer
    if p >= 0:
        for t in v.jit[p]:
            v.m.add_implication(v.O[b], v.R[t, p].negated())


def _memory(v: _Model, prob: JointProblem) -> None:
    """The memory of every forward EO, every stage's anchor and every recomputation (module docstring)."""
    B, nb, F = prob.buffers, v.nb, prob.n_forward
    for e in range(F):
        terms = [nb[k] * v.S[1, k] for k, b in enumerate(B) if b.last_forward < e]
        terms += [nb[k] * v.O[k] for k, b in enumerate(B) if k in v.O and b.last_forward < e <= b.held_until]
        base = prob.forward_base(e) // BYTE_UNIT
        if terms:
            v.m.add(base + sum(terms) <= v.cap)
    readers = consumers(prob)
    for t in range(1, prob.stages + 1):
        ahead = [nb[k] * v.I[t + 1, k] for k in v.O if (t + 1, k) in v.I]
        ahead += [nb[k] * v.E[tt, k] for tt, k in v.held.get(t, ())]
        if t == 1:
            ahead += [nb[k] * v.O[k] for k in v.O if B[k].held_until >= F]
        restore_held = _anchor_memory(v, prob, t, ahead)
        nodes = sorted({n for (tt, n) in v.R if tt == t})
        if not nodes:
            continue
        live = [k for k in range(len(B)) if B[k].last_need >= t]
        fixed = sum(nb[k] * v.S[t, k] for k in live) + sum(ahead)  # one expression for all of them
        varying = [k for k in live if (t, k) in v.I or (t, k) in v.E
                   or (B[k].producer >= 0 and (t, B[k].producer) in v.R)]
        for n in nodes:
            _recompute_memory(v, prob, t, n, fixed, varying, restore_held, readers)


def _anchor_memory(v: _Model, prob: JointProblem, t: int, ahead: list) -> dict:
    """Stage t's anchor within the budget; returns (t, k) -> the bytes of buffer k restored and
    held at the anchor."""
    B, nb = prob.buffers, v.nb
    at_anchor = []
    restore_held = {}
    for k in range(len(B)):
        if B[k].last_need < t:
            continue
        restore = [x for x in v.present(prob, t, k) if x is not v.S[t, k]]
        at_anchor.append(nb[k] * v.S[t, k])
        if not restore:
            continue
        if t in B[k].reads:
            restore_held[t, k] = sum(nb[k] * x for x in restore)
        elif (t + 1, k) in v.S:  # restored and kept on: held at the anchor too
            z = v.m.new_bool_var(f"Z{t}_{k}")
            v.m.add(z >= v.S[t + 1, k] - v.S[t, k])
            restore_held[t, k] = nb[k] * z
        if (t, k) in restore_held:
            at_anchor.append(restore_held[t, k])
    v.m.add(prob.stage_fixed(t) // BYTE_UNIT + sum(at_anchor) + sum(ahead) <= v.cap)
    return restore_held


def _recompute_memory(v: _Model, prob: JointProblem, t: int, n: int, fixed, varying: list[int],
                      restore_held: dict, readers) -> None:
    """Stage t while it recomputes node n: within the budget (only where it does). `fixed`: what
    every recomputation of the stage holds (each live buffer's copy at the anchor, the page-ins
    ahead); `varying`: the live buffers whose recomputed or paged-in copy n may hold."""
    B, nb = prob.buffers, v.nb
    terms = []
    for k in varying:
        held_for_anchor = restore_held.get((t, k))
        x = v.R.get((t, B[k].producer)) if B[k].producer >= 0 else None
        if x is not None:
            alive = alive_at(prob, k, n, readers)
            if alive:
                terms.append(nb[k] * x)
            elif alive is None and held_for_anchor is not None:
                terms.append(held_for_anchor)
        for x in (v.I.get((t, k)), v.E.get((t, k))):
            if x is None:
                continue
            if any(c >= n for c in readers[k]):
                terms.append(nb[k] * x)
            elif held_for_anchor is not None:
                terms.append(held_for_anchor)
    base = (prob.carried[prob.starts[t - 1]] + prob.node_scratch[n]) // BYTE_UNIT
    v.m.add(base + fixed + sum(terms) <= v.cap).only_enforce_if(v.R[t, n])


def _objective(v: _Model, prob: JointProblem, budget_bytes: int, swap_bandwidth: float | None,
               least_memory: bool) -> int:
    """Minimise recomputation + exposed transfers (least_memory: the peak first); returns the
    relaxation bound added as a constraint (0: none)."""
    m, B, T, O, I, E = v.m, prob.buffers, prob.stages, v.O, v.I, v.E
    # every recomputation and transfer costs at least one unit: none is made for nothing
    cost = [max(1, round(s / TIME_UNIT)) for s in prob.node_seconds]
    handle = max(1, round(TRANSFER_SECONDS / TIME_UNIT))  # the executor's CPU per transfer (onnxplan.swap.pricing)
    objective = [cost[n] * r for (t, n), r in v.R.items()]
    early_cost: dict[tuple[int, int], int] = {}
    cpu: dict[int, int] = {}
    ub = 0
    if O:
        per = {k: round(B[k].nbytes / swap_bandwidth / TIME_UNIT) for k in O}
        ub = sum(per.values())
        objective += [(handle + round(B[k].write_exposed / TIME_UNIT)) * O[k] for k in O]
        objective += [handle * I[key] for key in I]
        early_cost = {key: handle + round(v.lead[key][1] / TIME_UNIT) for key in E}
        objective += [early_cost[key] * x for key, x in E.items()]
        # exposed: the stalls, or the I/O thread's CPU where it is more (evaluate.step_seconds)
        cpu = {k: round(B[k].nbytes * prob.io_cpu_per_byte / TIME_UNIT) for k in O}
        objective.append(_exposed(v, prob, per, ub, cost, cpu))
    lb = 0
    if not least_memory:  # a valid bound CP-SAT's relaxation does not find by itself (it stays near 0)
        lb = int(relaxation_bound(prob, budget_bytes, cost, 2 * handle if O else None))
        if lb > 0:
            m.add(sum(objective) >= lb)
    if least_memory:  # one unit of memory outweighs every second of the objective
        weight = (sum(cost) + handle * (len(O) + len(I)) + sum(early_cost.values()) + 1
                  + ((T + 2) * ub + 3 * sum(cpu.values()) if O else 0))
        m.minimize(v.cap * weight + sum(objective))
    else:
        m.minimize(sum(objective))
    return lb


def _exposed(v: _Model, prob: JointProblem, per: dict, ub: int, cost: list[int], cpu: dict):
    """The variable of the exposed transfer seconds: the larger of the stalls (one I/O worker:
    the writes behind the forward pass, stage t's page-ins behind stage t-1) and the I/O CPU."""
    m, O, I, E, T = v.m, v.O, v.I, v.E, prob.stages
    fst = m.new_int_var(0, ub, "stall_fwd")
    m.add(fst >= sum(per[k] * O[k] for k in O) - round(prob.forward_seconds / TIME_UNIT))
    stalls = [fst]
    for t in range(1, T + 1):
        ins = [per[k] * I[t, k] for k in O if (t, k) in I]
        if not ins:
            continue
        before = 0
        if t > 1:
            before = round(prob.stage_seconds[t - 2] / TIME_UNIT) + sum(
                cost[n] * v.R[t - 1, n] for n in range(len(prob.nodes)) if (t - 1, n) in v.R)
        st = m.new_int_var(0, ub, f"stall{t}")
        m.add(st >= sum(ins) - before)
        stalls.append(st)
    exposed = m.new_int_var(0, (T + 2) * ub + 3 * sum(cpu.values()), "exposed")
    m.add(exposed >= sum(stalls))
    m.add(exposed >= sum(cpu[k] * O[k] for k in O) + sum(cpu[k] * x for (t, k), x in I.items())
          + sum(cpu[k] * x for (t, k), x in E.items()))
    return exposed


def _hint(v: _Model, hint: Decisions, hint_name: str) -> str:
    """The warm start as CP-SAT's hint; returns its name (noting hints it cannot take)."""
    for key, x in v.R.items():
        v.m.add_hint(x, key in hint.recompute)
    if any(key not in v.R for key in hint.recompute):
        hint_name += " (partly outside the just-in-time stages)"
    for key, x in v.S.items():
        v.m.add_hint(x, key in hint.keep)
    for key, x in v.O.items():
        v.m.add_hint(x, key in hint.page_out)
    early = {(t, b) for t, b, _ in hint.early}
    for key, x in v.I.items():
        v.m.add_hint(x, key in hint.page_in and key not in early)
    for key, x in v.E.items():
        v.m.add_hint(x, key in early)
    return hint_name


def _decode(v: _Model, solver) -> Decisions:
    """The decisions of CP-SAT's solution."""
    early = frozenset((*k, v.lead[k][0]) for k, x in v.E.items() if solver.value(x))
    return Decisions(
        frozenset(k for k, x in v.R.items() if solver.value(x)), frozenset(k for k, x in v.S.items() if solver.value(x)),
        frozenset(k for k, x in v.O.items() if solver.value(x)),
        frozenset(k for k, x in v.I.items() if solver.value(x)) | {(t, b) for t, b, _ in early}, early)


@dataclass
class _Solved:
    """What one CP-SAT solve gave."""

    solver: cp_model.CpSolver
    status: cp_model.CpSolverStatus
    name: str
    limits: list[float]


def _run_solver(v: _Model, prob: JointProblem, budget_bytes: int, hint: Decisions | None, time_limit: float,
                deadline: float, least_memory: bool, workers: int, linearization: int,
                deterministic_limit: float | None) -> _Solved:
    """Complete a fitting hint, then solve with what is left of the call but a fifth (kept for
    the descent and the least-memory solve)."""
    from ortools.sat.python import cp_model

    limits = []
    if hint is not None and not least_memory and memory(prob, hint)[0] <= budget_bytes:
        limits.append(max(MIN_SOLVE_SECONDS, min(time_limit / 4, _left(deadline) / 2)))
        _complete_hint(v.m, limits[-1], None if deterministic_limit is None else deterministic_limit / 4)
    solver = cp_model.CpSolver()
    limits.append(max(MIN_SOLVE_SECONDS, 0.8 * _left(deadline)))
    solver.parameters.max_time_in_seconds = limits[-1]
    if deterministic_limit is not None:  # reproducible on a loaded machine (tests)
        solver.parameters.max_deterministic_time = float(deterministic_limit)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    solver.parameters.linearization_level = linearization
    status = solver.solve(v.m)
    return _Solved(solver, status, solver.status_name(status), limits)


def solve_problem(prob: JointProblem, budget_bytes: int, swap_bandwidth: float | None = None,
                  time_limit: float = DEFAULT_TIME_LIMIT, warm_start="auto", *,
                  costs: Mapping[str, float] | None = None, workers: int = 1, linearization: int = 1,
                  least_memory: bool = False, deterministic_limit: float | None = None,
                  page_trials: int | None = None) -> JointSchedule:
    """The joint schedule of `prob` under `budget_bytes` (the module docstring's model), within
    `time_limit` for the whole call: warm start, hint completion, CP-SAT, descent. A budget below
    the model's floor: the least-memory schedule (status INFEASIBLE (...)). `deterministic_limit`:
    every CP-SAT solve also stops at that deterministic time (one worker, seed 0) and the warm
    start and the descent run to their end, so the schedule does not depend on the machine's
    load (`time_limit` then stays only as CP-SAT's wall-clock safety net). `page_trials`: the
    greedy paging warm starts try at most that many schedules each (a bound of work, not time)."""
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    deadline = t0 + time_limit  # the whole call: warm start, hint completion, CP-SAT, descent
    # greedy paging gets at most a fifth of the call; with a deterministic limit nothing but CP-SAT's
    # wall-clock safety net stops on the clock (the same request, the same schedule, loaded or idle)
    soft = None if deterministic_limit is not None else deadline
    hint, hint_name = _warm_start(prob, budget_bytes, warm_start, costs, swap_bandwidth,
                                  None if soft is None else t0 + time_limit / 5, page_trials)
    v = _variables(prob, budget_bytes, swap_bandwidth, least_memory)
    _presence(v, prob)
    _memory(v, prob)
    lb = _objective(v, prob, budget_bytes, swap_bandwidth, least_memory)
    if hint is not None:
        hint_name = _hint(v, hint, hint_name)
    got = _run_solver(v, prob, budget_bytes, hint, time_limit, deadline, least_memory, workers, linearization,
                      deterministic_limit)
    status, bound = got.status, 0.0
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        d = _decode(v, got.solver)
        obj, bound = got.solver.objective_value, got.solver.best_objective_bound
        gap = 0.0 if status == cp_model.OPTIMAL else (obj - bound) / max(obj, 1.0)
    elif status == cp_model.INFEASIBLE and not least_memory:  # the budget is below the model's floor
        floor = solve_problem(prob, budget_bytes, swap_bandwidth, max(MIN_SOLVE_SECONDS, _left(deadline)),
                              hint or warm_start, costs=costs, workers=workers, linearization=linearization,
                              least_memory=True, deterministic_limit=deterministic_limit)
        floor.status, floor.gap = f"INFEASIBLE ({floor.status} least memory)", float("inf")
        floor.cpsat_limits = got.limits + floor.cpsat_limits
        floor.wall_seconds = time.perf_counter() - t0
        return floor
    else:
        d, gap = hint or Decisions(keep=minimal_keeps(prob, ())), float("inf")
        if hint is not None and not least_memory and memory(prob, d)[0] <= budget_bytes:
            d = descend(prob, d, budget_bytes, swap_bandwidth, deadline=soft)
    if status == cp_model.FEASIBLE and not least_memory:
        d = descend(prob, d, budget_bytes, swap_bandwidth, deadline=soft)
    d, notes_hint = _better_hint(prob, d, hint, hint_name, budget_bytes, swap_bandwidth, least_memory)
    bad = violations(prob, d)
    if bad:  # the model and the checker disagree: a bug here
        raise AssertionError(f"joint solver returned an invalid schedule: {bad[0]}")
    peak, _, _ = memory(prob, d)
    secs, rec, stall = step_seconds(prob, d, swap_bandwidth)
    if status in (cp_model.FEASIBLE, cp_model.UNKNOWN) and not least_memory and peak <= budget_bytes:
        # the gap of what is returned (descended; the warm start where CP-SAT found nothing)
        obj = (secs - prob.step_seconds) / TIME_UNIT  # recomputation, transfers handled, stalls
        bound = max(bound if status == cp_model.FEASIBLE else 0, lb)
        gap = max(0.0, (obj - bound) / max(obj, 1.0))
    notes = [(f"joint: {prob.stages} stages, {len(prob.nodes)} recomputable nodes, {len(prob.buffers)} decided "
              f"buffers ({len(v.O)} swappable); {len(v.R) + len(v.S) + len(v.O) + len(v.I) + len(v.E)} booleans; "
              f"{got.name} in {got.solver.wall_time:.2f} s; relaxation bound {lb * TIME_UNIT * 1e3:.2f} ms")]
    notes += [notes_hint] if notes_hint else []
    return JointSchedule(prob, d, budget_bytes, peak, secs, rec, stall, got.name, gap, time.perf_counter() - t0,
                         hint_name, swap_bandwidth, notes, got.limits)


def _better_hint(prob: JointProblem, d: Decisions, hint: Decisions | None, hint_name: str, budget_bytes: int,
                 swap_bandwidth: float | None, least_memory: bool) -> tuple[Decisions, str]:
    """The fitting warm start where it is predicted faster than `d` (CP-SAT's workers may return a
    worse point than it), with the note saying so."""
    if (hint is not None and d is not hint and not least_memory and memory(prob, hint)[0] <= budget_bytes
            and step_seconds(prob, hint, swap_bandwidth)[0] < step_seconds(prob, d, swap_bandwidth)[0]):
        return hint, f"the warm start ({hint_name}) beat CP-SAT's best solution"
    return d, ""


def _left(deadline: float) -> float:
    """Seconds left until `deadline` (perf_counter), never below 0."""
    return max(0.0, deadline - time.perf_counter())


def _complete_hint(m, limit: float, deterministic_limit: float | None = None) -> float:
    """Complete a fitting warm start into a hint of every variable of `m` (the auxiliary ones
    too), by a solve with the hinted variables fixed: CP-SAT takes a complete feasible hint as
    its first solution, where from a partial one it may find none in the time limit (DenseNet,
    5,560 booleans). `deterministic_limit`: CP-SAT's deterministic time limit as well (a
    reproducible stop). Returns the seconds it took."""
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    s = cp_model.CpSolver()
    s.parameters.fix_variables_to_their_hinted_value = True
    s.parameters.max_time_in_seconds = limit
    if deterministic_limit is not None:
        s.parameters.max_deterministic_time = float(deterministic_limit)
    s.parameters.num_workers = 1
    s.parameters.random_seed = 0
    if s.solve(m) in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        xs = [m.get_int_var_from_proto_index(i) for i in range(len(m.proto.variables))]
        values = [s.value(x) for x in xs]
        m.clear_hints()
        for x, v in zip(xs, values):
            m.add_hint(x, v)
    return time.perf_counter() - t0


def descend(prob: JointProblem, d: Decisions, budget: int, bandwidth: float | None = None, *,
            deadline: float | None = None) -> Decisions:
    """`d` with recomputations dropped (one, or all of a stage's at once), costliest first, while
    the schedule stays valid and its model peak fits `budget` (the buffers then kept from their
    last restore): a local descent on CP-SAT's best-so-far, which often leaves memory unused when
    the limit hits. Stops at a local optimum or at `deadline` (perf_counter seconds)."""
    improved = True
    while improved:
        improved = False
        stages = {t for t, _ in d.recompute}
        moves = [frozenset([key]) for key in d.recompute]
        moves += [frozenset(k for k in d.recompute if k[0] == t) for t in stages]
        for move in sorted(set(moves), key=lambda mv: (-sum(prob.node_seconds[n] for _, n in mv), sorted(mv))):
            if deadline is not None and time.perf_counter() > deadline:
                return d
            if not move <= d.recompute:
                continue
            rec = d.recompute - move
            trial = Decisions(rec, minimal_keeps(prob, rec, d.page_in), d.page_out, d.page_in, d.early)
            if not violations(prob, trial) and memory(prob, trial)[0] <= budget and \
                    step_seconds(prob, trial, bandwidth)[0] <= step_seconds(prob, d, bandwidth)[0]:
                d, improved = trial, True
    return d


def _warm_start(prob: JointProblem, budget: int, warm_start, costs, bandwidth,
                deadline: float | None = None, max_trials: int | None = None) -> tuple[Decisions | None, str]:
    if isinstance(warm_start, Decisions):
        return warm_start, "given"
    if warm_start in (None, "", "off"):
        return None, "none"
    options = []
    if warm_start in ("auto", "none"):
        options.append(("no recomputation", keep_all(prob)))
    cols = RotorColumns(prob, costs) if warm_start in ("auto", "rotor") else None  # one table, every budget
    if cols is not None:
        d = rotor_hint(prob, budget, costs, cols)
        if d is not None:
            options.append(("rotor", d))
    if warm_start == "auto" and bandwidth and any(b.swappable for b in prob.buffers):
        options.append(("paging", page_hint(prob, budget, bandwidth, deadline=deadline, max_trials=max_trials)))
        top = memory(prob, keep_all(prob))[0]
        for frac in (0.5, 0.25):  # rotor's schedule for a looser budget, paging for the rest
            d = rotor_hint(prob, int(budget + frac * (top - budget)), costs, cols)
            if d is not None and memory(prob, d)[0] > budget:
                options.append((f"rotor at +{frac:.0%} of the gap, then paging",
                                page_hint(prob, budget, bandwidth, base=d, deadline=deadline,
                                          max_trials=max_trials)))
    if not options:
        return None, "none"
    scored = [(memory(prob, d)[0] <= budget, step_seconds(prob, d, bandwidth)[0], memory(prob, d)[0], name, d)
              for name, d in options]
    fit = [s for s in scored if s[0]]
    if not fit and warm_start == "auto":  # CP-SAT may find no first solution in time: give it one
        d = recompute_all(prob)
        peak = memory(prob, d)[0]
        if peak <= budget:
            fit = [(True, step_seconds(prob, d, bandwidth)[0], peak, "recompute all", d)]
    best = min(fit, key=lambda s: s[1]) if fit else min(scored, key=lambda s: s[2])
    return best[4], best[3]


def schedule_summary(schedule: JointSchedule) -> list[dict]:
    """Per decided buffer: its bytes, the stages it is kept into, the stages it is recomputed in
    (and by which node), its page-out and page-ins, and the predicted extra seconds of its
    choices (recomputations of its producer; transfers at the store's bandwidth, before overlap)."""
    prob, d = schedule.problem, schedule.decisions
    rows = []
    for k, b in enumerate(prob.buffers):
        p = b.producer
        rec = sorted(t for t, n in d.recompute if n == p) if p >= 0 else []
        ins = sorted(t for t, kk in d.page_in if kk == k)
        moved = (len(ins) + (k in d.page_out)) * b.nbytes
        rows.append({
            "buffer": b.root, "bytes": b.nbytes, "kept_into": sorted(t for t, kk in d.keep if kk == k),
            "recomputed_in": rec, "recomputed_by": prob.nodes[p] if rec else "",
            "paged_out": k in d.page_out, "paged_in_for": ins,
            "anchors": [prob.anchors[t - 1] for t in sorted(b.reads)],
            "extra_seconds": len(rec) * (prob.node_seconds[p] if p >= 0 else 0.0)
            + (moved / schedule.bandwidth if schedule.bandwidth else 0.0),
        })
    return rows
