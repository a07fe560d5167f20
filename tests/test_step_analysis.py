"""The step analysis (onnxplan/step_analysis.py): computed once per graph, cached on it, new for a
rewritten graph; what it says agrees with the graph it analyses."""

from __future__ import annotations

from onnxplan.ir.analysis import alias_roots
from onnxplan.pipeline import run_pipeline
from onnxplan.step_analysis import forget_analysis, step_analysis
from tests.graphs import three_linear_step


def test_cached_on_the_graph_and_new_for_a_rewritten_graph():
    g = run_pipeline(three_linear_step(), ["realize", "interleave"])[0]
    a = step_analysis(g)
    assert step_analysis(g) is a
    post = run_pipeline(g, ["inplace"])[0]
    assert step_analysis(post) is not a and step_analysis(g) is a  # the pass rewrote a copy
    copy = g.copy()
    assert step_analysis(copy) is not a and step_analysis(copy) == a
    g.nodes = list(g.nodes[:-1])  # a replaced node list is a new graph to the cache
    assert step_analysis(g) is not a
    b = step_analysis(g)
    forget_analysis(g)
    assert step_analysis(g) is not b


def test_what_it_says_agrees_with_the_graph():
    g = run_pipeline(three_linear_step("AdamW"), ["realize", "interleave", "inplace"])[0]
    a = step_analysis(g)
    assert list(a.index) == [n.name for n in g.nodes] and all(a.nodes[n.name] is n for n in g.nodes)
    for n in g.nodes:
        assert all(a.producer[o] == n.name for o in n.outputs if o)
        assert all(n.name in a.consumers[i] for i in n.inputs if i)
    assert all(len(set(rs)) == len(rs) for rs in a.consumers.values())
    assert a.roots == alias_roots(g)
    assert {v for vs in a.members.values() for v in vs} == set(g.values)
    assert all(a.roots[v] == r for r, vs in a.members.items() for v in vs)  # both directions agree
    # AdamW: each parameter and both moments are updated, in place after the in-place pass
    params = set(g.optimizer["params"])
    assert params <= {u.state for u in a.state_updates}
    assert all(a.in_place(u) and a.nodes[u.node].phase == "optimizer" for u in a.state_updates)
    assert all(u in a.updates_of[u.node] for u in a.state_updates)
    assert not a.random


def test_without_the_in_place_pass_state_updates_are_copies():
    g = run_pipeline(three_linear_step(), ["realize", "interleave"])[0]
    a = step_analysis(g)
    assert a.state_updates and not any(a.in_place(u) for u in a.state_updates)
