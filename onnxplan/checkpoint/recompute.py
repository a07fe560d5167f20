"""The recompute pass: forward values dropped after their forward uses, recomputed before backward uses."""

from __future__ import annotations

import heapq
from collections import Counter

from onnxplan.checkpoint.chain import Chain, build_chain
from onnxplan.checkpoint.schedule import BWD, FALL, Schedule, decode, encode, simulate
from onnxplan.errors import ModelError
from onnxplan.ir.graph import Node, StepGraph, Value, recompute_suffix
from onnxplan.passes._infra import PassResult
from onnxplan.step_analysis import StepAnalysis, step_analysis

__all__ = ["RECOMPUTE_PHASE", "apply_schedule", "copy_node", "is_recomputed", "read_latest",
           "recompute_pass", "stable_topological"]

RECOMPUTE_PHASE = "recompute"


def is_recomputed(graph: StepGraph) -> bool:
    return any(n.phase == RECOMPUTE_PHASE for n in graph.nodes)


def _needed(a: StepAnalysis, nodes: list[Node], targets: set[str]) -> list[Node]:
    """The nodes of a stage needed to produce `targets`, in stage order."""
    stage = {n.name for n in nodes}
    keep: set[str] = set()
    todo = [a.producer[t] for t in targets if a.producer.get(t) in stage]
    while todo:
        x = todo.pop()
        if x in keep:
            continue
        keep.add(x)
        todo.extend(a.producer[i] for i in a.nodes[x].inputs if a.producer.get(i) in stage)
    return [n for n in nodes if n.name in keep]


def _check(chain: Chain, schedule: Schedule) -> None:
    L = chain.length
    simulate(chain.costs(), schedule.ops)  # ScheduleError if an op's inputs are missing
    first = [s for _, s in schedule.ops[:L]]
    if first != list(range(1, L + 1)) or any(k == BWD for k, _ in schedule.ops[:L]):
        raise ModelError("a persistent schedule starts with one forward pass over every stage")
    runs = schedule.executions(L)
    for st in chain.stages:
        if st.nondeterministic and runs[st.index] > 1:
            raise ModelError(f"stage {st.index} cannot be recomputed: {st.nondeterministic}")


def apply_schedule(graph: StepGraph, chain: Chain, schedule: Schedule) -> PassResult:
    """Rewrite `graph` to run `schedule`; `chain` is build_chain(graph).

    Rewrite rules, for a chain schedule (stages 1..L; see onnxplan.checkpoint.schedule):
      1. the first forward pass keeps the original forward nodes, in file order;
      2. every later forward op of stage l (F_ck, F_none, F_all) becomes copies of the stage's
         forward nodes (those needed for a^l, and for F_all also for a-bar^l), phase "recompute",
         node and value names suffixed "@rc<k>" (k = 1, 2, ... per stage); a copy reads the latest
         version of each forward value, so it starts from the nearest kept value;
      3. the backward nodes of stage l (B^l) read the latest version of every forward value at
         their place in the schedule; forward values nobody reads any more die after their
         forward uses;
      4. node order follows the schedule (copies right before the backward that needs them);
         the first copy of a recomputation runs after the backward op before it in the
         schedule (a control dependency), so no order policy can hoist it into the forward pass;
      5. a copy of an op that updates persistent state in place (BatchNormInternal's running
         statistics) omits those outputs and reads the updated state instead: the statistics
         are updated once per step, by the original node; its batch statistics, output and saved
         mean / inverse std are recomputed exactly (training mode uses the batch's statistics);
      6. a stage with a random op (Dropout, RandomNormal...) never runs twice: the schedule is
         refused and the policies never propose it (the reason is reported).
    The graph stays topologically sorted and every value is produced once. A graph that already
    holds recomputed nodes is left unchanged (the pass is idempotent).
    """
    if is_recomputed(graph):
        return PassResult(graph, False, [])
    _check(chain, schedule)
    L = chain.length
    runs = schedule.executions(L)
    if all(r == 1 for r in runs[1:]):
        return PassResult(graph, False, [])
    a = step_analysis(graph)
    g = graph.copy()
    by_name = {n.name: n for n in g.nodes}
    stage_nodes = {st.index: [by_name[x] for x in st.nodes] for st in chain.stages}
    fwd_names = {x for st in chain.stages for x in st.nodes}
    current: dict[str, str] = {}  # forward value -> its latest version
    seq: list[Node] = [n for n in g.nodes if n.name in fwd_names]
    placed = {n.name for n in seq}
    done: Counter[int] = Counter()
    last_bwd: str | None = None
    copies = 0
    for kind, s in schedule.ops[L:]:
        if kind == BWD:
            for name in chain.stages[s - 1].backward:
                n = by_name[name]
                read_latest(n, current)
                seq.append(n)
                placed.add(name)
                last_bwd = name
            continue
        done[s] += 1
        st = chain.stages[s - 1]
        targets = {st.output, *st.saved} if kind == FALL else {st.output}
        made: set[str] = set()
        for n in _needed(a, stage_nodes[s], targets):
            c = copy_node(g, a, n, recompute_suffix(done[s]), current, made, last_bwd)
            seq.append(c)
            copies += 1
    seq.extend(n for n in g.nodes if n.name not in placed)
    g.nodes = stable_topological(seq)
    extra = sum(chain.stages[s - 1].forward_seconds * (r - 1) for s, r in enumerate(runs) if s and r > 1)
    rerun = sum(1 for r in runs[1:] if r > 1)
    notes = [(f"recompute ({schedule.policy or 'schedule'}): {rerun} of {L} stage(s) run again, "
              f"{copies} node copies, predicted extra forward {extra * 1e3:.3f} ms ({chain.time_source})")]
    notes += [f"recompute: stage {st.index} kept, never recomputed: {st.nondeterministic}"
              for st in chain.stages if st.nondeterministic]
    return PassResult(g, True, notes)


def read_latest(n: Node, current: dict[str, str]) -> None:
    """Point `n`'s inputs and alias sources at the latest version of each forward value."""
    n.inputs = [current.get(i, i) if i else i for i in n.inputs]
    n.aliases = {o: (current.get(src, src), k) for o, (src, k) in n.aliases.items()}


def copy_node(g: StepGraph, a: StepAnalysis, n: Node, suffix: str, current: dict[str, str], made: set[str],
              last_bwd: str | None) -> Node:
    """A recomputed copy of `n` (rules 2, 4, 5 of apply_schedule) into `g`, a copy of the graph
    `a` analyses: its outputs named with `suffix` and made the latest versions; a copy reading
    nothing made in this recomputation runs after `last_bwd`."""
    state = {u.out_index: u.in_index for u in a.updates_of.get(n.name, ())}
    inputs = [current.get(i, i) if i else i for i in n.inputs]
    for j, i in state.items():
        inputs[i] = n.outputs[j]  # the updated statistics: the original wrote them this step
    outputs = []
    for j, o in enumerate(n.outputs):
        if not o or j in state:
            outputs.append("")
            continue
        new = o + suffix
        old = g.values[o]
        g.values[new] = Value(new, old.spec, old.vclass, old.trainable)
        outputs.append(new)
    rename = dict(zip(n.outputs, outputs))
    aliases = {rename[o]: (current.get(src, src), k) for o, (src, k) in n.aliases.items() if rename.get(o)}
    source = not any(i in made for i in inputs)
    after = [last_bwd] if source and last_bwd else []
    c = Node(n.name + suffix, n.op_type, n.domain, inputs, outputs, dict(n.attrs), RECOMPUTE_PHASE,
             aliases, after)
    for o, new in rename.items():
        if new:
            current[o] = new
            made.add(new)
    return c


def stable_topological(seq: list[Node]) -> list[Node]:
    """`seq` reordered only where a node would run before what it needs (Kahn's algorithm,
    ready nodes taken in `seq` order)."""
    pos = {n.name: k for k, n in enumerate(seq)}
    producer = {o: n.name for n in seq for o in n.outputs if o}
    preds = {n.name: ({producer[i] for i in n.inputs if i in producer} | set(n.after)) - {n.name} for n in seq}
    succs: dict[str, list[str]] = {n.name: [] for n in seq}
    for name, ps in preds.items():
        for p in ps:
            if p in succs:
                succs[p].append(name)
    waiting = {name: len([p for p in ps if p in pos]) for name, ps in preds.items()}
    heap = [pos[name] for name, w in waiting.items() if w == 0]
    heapq.heapify(heap)
    out: list[Node] = []
    while heap:
        n = seq[heapq.heappop(heap)]
        out.append(n)
        for s in succs[n.name]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(heap, pos[s])
    if len(out) != len(seq):
        stuck = next(n.name for n in seq if waiting[n.name] > 0)
        raise ModelError(f"recompute: the rewritten graph has a cycle through {stuck!r}")
    return out


def recompute_pass(code: str):
    """The pass for a chain schedule in encode()'s text form: the chain is re-derived from the
    graph (deterministic), so a plan file replays the same rewrite. (Codes on the whole graph,
    "dag.", are onnxplan.checkpoint.dag's; onnxplan.pipeline routes each code to its pass.)"""
    try:
        length, ops = decode(code)
    except ValueError as exc:
        raise ModelError(f"malformed recompute schedule in the pass list: {exc}") from None

    def run(graph: StepGraph) -> PassResult:
        if is_recomputed(graph):
            return PassResult(graph, False, [])
        chain = build_chain(graph)
        if chain.length != length:
            raise ModelError(f"the recompute schedule is for a chain of {length} stages; "
                             f"this graph has {chain.length}")
        return apply_schedule(graph, chain, Schedule(ops, "replay"))

    return run


_ = encode  # the inverse of decode, used by the policies
