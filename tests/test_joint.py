"""The joint solver: its CP-SAT optimum against brute force, against rotor, and bit-exact runs."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from onnxplan import planning
from onnxplan.joint import build_problem, solve_problem
from onnxplan.joint.bounds import recompute_stages, relaxation_bound
from onnxplan.joint.evaluate import memory, minimal_keeps, step_seconds, violations
from onnxplan.joint.hints import RotorColumns, keep_all
from onnxplan.joint.lower import lower_joint
from onnxplan.joint.problem import Decisions
from onnxplan.joint.solve import TIME_UNIT, descend
from onnxplan.offsets.buffers import live_bytes_by_eo
from onnxplan.passes.lifetimes import lifetimes
from onnxplan.pipeline import run_pipeline
from tests.graphs import GraphBuilder, three_linear_step
from tests.zoo_small import SMALL, small_artifacts

OPTS = planning.PlanOptions(planner="best-fit")
DTIME = 0.3  # CP-SAT's deterministic time limit: the same search on a loaded machine


def _pre(graph):
    return run_pipeline(graph, ["realize", "interleave"])[0]


def two_linear_step(batch: int = 64):
    """Two linear layers with a ReLU between, a sum-of-squares loss, SGD (as three_linear_step)."""
    from onnxplan.ir import TensorSpec, ValueClass

    b = GraphBuilder("two-linear")
    T, G = ValueClass.TEMPORARY, ValueClass.GRADIENT
    b.value("x", (batch, 8), ValueClass.INPUT)
    b.value("lr", (1,), ValueClass.INPUT)
    for i, (k, m) in enumerate([(8, 16), (16, 4)]):
        b.value(f"W{i}", (k, m), ValueClass.PARAMETER, trainable=True)
    b.node("MatMul", ["x", "W0"], ["a0"], [(batch, 16)])
    b.node("Relu", ["a0"], ["r0"])
    b.node("MatMul", ["r0", "W1"], ["y"], [(batch, 4)])
    b.node("ReduceSumSquare", ["y"], ["loss"], [()], keepdims=0)
    b.g.outputs.append("loss")
    b.g.loss = "loss"
    bw = {"phase": "backward", "vclass": T}
    b.node("Scale", ["y"], ["dy"], domain="com.microsoft", **bw)
    b.node("Gemm", ["r0", "dy"], ["dW1"], [(16, 4)], phase="backward", vclass=G, transA=1)
    b.node("Gemm", ["dy", "W1"], ["dr0"], [(batch, 16)], transB=1, **bw)
    b.node("ReluGrad", ["dr0", "r0"], ["da0"], domain="com.microsoft", **bw)
    b.node("Gemm", ["x", "da0"], ["dW0"], [(8, 16)], phase="backward", vclass=G, transA=1)
    params, grads = ["W0", "W1"], ["dW0", "dW1"]
    outs = [f"{p}.updated" for p in params]
    for o, p in zip(outs, params):
        b.value(o, b.g.values[p].spec.shape, ValueClass.PARAMETER, trainable=True)
    b.node("SGDOptimizerV2", ["lr", *params, *grads], ["flag", *outs], [(1,)] * 3,
           domain="com.microsoft", phase="optimizer", vclass=T, num_params=2)
    b.g.values["flag"].spec = TensorSpec("bool", (1,))
    b.g.outputs.extend(outs)
    b.g.optimizer = {"type": "SGD", "params": params, "grads": grads}
    return b.g


def _brute_force(prob):
    """Every set of just-in-time recomputations with the fewest keeps it needs: (model peak,
    recompute seconds, decisions) of each valid one."""
    pairs = sorted((t, n) for n, ts in enumerate(recompute_stages(prob)) for t in ts)
    assert len(pairs) <= 17, "too many for brute force"
    out = []
    for k in range(len(pairs) + 1):
        for rec in itertools.combinations(pairs, k):
            rec = frozenset(rec)
            d = Decisions(rec, minimal_keeps(prob, rec))
            if not violations(prob, d):
                out.append((memory(prob, d)[0], step_seconds(prob, d)[1], d))
    return out


def _agrees_with_brute_force(graph):
    pre = _pre(graph)
    prob = build_problem(pre)
    every = _brute_force(prob)
    assert len(every) > 8
    peaks = sorted({p for p, _, _ in every})
    cost = [max(1, round(s / TIME_UNIT)) for s in prob.node_seconds]
    for budget in peaks[:: max(1, len(peaks) // 6)] + [peaks[-1]]:
        best = min(s for p, s, _ in every if p <= budget)
        assert relaxation_bound(prob, budget, cost) * TIME_UNIT <= best + 1e-12  # the bound CP-SAT is given is valid
        assert relaxation_bound(prob, budget, prob.node_seconds) <= best + 1e-12
        sched = solve_problem(prob, budget, time_limit=10, warm_start="none")
        assert sched.status == "OPTIMAL"
        assert sched.estimate_bytes <= budget
        assert sched.recompute_seconds == pytest.approx(best, rel=1e-6, abs=1e-9)
    # below the least peak of every schedule nothing fits: the least-peak schedule comes back
    floor = solve_problem(prob, peaks[0] - 64, time_limit=10)
    assert floor.status == "INFEASIBLE (OPTIMAL least memory)"
    assert floor.estimate_bytes == peaks[0]
    assert floor.recompute_seconds == pytest.approx(min(s for p, s, _ in every if p == peaks[0]), rel=1e-6, abs=1e-9)


def test_cp_sat_optimum_equals_brute_force():
    _agrees_with_brute_force(two_linear_step())


@pytest.mark.slow
def test_cp_sat_optimum_equals_brute_force_three_layers():
    _agrees_with_brute_force(three_linear_step(batch=64))  # 2**17 recomputation sets, ~15 s


def test_descent_keeps_a_schedule_valid_fitting_and_not_slower():
    """Dropping recomputations from a valid schedule keeps it valid, within the budget, and
    not slower; from every recomputation at once it reaches a schedule no single drop improves."""
    prob = build_problem(_pre(three_linear_step(batch=64)))
    pairs = frozenset((t, n) for n, ts in enumerate(recompute_stages(prob)) for t in ts)
    start = Decisions(pairs, minimal_keeps(prob, pairs))
    assert not violations(prob, start)
    plain = memory(prob, keep_all(prob))[0]
    for budget in (memory(prob, start)[0], (memory(prob, start)[0] + plain) // 2, plain):
        d = descend(prob, start, budget)
        assert not violations(prob, d) and memory(prob, d)[0] <= budget
        assert step_seconds(prob, d)[0] <= step_seconds(prob, start)[0]
        for key in d.recompute:  # a local optimum
            rec = d.recompute - {key}
            trial = Decisions(rec, minimal_keeps(prob, rec))
            assert violations(prob, trial) or memory(prob, trial)[0] > budget
    assert not descend(prob, start, plain).recompute  # the plain memory needs no recomputation


def test_the_model_order_of_least_bound():
    """policy 'auto' builds the problem on the heuristic order of least live-bytes bound."""
    pre = _pre(two_linear_step())
    prob = build_problem(pre, policy="auto")
    assert prob.policy in planning.HEURISTIC_ORDERS and prob.stages >= 1


def test_plan_joint_returns_the_plain_plan_when_it_fits():
    """A budget the plain plan meets gets the plain plan (the model's fixed order may over-count it)."""
    from onnxplan.joint.fit import plan_joint

    graph = three_linear_step(batch=64)
    plain = planning.plan_step(graph, OPTS)
    out, sched = plan_joint(graph, plain.plan.peak_bytes, OPTS, time_limit=5, deterministic_limit=DTIME)
    assert sched.status == "PLAIN" and not sched.decisions.recompute and not out.plan.swaps
    assert out.plan.peak_bytes == plain.plan.peak_bytes and out.plan.joint.status == "PLAIN"


def test_model_peak_bounds_the_lowered_order():
    """The model's peak is at least the live bytes of the lowered graph in the model's order
    (after the in-place pass), for every brute-force schedule: the model never under-counts."""
    pre = _pre(three_linear_step(batch=64))
    prob = build_problem(pre)
    from onnxplan.joint.solve import JointSchedule

    pairs = sorted((t, n) for n, ts in enumerate(recompute_stages(prob)) for t in ts)
    every = []
    for k in range(4):
        for rec in itertools.combinations(pairs, k):
            d = Decisions(frozenset(rec), minimal_keeps(prob, frozenset(rec)))
            every.append((memory(prob, d)[0], 0.0, d))

    for peak, _, d in every[::5]:
        sched = JointSchedule(prob, d, peak, peak, 0.0, 0.0, 0.0, "GIVEN", 0.0, 0.0, "none")
        g = run_pipeline(lower_joint(pre, sched), ["inplace"])[0]
        lt = lifetimes(g, [n.name for n in g.nodes])
        assert lt.persistent_bytes + max(live_bytes_by_eo(lt.buffers)) <= peak


@pytest.mark.parametrize("name", [pytest.param("resnet18", marks=pytest.mark.slow), "transformer"])
def test_not_slower_than_rotor_at_its_memory(name):
    """At the model memory of a rotor schedule, the DAG solver's recomputation costs at most
    rotor's (same costs)."""
    from onnxplan.ir.load import read_step

    prob = build_problem(_pre(read_step(small_artifacts(name))))
    cols = RotorColumns(prob, None)
    rotor = cols.at(cols.lo + (cols.tab.slots - cols.lo) // 3)
    budget = memory(prob, rotor)[0]
    rotor_seconds = step_seconds(prob, rotor)[1]
    assert rotor_seconds > 0
    sched = solve_problem(prob, budget, time_limit=60, deterministic_limit=DTIME)
    assert sched.estimate_bytes <= budget
    assert sched.recompute_seconds <= rotor_seconds + 1e-12
    assert memory(prob, keep_all(prob))[0] > budget  # the budget needs recomputation


def _joint_run_equals_plain(name: str, fraction: float, steps: int = 3):
    from onnxplan.executor.runner import run_plan
    from onnxplan.ir.load import read_step
    from onnxplan.joint.fit import plan_joint

    folder = small_artifacts(name)
    graph = read_step(folder)
    plain = planning.plan_step(graph, OPTS)
    budget = plain.plan.persistent_bytes + int(fraction * plain.plan.arena_bytes)
    out, sched = plan_joint(graph, budget, OPTS, time_limit=60, deterministic_limit=DTIME, rounds=2,
                            swap_on_top=False)
    if not sched.decisions.recompute:
        pytest.skip(f"{name}: no recomputation reaches {fraction:.0%} of the arena in the model")
    assert out.plan.peak_bytes < plain.plan.peak_bytes
    assert any("@rc" in x for x in out.plan.order)
    base = run_plan(str(folder), OPTS, steps=steps)
    res = run_plan(str(folder), replace(OPTS, recompute=sched.code), steps=steps)
    assert res.plan.peak_bytes == out.plan.peak_bytes  # the recompute pass replays the same rewrite
    _same_run(res, base, name)


def _same_run(res, base, name: str) -> None:
    assert res.losses == base.losses, name
    assert res.params.keys() == base.params.keys()
    for k, v in base.params.items():
        assert np.array_equal(res.params[k], v), f"{name} {k}"


def _joint_paging_run_equals_plain(name: str, fraction: float, steps: int = 3):
    """The joint strategy with paging (a slow store: page-ins issued early, writes held) and the
    swap module on top below the model's floor, as a plan file, runs as the plain plan."""
    from onnxplan.executor.runner import run_plan
    from onnxplan.ir.load import read_step
    from onnxplan.joint.fit import plan_joint
    from onnxplan.plan import Plan

    folder = small_artifacts(name)
    graph = read_step(folder)
    plain = planning.plan_step(graph, OPTS)
    budget = plain.plan.persistent_bytes + int(fraction * plain.plan.arena_bytes)
    costly = {n.name: 1e-3 for n in graph.nodes}  # recomputing costs more than paging's handling
    out, sched = plan_joint(graph, budget, OPTS, costs=costly, time_limit=60, deterministic_limit=DTIME, rounds=2,
                            swap_bandwidth=1e7, io_cpu_per_byte=1e-10)
    if not out.plan.swaps:
        pytest.skip(f"{name}: nothing paged at {fraction:.0%} of the arena")
    assert out.plan.peak_bytes < plain.plan.peak_bytes
    plan = Plan.from_json(json.loads(out.plan.dumps()))  # as a plan file: passes replayed, swaps re-checked
    _same_run(run_plan(str(folder), plan, steps=steps), run_plan(str(folder), OPTS, steps=steps), name)


def test_joint_run_equals_plain_transformer():
    _joint_run_equals_plain("transformer", 0.85)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(SMALL) - {"transformer"}))  # transformer: the test above
def test_joint_run_equals_plain_every_zoo_model(name):
    _joint_run_equals_plain(name, 0.9)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMALL))
def test_joint_paging_run_equals_plain_every_zoo_model(name):
    _joint_paging_run_equals_plain(name, 0.8)


def test_joint_swaps_run_equals_plain():
    """With a fast swap store the solver pages buffers out and in; the plan (swap nodes from
    the swap passes, replayed from the plan's records) runs bit for bit as the plain plan."""
    from onnxplan.executor.runner import run_plan
    from onnxplan.ir.load import read_step
    from onnxplan.joint.fit import plan_joint

    folder = small_artifacts("transformer")
    graph = read_step(folder)
    plain = planning.plan_step(graph, OPTS)
    budget = plain.plan.persistent_bytes + int(0.8 * plain.plan.arena_bytes)
    costly = {n.name: 1e-2 for n in graph.nodes}  # recomputing costs more than a transfer's handling
    out, sched = plan_joint(graph, budget, OPTS, costs=costly, time_limit=60, deterministic_limit=DTIME, rounds=1,
                            swap_bandwidth=1e10, swap_on_top=False)  # the joint schedule's own page-ins
    assert sched.decisions.page_in and out.plan.swaps
    assert out.plan.peak_bytes < plain.plan.peak_bytes
    import json

    from onnxplan.plan import Plan

    plan = Plan.from_json(json.loads(out.plan.dumps()))  # as a plan file: passes replayed, swaps re-checked
    res = run_plan(str(folder), plan, steps=3)
    assert res.plan.peak_bytes == out.plan.peak_bytes
    _same_run(res, run_plan(str(folder), OPTS, steps=3), "transformer")


def test_joint_is_an_opt_in_strategy_of_the_budget_layer():
    """The budget layer plans the joint solver only when named; its outcome records the
    schedule (plan.joint, replayed by the recompute pass) and the named strategy."""
    from onnxplan.budget import AUTO_STRATEGIES, STRATEGIES, FlopCosts, MemoryRequest, plan_for_budget
    from onnxplan.plan import Plan

    graph = three_linear_step(batch=64)
    plain = planning.plan_step(graph, OPTS)
    assert "joint" in STRATEGIES and "joint" not in AUTO_STRATEGIES
    budget = plain.plan.persistent_bytes + int(0.8 * plain.plan.arena_bytes)
    auto = plan_for_budget(graph, OPTS, MemoryRequest(budget=budget), FlopCosts())
    # by default: joint-quick (the joint solver on deterministic limits) may win, never the opt-in joint
    assert "joint" not in {c.strategy for c in auto.plan.strategy.candidates} and auto.plan.strategy.chosen != "joint"
    assert (auto.plan.joint is not None) == (auto.plan.strategy.chosen == "joint-quick")
    out = plan_for_budget(graph, replace(OPTS, time_limit=5.0), MemoryRequest(budget=budget, strategy="joint"),
                          FlopCosts())
    j = out.plan.joint
    assert out.plan.strategy.chosen == "joint" and [c.strategy for c in out.plan.strategy.candidates] == ["joint"]
    assert out.plan.peak_bytes <= budget < plain.plan.peak_bytes
    assert j.schedule.startswith("dag.") and f"recompute:{j.schedule}" in out.plan.passes
    assert j.placed_peak_bytes == out.plan.peak_bytes and j.time_source == "time: FLOP estimate"
    assert j.buffers and all(b.recomputed_in or b.paged_out for b in j.buffers)
    assert all(b.extra_seconds > 0 for b in j.buffers)
    back = Plan.from_json(json.loads(out.plan.dumps()))  # the typed section round-trips
    assert back.joint == j


def _fresh_cli(*args: str) -> subprocess.CompletedProcess:
    """The CLI in a fresh process (nothing imported beforehand: replaying a joint plan must
    find the "dag." recompute code's handler by importing onnxplan alone)."""
    return subprocess.run([sys.executable, "-c", "import sys; from onnxplan.cli.app import main; sys.exit(main())",
                           *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_plans_with_the_joint_strategy_and_replays_it_verified(tmp_path):
    """`plan MODEL --strategy joint --budget X -o p.json`, then `run --plan p.json --verify`
    in a fresh process (checked against ONNX Runtime), and `explain` shows each value."""
    from typer.testing import CliRunner

    from onnxplan.budget import choice, decide
    from onnxplan.cli.app import app
    from onnxplan.ir.load import read_step

    folder = small_artifacts("transformer")
    plain = planning.plan_step(read_step(folder), planning.PlanOptions())
    budget = str(plain.plan.persistent_bytes + int(0.85 * plain.plan.arena_bytes))
    p = tmp_path / "p.json"
    runner = CliRunner()
    r = runner.invoke(app, ["plan", str(folder), "--strategy", "joint", "--budget", budget, "--no-profile",
                            "--time-limit", "1", "-o", str(p)])
    assert r.exit_code == 0, r.stderr
    d = json.loads(p.read_text())
    assert d["strategy"]["chosen"] == "joint" and d["peak_bytes"] <= int(budget)
    # the strategy returns the fastest predicted of joint, joint-recompute, rotor and swap
    j = d["joint"]
    assert j["chosen"] in ("joint", "joint-recompute", "recompute", "swap")
    fitting = [c for c in j["candidates"] if c["fits"]]
    fastest = min(c["predicted_step_seconds"] for c in fitting)
    margin = choice.ESTIMATE_MARGIN  # --no-profile: the FLOP estimate's tie margin
    ties = [c["strategy"] for c in fitting if c["predicted_step_seconds"] <= fastest * (1 + margin)]
    assert j["chosen"] == min(ties, key=decide.PREFERENCE.index)  # budget.decide's tie rule
    assert j["schedule"].startswith("dag.") or j["chosen"] != "joint" or d["swaps"]
    r = _fresh_cli("run", "--plan", str(p), "--steps", "2", "--verify", "--no-measure", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["verified"] is True
    r = runner.invoke(app, ["explain", str(p)])
    assert r.exit_code == 0, r.stderr
    assert f"chosen: {j['chosen']}" in r.stdout
    row = next((b for b in d["joint"]["buffers"] if b["recomputed_in"]), None)
    if row is not None:
        assert row["buffer"] in r.stdout and "recomputed" in r.stdout and "swapped" in r.stdout


def test_cli_strategy_is_checked():
    """--strategy outside the registered ones, without a budget, beside --swap, or with --plan: exit 2."""
    from typer.testing import CliRunner

    from onnxplan.cli.app import app
    from tests.cli_asserts import assert_one_line_error

    runner = CliRunner()
    for args, needle in ((["plan", "mlp", "--strategy", "magic", "--budget", "1MiB"], "invalid --strategy"),
                         (["plan", "mlp", "--strategy", "joint"], "needs --budget"),
                         (["plan", "mlp", "--strategy", "joint", "--budget", "1MiB", "--swap", "auto"], "drop --swap"),
                         (["run", "--plan", "p.json", "--strategy", "joint"], "--plan fixes the plan")):
        assert_one_line_error(runner.invoke(app, args), 2, needle)


def test_a_fresh_process_replays_joint_codes():
    """The pass list (onnxplan.pipeline) routes the joint solver's "dag." recompute codes to their
    pass without importing onnxplan.joint or anything else first: nothing registers on import."""
    code = ("from onnxplan.pipeline import find_pass\n"
            "fn = find_pass('recompute:dag.nntrainer.3.1:0')\n"
            "print(fn.__qualname__)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("dag_recompute_pass")


def test_api_plan_takes_a_strategy():
    """onnxplan.plan(step, budget=..., strategy="joint"): the joint plan, which runs as planned."""
    import onnxplan

    step = onnxplan.load("mlp", batch=4)
    plain = onnxplan.plan(step)
    budget = plain.peak_bytes - 64
    plan = onnxplan.plan(step, budget=budget, strategy="joint", planner="best-fit", time_limit=2.0)
    assert plan.strategy.chosen == "joint" and plan.joint is not None and plan.peak_bytes <= budget
    report = onnxplan.run(step, plan, steps=1, warmup=0)
    assert report.peak_bytes == plan.peak_bytes


def _limits(out) -> float:
    """Every CP-SAT time limit the joint rounds of an outcome set (seconds)."""
    return sum(sum(r.cpsat_limits or ()) for r in out.plan.joint.rounds)


def test_the_joint_strategy_returns_a_candidate_predicted_faster_than_its_own_schedule(monkeypatch):
    """Planted: the joint schedule with paging priced 1 s slower than it is. The strategy then
    returns the fastest fitting one of joint-recompute, rotor and swap, says so in plan.joint
    (chosen, every candidate weighed), and that plan replays from its file bit for bit."""
    import onnxplan.budget.joint as bj
    from onnxplan.budget import FlopCosts, choice
    from onnxplan.executor.runner import run_plan
    from onnxplan.ir.load import read_step
    from onnxplan.plan import Plan
    from onnxplan.swap.pricing import StoreRates

    real = choice.price

    def planted(out, times=None, rates=None):
        p = real(out, times, rates)
        j = out.plan.joint
        slow = j is not None and j.swap_bandwidth is not None and j.chosen == "joint" and not j.candidates
        return replace(p, compute=p.compute + 1.0) if slow else p

    monkeypatch.setattr(choice, "price", planted)  # the one price (budget.choice), what weigh calls
    folder = small_artifacts("transformer")
    graph = read_step(folder)
    plain = planning.plan_step(graph, OPTS)
    budget = plain.plan.persistent_bytes + int(0.8 * plain.plan.arena_bytes)
    seen = {}
    out = bj.plan_joint_strategy(graph, budget, FlopCosts(), 2.0, OPTS, total_seconds=20,
                                 rates=StoreRates(2.5e8, 1e-10), seen=seen)
    j = out.plan.joint
    assert set(seen) == {"joint", "recompute", "swap", "joint-recompute"}
    weighed = {c.strategy: c for c in j.candidates}
    assert weighed["joint"].predicted_step_seconds > 1.0
    fitting = [c for c in j.candidates if c.fits]
    assert len(fitting) >= 2 and j.chosen != "joint"
    fastest = min(c.predicted_step_seconds for c in fitting)
    chosen = next(c for c in fitting if c.strategy == j.chosen)
    assert chosen.predicted_step_seconds <= fastest * (1 + choice.ESTIMATE_MARGIN)  # FlopCosts: the estimate's margin
    assert out is seen[j.chosen] and out.plan.peak_bytes <= budget
    assert j.notes[-1].startswith(f"{j.chosen} chosen")
    plan = Plan.from_json(json.loads(out.plan.dumps()))  # its file: passes replayed, records checked
    _same_run(run_plan(str(folder), plan, steps=3), run_plan(str(folder), OPTS, steps=3), "transformer")


def test_the_joint_solves_keep_to_their_total_deadline():
    """Under a total deadline every CP-SAT limit of every round fits in it (each round's limit
    at most the per-round time limit), plan_joint's and the strategy's alike (both variants).
    The limits given to CP-SAT are checked, not the wall clock (machines are noisy)."""
    from onnxplan.budget import FlopCosts
    from onnxplan.budget.joint import plan_joint_strategy
    from onnxplan.ir.load import read_step
    from onnxplan.joint.fit import plan_joint
    from onnxplan.joint.solve import MIN_SOLVE_SECONDS
    from onnxplan.swap.pricing import StoreRates

    folder = small_artifacts("transformer")
    graph = read_step(folder)
    plain = planning.plan_step(graph, OPTS)
    budget = plain.plan.persistent_bytes + int(0.6 * plain.plan.arena_bytes)
    out, _ = plan_joint(graph, budget, OPTS, swap_bandwidth=2.5e8, time_limit=10, rounds=3, total_seconds=2.0)
    rounds = out.plan.joint.rounds
    assert rounds and all(r.time_limit <= 10 for r in rounds if r.time_limit is not None)
    slack = MIN_SOLVE_SECONDS * 3 * len(rounds)  # a solve past its deadline still gets this much
    assert _limits(out) <= 2.0 + slack
    seen = {}
    plan_joint_strategy(graph, budget, FlopCosts(), 10.0, OPTS, total_seconds=3.0, rates=StoreRates(2.5e8, 1e-10),
                        seen=seen)
    assert seen["joint"].plan.joint.rounds  # solved (joint-recompute only where time was left for it)
    spent = sum(_limits(o) for name, o in seen.items() if name.startswith("joint"))
    assert spent <= 3.0 + slack * 2


def test_an_early_page_in_is_issued_where_the_stages_before_hide_it():
    """early_issue: the latest stage whose compute up to the need hides the transfer; where none
    does, the earliest allowed with what stays exposed; none where stage t-1 alone hides it or no
    earlier stage is allowed (the buffer is read there)."""
    from types import SimpleNamespace

    from onnxplan.joint.evaluate import early_issue

    prob = SimpleNamespace(stage_seconds=[1.0, 1.0, 1.0, 1.0],
                           buffers=[SimpleNamespace(nbytes=3, reads=frozenset({4})),
                                    SimpleNamespace(nbytes=3, reads=frozenset({2, 4}))])
    assert early_issue(prob, 4, 0, 1.0) == (1, 0.0)  # 3 s: stages 1, 2 and 3
    assert early_issue(prob, 4, 0, 2.0) == (2, 0.0)  # 1.5 s: stages 2 and 3
    assert early_issue(prob, 4, 0, 0.5) == (1, 3.0)  # 6 s: 3 s exposed from stage 1 on
    assert early_issue(prob, 4, 0, 10.0) is None  # 0.3 s: stage 3 alone hides it
    assert early_issue(prob, 4, 1, 1.0) is None  # read at stage 2: stage 3 is all there is


def test_joint_early_page_ins_run_equals_plain():
    """With a slow store the solver issues page-ins stages ahead (and holds each paged buffer
    while its write runs): the model never under-counts the lowered order's live bytes, and
    the plan, as a plan file, runs bit for bit as the plain plan."""
    from onnxplan.executor.runner import run_plan
    from onnxplan.ir.load import read_step
    from onnxplan.joint.fit import plan_joint
    from onnxplan.plan import Plan

    folder = small_artifacts("transformer")
    graph = read_step(folder)
    plain = planning.plan_step(graph, OPTS)
    budget = plain.plan.persistent_bytes + int(0.8 * plain.plan.arena_bytes)
    costly = {n.name: 1e-3 for n in graph.nodes}
    out, sched = plan_joint(graph, budget, OPTS, costs=costly, time_limit=60, deterministic_limit=DTIME, rounds=1,
                            swap_bandwidth=1e7, swap_on_top=False)
    d = sched.decisions
    assert d.early and not violations(sched.problem, d)
    assert any(s < t - 1 for t, _, s in d.early)
    lt = lifetimes(out.graph, list(out.plan.order))
    assert lt.persistent_bytes + max(live_bytes_by_eo(lt.buffers)) <= sched.estimate_bytes
    # the lowering issues them early: the same page-ins one stage ahead wait longer (exact price)
    from onnxplan.joint.lower import lower_swaps
    from onnxplan.swap.pricing import StoreRates, planned_step

    def stall(o):
        return planned_step(o.graph, o.plan.order, o.plan.swaps, lambda n: costly.get(n.name, 0.0),
                            StoreRates(1e7, 0.0)).stall

    base_opts = replace(OPTS, swap="none", recompute="", budget=None)
    late, _ = lower_swaps(planning.plan_step(graph, replace(base_opts, recompute=sched.code)),
                          replace(sched, decisions=replace(d, early=frozenset())), base_opts.planner)
    assert stall(out) < stall(late)
    plan = Plan.from_json(json.loads(out.plan.dumps()))
    _same_run(run_plan(str(folder), plan, steps=3), run_plan(str(folder), OPTS, steps=3), "transformer")


def test_the_paging_warm_start_is_a_fitting_schedule_of_paging_alone():
    """page_hint pages buffers (no recomputation) until the model fits, each a valid schedule;
    a budget it cannot reach returns its best effort, still valid; the solver may start from it."""
    from onnxplan.ir.load import read_step
    from onnxplan.joint.hints import page_hint

    prob = build_problem(_pre(read_step(small_artifacts("transformer"))), swap_min_bytes=1024, swap_bandwidth=1e9)
    top = memory(prob, keep_all(prob))[0]
    budget = top - (top - prob.persistent) // 20
    d = page_hint(prob, budget, 1e9)
    assert not violations(prob, d) and not d.recompute and d.page_out
    assert memory(prob, d)[0] <= budget < top
    least = page_hint(prob, prob.persistent, 1e9)
    assert not violations(prob, least) and memory(prob, least)[0] < memory(prob, d)[0]
    sched = solve_problem(prob, budget, 1e9, time_limit=60, deterministic_limit=DTIME)
    assert sched.estimate_bytes <= budget
    assert sched.predicted_seconds <= step_seconds(prob, d, 1e9)[0] + 1e-12


def test_a_paged_buffer_is_held_while_its_write_runs():
    """With a slow store a paged-out buffer's memory is held over the forward EOs whose compute
    hides its write (Buffer.held_until): the model counts it there as if kept, not after; the
    lowering frees it (its SwapOut) only after them."""
    from onnxplan.ir.load import read_step
    from onnxplan.joint.lower import lower_swaps
    from onnxplan.joint.solve import JointSchedule

    pre = _pre(read_step(small_artifacts("transformer")))
    costs = {n.name: 1e-3 for n in pre.nodes}
    prob = build_problem(pre, costs, swap_min_bytes=1024, swap_bandwidth=1e7)
    k, b = next((k, b) for k, b in enumerate(prob.buffers)
                if b.swappable and b.last_forward + 1 < b.held_until < prob.n_forward
                and min(b.reads) >= 2 and 1 not in b.reads)
    t = min(b.reads)
    paged = Decisions(frozenset(), minimal_keeps(prob, (), {(t, k)}), frozenset({k}), frozenset({(t, k)}))
    kept = keep_all(prob)
    assert not violations(prob, paged)
    _, fwd_paged, _ = memory(prob, paged)
    _, fwd_kept, _ = memory(prob, kept)
    for e in range(b.last_forward + 1, prob.n_forward):
        assert fwd_paged[e] == fwd_kept[e] - (b.nbytes if e > b.held_until else 0), e
    sched = JointSchedule(prob, paged, 1 << 40, memory(prob, paged)[0], 0.0, 0.0, 0.0, "GIVEN", 0.0, 0.0, "none")
    out, missed = lower_swaps(planning.plan_step(read_step(small_artifacts("transformer")),
                                                 replace(OPTS, recompute="")), sched, OPTS.planner)
    assert not missed
    order = list(out.plan.order)
    swap_out = [i for i, x in enumerate(order) if x.startswith(f"swap-out:{b.root}:")]
    assert len(swap_out) == 1 and swap_out[0] > order.index(prob.order[b.held_until])


def test_the_joint_strategy_chooses_by_the_one_tie_rule(monkeypatch):
    """The joint strategy's candidates go through budget.choice.choose: rotor's plan (the
    "recompute" strategy, first in PREFERENCE) planted half the FLOP estimate's tie margin
    (ESTIMATE_MARGIN) slower than every other is a tie and wins; planted twice it, it is not,
    and the tie among the others goes to the first of them in PREFERENCE."""
    import onnxplan.budget.joint as bj
    from onnxplan.budget import FlopCosts, choice
    from onnxplan.ir.load import read_step
    from onnxplan.swap.pricing import StepPrice, StoreRates

    graph = read_step(small_artifacts("transformer"))
    plain = planning.plan_step(graph, OPTS)
    budget = plain.plan.persistent_bytes + int(0.9 * plain.plan.arena_bytes)  # rotor reaches 0.9, not 0.8
    assert choice.PREFERENCE[1] == "recompute"
    for slower, winner in ((1 + choice.ESTIMATE_MARGIN / 2, "recompute"), (1 + 2 * choice.ESTIMATE_MARGIN, None)):
        def planted(out, times=None, rates=None, slower=slower):
            # rotor's plan: `slower` s; every other: 1 s
            rotor = out.plan.joint is None and out.plan.checkpoint is not None and bool(out.plan.checkpoint.schedule)
            return StepPrice(slower, 0.0, 0.0, 0) if rotor else StepPrice(1.0, 0.0, 0.0, 0)

        monkeypatch.setattr(choice, "price", planted)
        out = bj.plan_joint_strategy(graph, budget, FlopCosts(), 10.0, OPTS, total_seconds=6.0,
                                     rates=StoreRates(2.5e8, 1e-10))
        fitting = [c.strategy for c in out.plan.joint.candidates if c.fits]
        others = [name for name in fitting if name != "recompute"]
        assert "recompute" in fitting and others, "the test needs recompute and another candidate to fit"
        assert out.plan.joint.chosen == (winner or min(others, key=choice.PREFERENCE.index))
