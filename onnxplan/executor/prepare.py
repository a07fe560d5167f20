"""What a run needs: the artifact folder, the rewritten step graph and a plan checked against it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from onnxplan._version import __version__
from onnxplan.errors import ModelError
from onnxplan.ir.analysis import node_preds
from onnxplan.ir.graph import StepGraph
from onnxplan.loading import LoadRequest, open_step
from onnxplan.offsets import align, lower_bound
from onnxplan.passes.lifetimes import lifetimes
from onnxplan.passes.split import piece_ranges, split_records, split_specs
from onnxplan.pipeline import run_pipeline
from onnxplan.plan import Plan
from onnxplan.planning import PlanOptions, plan_step, verify_plan
from onnxplan.swap.insert import rewrite_graph
from onnxplan.swap.verify import verify_swap_records
from onnxplan.verify import PlanError

__all__ = ["Prepared", "adopt_plan", "check_plan_record", "prepare"]


@dataclass
class Prepared:
    """A plan and the graph it refers to (after the plan's passes), for one artifact folder."""

    folder: Path
    graph: StepGraph  # rewritten by the plan's passes
    plan: Plan


def adopt_plan(graph: StepGraph, plan: Plan) -> StepGraph:
    """Re-run the plan's passes on `graph` and check the plan fits the result before trusting
    it: every check a fresh plan passes, on values recomputed from the graph. The same model
    and graph (name, fingerprint), a pass list the planner writes (its recompute schedule the
    one the checkpoint record names), swap entries that swap planning would write (sizes,
    gaps, names), the same nodes in a topological order, the same buffers (sizes, classes,
    lifetimes), persistent bytes and lower bound, an arena no larger than its buffers need,
    then the independent verifiers (offsets, the swap checker). Returns the rewritten graph.
    A plan made for another graph, or that fails any check (a corrupted or edited file), is a
    ModelError (exit 2)."""
    if plan.model != graph.name:
        raise ModelError(f"the plan is for model {plan.model!r}, not {graph.name!r}")
    if plan.graph_fingerprint and plan.graph_fingerprint != graph.fingerprint():
        raise ModelError(f"the plan does not match {graph.name!r} as loaded: it was made for another graph "
                         f"(fingerprint {plan.graph_fingerprint[:12]}, this one {graph.fingerprint()[:12]}): "
                         "another batch size, --dim, optimizer, loss or model file?")
    try:
        return _adopt(graph, plan)
    except PlanError as exc:
        made = (f" (made by onnxplan {plan.onnxplan_version}, this is {__version__})"
                if plan.onnxplan_version and plan.onnxplan_version != __version__ else "")
        raise ModelError(f"the plan file fails verification{made}: {exc}") from None


def check_plan_record(plan: Plan) -> None:
    """The checks a plan file passes without its model: a pass list the planner writes and a
    checkpoint record naming the recompute pass's schedule (ModelError, exit 2)."""
    try:
        _check_passes(plan)
        _check_checkpoint_record(plan)
    except PlanError as exc:
        raise ModelError(f"the plan file fails verification: {exc}") from None


def _check_passes(plan: Plan) -> None:
    """The pass list must be one the planner writes (planning.pipeline_names), consistent with
    the plan's options and checkpoint record."""
    passes = list(plan.passes)
    recompute = [p for p in passes if p.startswith("recompute:")]
    split = [p for p in passes if p.startswith("split:")]
    expected = ["realize", *(["interleave"] if "interleave" in passes else []),
                *(["split-grad"] if "split-grad" in passes else []), *split[:1], *recompute[:1],
                "inplace-state" if "inplace-state" in passes else "inplace"]
    if passes != expected:
        raise PlanError(f"pass list {passes} is not one the planner writes (realize, [interleave], "
                        "[split-grad], [split:SPLITS], [recompute:SCHEDULE], inplace or inplace-state)")
    specs = split_specs(split[0].partition(":")[2]) if split else ()
    if [(s.node, s.axis, s.k) for s in sorted(specs)] != [(s.node, s.axis, s.k) for s in plan.splits]:
        raise PlanError("the plan's splits are not those of its split pass")
    for key, on in (("interleave", "interleave" in passes), ("inplace", "inplace" in passes),
                    ("split_grad", "split-grad" in passes)):
        if getattr(plan.settings, key) != on:
            raise PlanError(f"settings say {key}={getattr(plan.settings, key)} but the pass list says {on}")


def _check_checkpoint_record(plan: Plan) -> None:
    """The schedule the checkpoint (or joint) record names is the one the recompute pass replays."""
    code = next((p.partition(":")[2] for p in plan.passes if p.startswith("recompute:")), "")
    for what, record in (("checkpoint", plan.checkpoint), ("joint", plan.joint)):
        if record is not None and record.schedule != code:
            raise PlanError(f"the {what} record's schedule {record.schedule[:60]!r} is not the recompute pass's "
                            f"{code[:60]!r}")


def _check_order(g: StepGraph, order: list[str], what: str) -> None:
    """`order` holds every node of `g` once, each after its dependencies."""
    names = {n.name for n in g.nodes}
    missing, unknown = sorted(names - set(order)), sorted(set(order) - names)
    if missing or unknown or len(order) != len(names):
        told = f"{len(missing)} node(s) missing" + (f" (first {missing[0]!r})" if missing else "")
        told += f", {len(unknown)} unknown" + (f" (first {unknown[0]!r})" if unknown else "")
        told += ", a node listed twice" if not (missing or unknown) else ""
        raise ModelError(f"the plan's order does not match {what}: {told}")
    eo = {name: i for i, name in enumerate(order)}
    for node, preds in node_preds(g).items():
        late = [p for p in preds if eo[p] > eo[node]]
        if late:
            raise ModelError(f"the plan's order runs {node!r} (EO {eo[node]}) before its "
                             f"dependency {late[0]!r} (EO {eo[late[0]]})")


def _adopt(graph: StepGraph, plan: Plan) -> StepGraph:
    _check_passes(plan)
    g, _ = run_pipeline(graph, list(plan.passes))
    _check_checkpoint_record(plan)
    if plan.splits != split_records(g, plan.passes):  # node, axis and K are _check_passes's: the ops differ
        raise PlanError("the plan's split ops are not those of the nodes its split pass splits")
    if plan.pieces != piece_ranges(g):
        raise PlanError("the plan's piece ranges are not those the split pass makes")
    what = f"{graph.name!r} after passes {', '.join(plan.passes)}"
    if plan.swaps:  # the swap nodes and the swapped buffers' segments, rebuilt from the plan
        swap_nodes = {s.out_node for s in plan.swaps} | {s.in_node for s in plan.swaps}
        if len(swap_nodes) != 2 * len(plan.swaps):
            raise PlanError("two swap entries name the same swap node")
        base_order = [n for n in plan.order if n not in swap_nodes]
        _check_order(g, base_order, what)
        verify_swap_records(g, base_order, plan.swaps)
        try:
            g = rewrite_graph(g, plan.order, plan.swaps)
        except (KeyError, ValueError) as exc:
            raise ModelError(f"the plan's swaps do not fit {graph.name!r}: {exc}") from None
    order = list(plan.order)
    _check_order(g, order, what)
    lt = lifetimes(g, order)
    derived = {b.name: b for b in lt.buffers}
    planned = {b.name: b for b in plan.buffers}
    for name in sorted(set(derived) | set(planned)):
        d, p = derived.get(name), planned.get(name)
        if d is None or p is None or d.nbytes != p.bytes:
            raise ModelError(
                f"the plan does not fit {graph.name!r} as loaded: buffer {name!r} has "
                f"{p.bytes if p else 'no'} B in the plan and {d.nbytes if d else 'no'} B here "
                "(another batch size, --dim, optimizer or onnxplan version?)")
        if (p.vclass, p.first_eo, p.last_eo, tuple(p.aliases)) != (d.vclass, d.first, d.last, tuple(d.aliases)):
            raise PlanError(f"buffer {name!r}: class {p.vclass}, EO {p.first_eo}..{p.last_eo} in the plan, "
                            f"{d.vclass}, EO {d.first}..{d.last} derived from the order (or other aliases)")
    if len(plan.buffers) != len(planned):
        raise PlanError("a buffer is listed twice")
    if lt.persistent_bytes != plan.persistent_bytes:
        raise ModelError(f"the plan's persistent bytes {plan.persistent_bytes} differ from the "
                         f"model's {lt.persistent_bytes}")
    bound = lt.persistent_bytes + lower_bound(lt.buffers)
    if plan.lower_bound_bytes != bound:
        raise PlanError(f"lower bound {plan.lower_bound_bytes} B in the plan, {bound} B derived")
    most = sum(align(b.nbytes) for b in lt.buffers)  # every buffer end to end: the naive arena
    if plan.arena_bytes > most:
        raise PlanError(f"arena of {plan.arena_bytes} B is larger than all its buffers end to end ({most} B)")
    verify_plan(g, plan)
    return g


def prepare(folder_or_request: str | Path | LoadRequest,
            plan_or_options: Plan | PlanOptions | None = None) -> Prepared:
    """Load the step, then plan it (PlanOptions) or adopt a given Plan."""
    folder, graph = open_step(folder_or_request)
    if isinstance(plan_or_options, Plan):
        return Prepared(folder, adopt_plan(graph, plan_or_options), plan_or_options)
    outcome = plan_step(graph, plan_or_options or PlanOptions())
    return Prepared(folder, outcome.graph, outcome.plan)
