"""The recompute pass: valid graphs, backward reads recomputed values, BatchNorm, random ops, idempotence."""

from __future__ import annotations

import pytest

from onnxplan.checkpoint.chain import build_chain
from onnxplan.checkpoint.chen import chen_candidates
from onnxplan.checkpoint.recompute import RECOMPUTE_PHASE, apply_schedule, recompute_pass
from onnxplan.checkpoint.rotor import rotor_schedule, rotor_table
from onnxplan.checkpoint.schedule import FALL, FCK, FNONE, Schedule, encode, segments_schedule, store_all
from onnxplan.checkpoint.sqrt import sqrt_schedule
from onnxplan.errors import ModelError
from onnxplan.ir.analysis import alias_roots, ancestor_sets
from onnxplan.ir.load import read_step
from onnxplan.orders import check_order, memory_model
from onnxplan.pipeline import run_pipeline
from tests.zoo_small import small_artifacts

MODELS = ["mlp", "transformer", "gpt", "resnet18", "vgg16", "nnt-conv-ac-fl"]


@pytest.fixture(scope="module", params=MODELS)
def pre(request):
    g = read_step(small_artifacts(request.param))
    return run_pipeline(g, ["realize", "interleave"])[0]


def schedules(chain):
    c = chain.costs()
    tab = rotor_table(c, sum(c.wabar) * 2, 200)
    lo = tab.min_feasible()
    out = {"sqrt": sqrt_schedule(c), "chen": chen_candidates(c)[1] if len(chen_candidates(c)) > 1 else None,
           "rotor": rotor_schedule(tab, lo) if lo is not None else None,
           "each": Schedule(segments_schedule(chain.length, list(range(1, chain.length))), "each")}
    return {k: v for k, v in out.items() if v is not None}


def check_valid(g):
    """Topological, every value produced once, every read produced before or fed/persistent."""
    produced: dict[str, str] = {}
    for n in g.nodes:
        for i in n.inputs:
            if i and i not in produced:
                v = g.values[i]
                assert v.persistent or i in g.inputs or i in g.initializers or v.vclass.value == "gradient", \
                    f"{n.name} reads {i} before it is produced"
        for o in n.outputs:
            if o:
                assert o not in produced, f"{o} produced by {produced[o]} and {n.name}"
                assert o in g.values
                produced[o] = n.name
    assert len({n.name for n in g.nodes}) == len(g.nodes)
    ancestor_sets(g)  # raises if a control dependency points forward
    check_order(memory_model(g, alias_roots(g)), [n.name for n in g.nodes])


def test_recompute_keeps_the_graph_valid_and_is_idempotent(pre):
    chain = build_chain(pre)
    for name, sched in schedules(chain).items():
        res = apply_schedule(pre, chain, sched)
        runs = sched.executions(chain.length)
        assert res.modified == any(r > 1 for r in runs[1:]), name
        g = res.graph
        check_valid(g)
        copies = [n for n in g.nodes if n.phase == RECOMPUTE_PHASE]
        assert all("@rc" in n.name for n in copies)
        again = apply_schedule(g, chain, sched)
        assert not again.modified and again.graph is g
        # the pass by name replays the same rewrite from the schedule's code
        code = encode(sched.ops, chain.length)
        replay = recompute_pass(code)(pre)
        assert [n.name for n in replay.graph.nodes] == [n.name for n in g.nodes]
        assert not recompute_pass(code)(replay.graph).modified


def test_store_all_changes_nothing(pre):
    chain = build_chain(pre)
    res = apply_schedule(pre, chain, Schedule(store_all(chain.length)))
    assert not res.modified and res.graph is pre


def test_backward_reads_recomputed_values(pre):
    chain = build_chain(pre)
    sched = Schedule(segments_schedule(chain.length, list(range(1, chain.length))), "each")
    g = apply_schedule(pre, chain, sched).graph
    first = sched.first_pass(chain.length)
    by_name = {n.name: n for n in g.nodes}
    for st in chain.stages:
        if first[st.index] == FALL:
            continue
        inner = set(st.saved) - {st.output}
        for b in st.backward:
            assert not inner & set(by_name[b].inputs), f"{b} still reads a dropped value"
    # dropped forward values now die in the forward pass: nothing outside it reads them
    readers = {i for n in g.nodes if n.phase != "forward" for i in n.inputs}
    for st in chain.stages:
        if first[st.index] in (FCK, FNONE):
            assert not (set(st.saved) - {st.output, st.input}) & readers


def test_batchnorm_copies_do_not_update_running_statistics():
    g = run_pipeline(read_step(small_artifacts("resnet18")), ["realize", "interleave"])[0]
    chain = build_chain(g)
    sched = Schedule(segments_schedule(chain.length, list(range(1, chain.length))), "each")
    out = apply_schedule(g, chain, sched).graph
    originals = {n.name: n for n in g.nodes if n.op_type == "BatchNormInternal"}
    copies = [n for n in out.nodes if n.op_type == "BatchNormInternal" and n.phase == RECOMPUTE_PHASE]
    assert copies
    for c in copies:
        orig = originals[c.name.split("@rc")[0]]
        assert c.outputs[1] == c.outputs[2] == ""  # running mean / var: not written again
        assert c.inputs[3:5] == orig.outputs[1:3]  # reads the statistics the original updated
        assert c.outputs[0] and c.outputs[3] and c.outputs[4]  # Y, saved mean, saved inv std
    # after the in-place pass each running statistic is still written by one node only
    final = run_pipeline(out, ["inplace"])[0]
    writers = [n for n in final.nodes for o in n.outputs if o and o.endswith("running_mean")]
    assert len(writers) <= len(originals)


def test_random_ops_are_never_recomputed():
    g = run_pipeline(read_step(small_artifacts("mlp")), ["realize", "interleave"])[0]
    relu = next(n for n in g.nodes if n.op_type == "Relu" and n.phase == "forward")
    relu.op_type, relu.attrs = "Dropout", {"ratio": 0.1}  # a random op (never executed here)
    chain = build_chain(g)
    bad = [st for st in chain.stages if st.nondeterministic]
    assert len(bad) == 1 and "random" in bad[0].nondeterministic
    c = chain.costs()
    for sched in [sqrt_schedule(c), *chen_candidates(c)]:
        assert sched.executions(chain.length)[bad[0].index] == 1
    tab = rotor_table(c, sum(c.wabar) * 2, 100)
    for m in range(tab.slots + 1):
        s = rotor_schedule(tab, m)
        if s is not None:
            assert s.executions(chain.length)[bad[0].index] == 1
    forced = Schedule(segments_schedule(chain.length, list(range(1, chain.length))), "each")
    with pytest.raises(ModelError, match="cannot be recomputed"):
        apply_schedule(g, chain, forced)
    note = apply_schedule(g, chain, sqrt_schedule(c)).notes
    assert any("never recomputed" in x for x in note)
