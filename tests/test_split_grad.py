"""passes/split_grad.py: a ConvGrad split into its dW and dX halves changes no bit and lowers
the working set of the backward pass."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan.executor.runner import Executor, initial_parameters, step_batches
from onnxplan.ir.load import read_step
from onnxplan.orders import memory_model
from onnxplan.passes.split_grad import split_grad
from onnxplan.pipeline import run_pipeline
from onnxplan.planning import PlanOptions, plan_step
from tests.zoo_small import small_artifacts

CONV_NETS = ("vgg16", "resnet18")


def _run(graph, folder, steps=3):
    res = plan_step(graph, PlanOptions(planner="best-fit"))
    ex = Executor(res.graph, res.plan)
    ex.load_state(initial_parameters(folder))
    losses = [ex.step(b) for b in step_batches(folder, steps, 0)]
    return res, losses, ex.parameters()


def test_a_conv_without_dx_is_left_alone():
    """nnt-conv2d's one conv reads the step input: ORT computes no dX for it, nothing to split."""
    g = read_step(small_artifacts("nnt-conv2d"))
    assert any(n.op_type == "ConvGrad" for n in g.nodes) and not split_grad(g).modified


@pytest.mark.parametrize("name", CONV_NETS)
def test_split_run_equals_fused_run_bit_for_bit(name):
    folder = small_artifacts(name)
    g = read_step(folder)
    split = split_grad(g)
    assert split.modified and split_grad(split.graph).modified is False  # idempotent
    fused_nodes = [n for n in g.nodes if n.op_type == "ConvGrad" and n.outputs[0]]
    assert sum(n.op_type == "ConvGradInput" for n in split.graph.nodes) == len(fused_nodes) > 0
    base_res, base_losses, base_params = _run(g, folder)
    res, losses, params = _run(split.graph, folder)
    assert losses == base_losses
    assert params.keys() == base_params.keys()
    for k, v in base_params.items():
        assert np.array_equal(params[k], v), k
    # the measured-vs-planned promise holds for the split plan too (the executor checks its arena)
    assert res.plan.peak_bytes > 0


def test_dx_half_does_not_read_x_and_lowers_the_working_set():
    """vgg16 (its first conv's gradient at 32x32): fused, X + dY + dX + dW are live at one node;
    split, no node holds both X and dX."""
    folder = small_artifacts("vgg16")
    g = run_pipeline(read_step(folder), ["realize", "interleave"])[0]
    s = split_grad(g).graph

    def widest(graph, ops):  # the most bytes one node of `ops` touches (transient buffers)
        mm = memory_model(graph)
        kind = {n.name: n.op_type for n in graph.nodes}
        return max(sum(mm.size.get(b, 0) for b in {*mm.creates[n], *mm.reads[n]})
                   for n in mm.nodes if kind[n] in ops)

    dx_nodes = [n for n in s.nodes if n.op_type == "ConvGradInput"]
    x_of = {n.name: n.inputs[1] for n in g.nodes if n.op_type == "ConvGrad"}
    for n in dx_nodes:
        assert x_of[n.name.removesuffix("/dX")] not in n.inputs
    fused, halves = widest(g, {"ConvGrad"}), widest(s, {"ConvGrad", "ConvGradInput"})
    assert halves < fused


def test_split_grad_through_the_cli_plan_file_and_budget(tmp_path):
    """plan --split-grad records the pass and the setting; the plan file runs; a budget under
    the fused swap floor is reached by swap on the split graph without asking for it."""
    import json

    from typer.testing import CliRunner

    from onnxplan.cli.app import app

    runner = CliRunner()
    folder = str(small_artifacts("vgg16", "sgd"))  # with AdamW an update sets the swap floor
    out = tmp_path / "plan.json"
    res = runner.invoke(app, ["plan", folder, "--split-grad", "--json", "-o", str(out)])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(out.read_text())
    assert "split-grad" in doc["passes"] and doc["settings"]["split_grad"] is True
    ran = runner.invoke(app, ["run", "--plan", str(out), "--steps", "1", "--no-measure", "--json"])
    assert ran.exit_code == 0, ran.stderr
    doc["settings"]["split_grad"] = False  # a plan whose settings disagree with its passes
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    refused = runner.invoke(app, ["run", "--plan", str(bad), "--steps", "1", "--no-measure"])
    assert refused.exit_code == 2 and "split_grad" in refused.stderr
    # the fused graph's swap floor, then a budget between it and the split graph's floor
    floor = {}
    for flag in ([], ["--split-grad"]):
        r = runner.invoke(app, ["plan", folder, "--swap", "on-demand", "--budget", "1KiB", "--json", *flag])
        assert r.exit_code == 3
        floor[bool(flag)] = json.loads(r.stdout)["peak_bytes"]
    assert floor[True] < floor[False]
    budget = (floor[True] + floor[False]) // 2
    r = runner.invoke(app, ["plan", folder, "--budget", f"{budget}B", "--json"])
    assert r.exit_code == 0, r.stderr
    chosen = json.loads(r.stdout)
    assert chosen["peak_bytes"] <= budget and "split-grad" in chosen["passes"]


def test_split_grad_with_a_recompute_schedule_replays_and_changes_no_bit():
    """split-grad runs before the recompute pass, so a schedule made on the split graph (rotor
    here, the joint solver's 'dag.' codes alike) indexes the graph the pass replays it on; the
    plan file round trip adopts it and the run equals the plain run bit for bit."""
    from onnxplan.budget.checkpoint import plan_with_checkpoint
    from onnxplan.executor.prepare import adopt_plan
    from onnxplan.plan import Plan

    folder = small_artifacts("resnet18", "sgd")
    g = read_step(folder)
    plain = plan_step(g, PlanOptions(planner="best-fit"))
    budget = int(plain.plan.peak_bytes * 0.8)
    res = plan_with_checkpoint(g, PlanOptions(planner="best-fit", split_grad=True, budget=budget), "rotor")
    passes = list(res.plan.passes)
    rc = [p for p in passes if p.startswith("recompute:")]
    assert rc and rc[0].partition(":")[2] and passes.index("split-grad") < passes.index(rc[0])
    import json

    loaded = Plan.from_json(json.loads(res.plan.dumps()))
    graph = adopt_plan(read_step(folder), loaded)

    def run(graph, plan):
        ex = Executor(graph, plan)
        ex.load_state(initial_parameters(folder))
        return [ex.step(b) for b in step_batches(folder, 3, 0)], ex.parameters()

    base_losses, base_params = run(plain.graph, plain.plan)
    losses, params = run(graph, loaded)
    assert losses == base_losses
    for k, v in base_params.items():
        assert np.array_equal(params[k], v), k


def test_the_joint_solver_plans_a_recompute_schedule_on_the_split_graph():
    """A joint 'dag.' recompute code indexes the nodes of the graph it was solved on; with
    split-grad that graph has the dX halves, and the recompute pass replays it there."""
    from onnxplan.joint import plan_joint

    folder = small_artifacts("resnet18", "sgd")
    g = read_step(folder)
    plain = plan_step(g, PlanOptions(planner="best-fit", split_grad=True))
    out, sched = plan_joint(g, int(plain.plan.peak_bytes * 0.8), PlanOptions(planner="best-fit", split_grad=True),
                            time_limit=2.0, rounds=1, swap_on_top=False)
    passes = list(out.plan.passes)
    rc = [p for p in passes if p.startswith("recompute:dag.")]
    assert rc and passes.index("split-grad") < passes.index(rc[0])
    assert any(n.op_type == "ConvGradInput" for n in out.graph.nodes)
