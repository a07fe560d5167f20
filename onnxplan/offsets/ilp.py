"""OLLA's address ILP with CP-SAT: pyramid pre-placement, seeded, never worse than its seed."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from onnxplan.limits import DEFAULT_TIME_LIMIT
from onnxplan.offsets.best_fit import best_fit_offsets
from onnxplan.offsets.buffers import ALIGNMENT, Buffer, OffsetPlan, lower_bound, unique_buffers
from onnxplan.offsets.greedy_size import greedy_size_offsets
from onnxplan.offsets.sort import sort_offsets
from onnxplan.progress import solve_cp_sat

__all__ = ["DECOMPOSE_ABOVE", "ilp_offsets", "best_heuristic_offsets", "pyramid_preplacement"]

# Above this many sized buffers the address ILP is solved window by window (_decomposed).
DECOMPOSE_ABOVE = 600
# a search stops at wall_guard(its deterministic time limit) of wall time whatever it has done:
# only a machine loaded several times over its cores reaches it (then runs may differ). CP-SAT's
# deterministic time leaves out its fixed costs (presolve, the model's load: ~0.5 s of wall for
# 0.04 of deterministic time on 210 buffers here, 5 s with the cores loaded 3x over), so a guard
# of a multiple alone stopped short searches at a point the load chose (a plan differed between
# `plan` and `run` in CI); the floor keeps it a guard against a hang
WALL_GUARD = 4.0
WALL_GUARD_FLOOR_SECONDS = 20.0
WINDOW_BUFFERS = 150  # buffers wholly inside one window

_HEURISTICS = (best_fit_offsets, greedy_size_offsets, sort_offsets)


def best_heuristic_offsets(buffers: Iterable[Buffer]) -> OffsetPlan:
    """The smallest arena among the fast planners (best-fit, greedy-size, sort, in that order)."""
    bufs = list(buffers)
    return min((planner(bufs) for planner in _HEURISTICS), key=lambda p: p.arena_bytes)


def pyramid_preplacement(buffers: Iterable[Buffer]) -> dict[str, int]:
    """OLLA's Function 5: stack nested activations of decreasing span from address 0.

    Picks the activation with the longest lifetime, then repeatedly the longest one whose
    lifetime lies inside the previous pick's, each placed right above the previous. Only
    buffers with vclass "activation", a size and a span of at least one EO are candidates;
    ties go to the larger buffer, then by name. Returns name -> offset in bytes.
    """
    candidates = sorted(
        (b for b in buffers if b.vclass == "activation" and b.nbytes and b.last > b.first),
        key=lambda b: (b.first - b.last, -b.padded, b.name),
    )
    placed: dict[str, int] = {}
    base, min_start, max_end = 0, 0, None
    # one pass suffices: a longer-lived candidate skipped earlier cannot nest in a later pick
    for b in candidates:
        if b.first < min_start or (max_end is not None and b.last > max_end):
            continue
        placed[b.name] = base
        base += b.padded
        min_start, max_end = b.first, b.last
    return placed


def wall_guard(time_limit: float) -> float:
    """Wall seconds a search with a deterministic limit of `time_limit` may take at most."""
    return WALL_GUARD * time_limit + WALL_GUARD_FLOOR_SECONDS


def ilp_offsets(
    buffers: Iterable[Buffer],
    *,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
    seed_plan: OffsetPlan | None = None,
) -> OffsetPlan:
    """OLLA's address assignment (eq. 15) as CP-SAT NoOverlap2D boxes (EO span x bytes).

    The model is in ALIGNMENT units; the arena is minimised between the live-bytes lower bound
    and the seed's arena; the seed (given, or the best heuristic) is the solver's hint. First
    the pyramid of activations (section 4.5) is fixed and only the rest is solved, for up to
    half the time; then, unless the lower bound is reached, the full model gets the rest of
    the time with the best plan so far as its hint. The seed is returned (relabelled) when
    the solver finds nothing better. optimal is True when the arena equals the lower bound or
    CP-SAT proved the full model optimal; gap = (arena - proven bound) / arena.

    The time limit is CP-SAT's deterministic time (its count of work, about a second of one
    core each), spent by one worker with a fixed seed: the same buffers give the same offsets
    in every process and under any load (a wall-clock limit stopped the search at a point the
    machine's load chose, so a budget's plan changed from call to call). A wall-clock guard of
    wall_guard(limit) stops a search on a machine so loaded it would run on.
    """
    start = time.perf_counter()
    bufs = unique_buffers(buffers)
    seed = seed_plan if seed_plan is not None else best_heuristic_offsets(bufs)
    if sum(1 for b in bufs if b.nbytes) > DECOMPOSE_ABOVE:
        return _decomposed(bufs, seed, time_limit, start)
    best = {b.name: seed.offsets[b.name] // ALIGNMENT for b in bufs if b.nbytes}
    best_arena = seed_units = -(-seed.arena_bytes // ALIGNMENT)
    bound = lower_bound(bufs) // ALIGNMENT
    proven = False

    spent = 0.0  # deterministic time used so far

    def deadline_left() -> float | None:
        return None if time_limit is None else max(0.0, time_limit - spent)

    pyramid = {n: o // ALIGNMENT for n, o in pyramid_preplacement(bufs).items()}
    if best_arena > bound and len(pyramid) > 1:
        left = deadline_left()
        result = _solve_addresses(
            bufs, pyramid, best, bound, best_arena, None if left is None else left / 2
        )
        if result is not None:
            spent += result[4]
            if result[1] < best_arena:
                best, best_arena = result[0], result[1]
    if best_arena > bound:
        result = _solve_addresses(bufs, {}, best, bound, best_arena, deadline_left())
        if result is not None:
            if result[1] < best_arena:
                best, best_arena = result[0], result[1]
            bound = max(bound, result[2])
            proven = result[3]
    if best_arena < seed_units:
        offsets = {b.name: 0 for b in bufs if not b.nbytes}
        offsets.update({name: unit * ALIGNMENT for name, unit in best.items()})
        arena_bytes = best_arena * ALIGNMENT
    else:  # nothing better found: the seed, as it was
        offsets, arena_bytes = dict(seed.offsets), seed.arena_bytes
    optimal = proven or best_arena <= bound
    gap = 0.0 if optimal or not best_arena else (best_arena - bound) / best_arena
    return OffsetPlan("ilp", offsets, arena_bytes, time.perf_counter() - start, optimal, gap)


def _solve_addresses(
    bufs: Sequence[Buffer],
    fixed: dict[str, int],
    hint: dict[str, int],
    lower: int,
    upper: int,
    time_limit: float | None,
) -> tuple[dict[str, int], int, int, bool, float] | None:
    """Solve eq. 15 in units; returns (offsets, arena, proven bound, optimal, deterministic time
    used) or None. `time_limit`: deterministic time (ilp_offsets)."""
    if time_limit is not None and time_limit <= 0.05:
        return None
    sized = [b for b in bufs if b.nbytes]
    top_fixed = max((fixed[b.name] + b.padded // ALIGNMENT for b in sized if b.name in fixed),
                    default=0)
    if top_fixed > upper:
        return None
    from ortools.sat.python import cp_model  # heavy and optional: import on use

    model = cp_model.CpModel()
    arena = model.new_int_var(max(lower, top_fixed), upper, "arena")
    spans, boxes, offset_vars = [], [], {}
    for b in sized:
        size = b.padded // ALIGNMENT
        low: int | cp_model.IntVar
        if b.name in fixed:
            low = fixed[b.name]
        else:
            if size > upper:
                return None
            var = model.new_int_var(0, upper - size, f"a_{b.name}")
            offset_vars[b.name] = low = var
            model.add(var + size <= arena)
            model.add_hint(var, hint[b.name])
        spans.append(model.new_fixed_size_interval_var(b.first, b.last + 1 - b.first, ""))
        boxes.append(model.new_fixed_size_interval_var(low, size, ""))
    model.add_no_overlap_2d(spans, boxes)
    model.minimize(arena)
    solver = cp_model.CpSolver()
    if time_limit is not None:
        solver.parameters.max_deterministic_time = time_limit
        solver.parameters.max_time_in_seconds = wall_guard(time_limit)
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    status = solve_cp_sat(solver, model, "ILP offsets")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    offsets = dict(fixed)
    offsets.update({name: solver.value(var) for name, var in offset_vars.items()})
    proven_bound = int(solver.best_objective_bound) if not fixed else lower
    used = float(solver.response_proto.deterministic_time)
    return offsets, int(solver.objective_value), proven_bound, status == cp_model.OPTIMAL, used


def _decomposed(bufs: list[Buffer], seed: OffsetPlan, time_limit: float | None, start: float) -> OffsetPlan:
    """OLLA-style scaling for large graphs: the address ILP on one window of EOs at a time.

    Start from the seed's placement. Repeatedly take an EO where the arena's top is reached
    (a buffer ends there), free the buffers live within a window of EOs around it (about
    WINDOW_BUFFERS of them), fix every other buffer whose lifetime meets a freed one where it
    is, and let the ILP re-place the freed ones minimising the top of that neighbourhood.
    A neighbourhood changes only when its top goes down, so the arena never grows. Stops at
    the live-bytes bound, when every top-setting EO was tried without gain, or at the time
    limit. gap = (arena - live-bytes bound) / arena.
    """
    sized = sorted((b for b in bufs if b.nbytes), key=lambda b: (b.first, b.name))
    units = {b.name: b.padded // ALIGNMENT for b in sized}
    off = {b.name: seed.offsets[b.name] // ALIGNMENT for b in sized}
    bound = lower_bound(bufs) // ALIGNMENT
    tried: set[int] = set()
    spent = 0.0  # deterministic time used (ilp_offsets), and a wall-clock guard
    while True:
        left = None if time_limit is None else time_limit - spent
        arena = max(off[b.name] + units[b.name] for b in sized)
        over_wall = time_limit is not None and time.perf_counter() - start > wall_guard(time_limit)
        if arena <= bound or (left is not None and left <= 0.1) or over_wall:
            break
        peaks = sorted({t for b in sized if off[b.name] + units[b.name] == arena for t in (b.first, b.last)}
                       - tried)
        if not peaks:
            break
        t = peaks[0]
        tried.add(t)
        free = _neighbourhood(sized, t)
        if not free:
            continue
        lo, hi = min(b.first for b in free), max(b.last for b in free)
        names = {b.name for b in free}
        local = [b for b in sized if b.first <= hi and b.last >= lo]
        fixed = {b.name: off[b.name] for b in local if b.name not in names}
        local_top = max(off[b.name] + units[b.name] for b in local)
        share = None if left is None else min(left, max(0.5, left / 4))
        result = _solve_addresses(local, fixed, off, 0, local_top, share)
        spent += result[4] if result is not None else 0.0
        if result is not None and result[1] < local_top:
            off.update(result[0])
            tried.clear()  # the tops moved: every EO may be worth another look
    arena = max((off[b.name] + units[b.name] for b in sized), default=0)
    if arena * ALIGNMENT < seed.arena_bytes:
        offsets = {b.name: 0 for b in bufs if not b.nbytes}
        offsets.update({name: unit * ALIGNMENT for name, unit in off.items()})
        arena_bytes = arena * ALIGNMENT
    else:
        offsets, arena_bytes, arena = dict(seed.offsets), seed.arena_bytes, -(-seed.arena_bytes // ALIGNMENT)
    optimal = arena <= bound
    gap = 0.0 if optimal or not arena else (arena - bound) / arena
    return OffsetPlan("ilp", offsets, arena_bytes, time.perf_counter() - start, optimal, gap)


def _neighbourhood(sized: list[Buffer], t: int) -> list[Buffer]:
    """The buffers wholly inside the widest EO window around t holding <= WINDOW_BUFFERS of them."""
    width, best = 0, [b for b in sized if b.first == t == b.last]
    while True:
        width = 2 * width + 1
        grown = [b for b in sized if b.first >= t - width and b.last <= t + width]
        if len(grown) > WINDOW_BUFFERS or len(grown) == len(sized):
            return best if len(grown) > WINDOW_BUFFERS else grown
        best = grown
