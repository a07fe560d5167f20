"""Two nodes at once (onnxplan/executor/interop.py): the rule that pairs them, checked against the
plan's own offsets; a paired step bit for bit the sequential one at 1 and 2 threads; no
tensor-sized allocation in it; a failing kernel in a pair reported by its node."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan import settings, threads
from onnxplan.executor import interop
from onnxplan.executor.prepare import Prepared
from onnxplan.executor.runner import Executor, KernelError, initial_parameters, step_batches
from onnxplan.kernels import matmul, parallel
from onnxplan.loading import open_step
from onnxplan.planning import PlanOptions, plan_step
from onnxplan.step_analysis import step_analysis
from tests.test_executor_arena import STEP_ALLOWANCE_BYTES, step_peak
from tests.zoo_small import slow_if_large, small_artifacts

MODELS = ["mlp", "transformer", "gpt", "nnt-conv2d", "resnet18"]


def _prepared(model: str) -> Prepared:
    folder, graph = open_step(small_artifacts(model))
    out = plan_step(graph, PlanOptions())
    return Prepared(folder, out.graph, out.plan)


@pytest.fixture(autouse=True)
def _threads_restored():
    before = threads.current().threads
    yield
    threads.use_threads(before)


@pytest.fixture
def every_node_pairs(monkeypatch):
    """Pairs for nodes of any size (the small models' nodes are under PAIR_MIN_BYTES)."""
    monkeypatch.setattr(interop, "PAIR_MIN_BYTES", 0)


def _executor(prep: Prepared, n: int, mode: str) -> Executor:
    threads.use_threads(n)
    with settings.override(interop=mode):
        return Executor(prep.graph, prep.plan)


def _steps(ex: Executor, prep: Prepared, n: int) -> tuple[list[float], dict[str, np.ndarray]]:
    threads.use_threads(n)
    ex.load_state(initial_parameters(prep.folder))
    losses = [ex.step(b) for b in step_batches(prep.folder, 3, 0)]
    return losses, ex.parameters() | {f"state:{k}": v for k, v in ex.optimizer_state().items()}


# ---- the rule on byte ranges -----------------------------------------------------------------

def _t(reads=(), writes=(), nbytes=1 << 30) -> interop.Touch:
    return interop.Touch(tuple(reads), tuple(writes), nbytes)


def test_nodes_that_share_no_written_byte_pair():
    a, b = _t(reads=[(0, 8)], writes=[(8, 16)]), _t(reads=[(0, 8)], writes=[(16, 24)])
    assert interop.pair_schedule([a, b], [False, False]) == [(0, 1)]


@pytest.mark.parametrize("b", [_t(reads=[(12, 20)], writes=[(32, 40)]),  # reads what a writes
                               _t(reads=[(32, 40)], writes=[(4, 6)]),  # writes what a reads
                               _t(reads=[(32, 40)], writes=[(15, 17)])],  # writes what a writes
                         ids=["read-after-write", "write-after-read", "write-after-write"])
def test_a_shared_written_byte_keeps_them_apart(b):
    a = _t(reads=[(0, 8)], writes=[(8, 16)])
    assert interop.pair_schedule([a, b], [False, False]) == [(0,), (1,)]


def test_a_node_is_not_hoisted_over_one_it_conflicts_with():
    a = _t(reads=[(0, 8)], writes=[(8, 16)])
    between = _t(reads=[(8, 16)], writes=[(16, 24)])  # depends on a: runs after the pair
    c = _t(reads=[(16, 24)], writes=[(24, 32)])  # reads what `between` writes
    assert interop.pair_schedule([a, between, c], [False] * 3) == [(0,), (1,), (2,)]
    free = _t(reads=[(0, 8)], writes=[(40, 48)])
    assert interop.pair_schedule([a, between, free], [False] * 3) == [(0, 2), (1,)]


def test_random_and_small_nodes_run_alone():
    a, b = _t(reads=[(0, 8)], writes=[(8, 16)]), _t(reads=[(0, 8)], writes=[(16, 24)])
    assert interop.pair_schedule([a, b], [False, True]) == [(0,), (1,)]
    assert interop.pair_schedule([a, _t(writes=[(16, 24)], nbytes=10)], [False, False], least=100) == [(0,), (1,)]


# ---- the pairs of real plans, checked on the plan's offsets (not the bound pointers) -------------

def _plan_ranges(ex: Executor) -> list[tuple[set, set]]:
    """Per call, (read, written) byte ranges from the plan: a value's buffer offset in the arena
    (or its slot in the state region) and the value's size, the node's planned scratch, the
    state its update writes back."""
    plan, g = ex.plan, ex.graph
    offsets = {b.name: b.offset for b in plan.buffers}
    roots = ex.binding.root

    def where(v: str) -> tuple:
        r, n = roots[v], g.values[v].nbytes
        if r in ex.layout.offsets:
            return ("state", ex.layout.offsets[r], ex.layout.offsets[r] + n)
        return ("arena", offsets[r], offsets[r] + n)

    back = {(u.node, u.state, u.updated) for u in step_analysis(g).state_updates if not step_analysis(g).in_place(u)}
    out = []
    for c in ex.calls:
        n = c.node
        reads = {where(v) for v in n.inputs if v and g.values[v].nbytes}
        writes = {where(v) for v in n.outputs if v and g.values[v].nbytes}
        scratch = next((b for b in plan.buffers if b.name == f"scratch:{n.name}"), None)
        if scratch is not None:
            writes.add(("arena", scratch.offset, scratch.offset + scratch.bytes))
        for node, state, updated in back:
            if node == n.name:
                writes.add(where(state))
                reads.add(where(updated))
        out.append((reads, writes))
    return out


def _meets(a: set, b: set) -> bool:
    return any(r1 == r2 and lo1 < hi2 and lo2 < hi1 for r1, lo1, hi1 in a for r2, lo2, hi2 in b)


def _conflicts(x: tuple[set, set], y: tuple[set, set]) -> bool:
    return _meets(x[1], y[0] | y[1]) or _meets(y[1], x[0])


def _check_schedule(ex: Executor, schedule: list[tuple[int, ...]]) -> list[str]:
    """What is wrong with `schedule` on the plan's offsets: a pair whose nodes conflict, or a
    hoisted node that conflicts with one it passed."""
    ranges, done, wrong = _plan_ranges(ex), set(), []
    for entry in schedule:
        if len(entry) == 2:
            i, j = entry
            for k in [i, *(k for k in range(i + 1, j) if k not in done)]:
                if _conflicts(ranges[j], ranges[k]):
                    wrong.append(f"{ex.calls[j].node.name} with {ex.calls[k].node.name}")
        done.update(entry)
    return wrong


PRODUCTS = {"Gemm", "MatMul", "FusedMatMul", "TransposeMatMul"}
CONV_NETS = {"nnt-conv2d"}  # no two independent products


@pytest.mark.parametrize("mode", ["all", "products"])
@pytest.mark.parametrize("model", slow_if_large(MODELS))
def test_every_pair_is_disjoint_on_the_plans_offsets(model, mode, every_node_pairs):
    """The schedule the executor runs: every call once, no pair (nor hoisted node) touching a
    byte the other writes, on the plan's own offsets; "products" pairs two matrix products only."""
    ex = _executor(_prepared(model), 2, mode)
    if mode == "products" and model in CONV_NETS:
        assert ex.paired is None and not ex.pairs
        return
    assert ex.pairs == [e for e in ex.schedule if len(e) == 2] and ex.pairs, model
    assert sorted(i for e in ex.schedule for i in e) == list(range(len(ex.calls)))
    assert _check_schedule(ex, ex.schedule) == []
    if mode == "products":
        assert {ex.calls[k].node.op_type for pair in ex.pairs for k in pair} <= PRODUCTS


def test_the_plan_check_finds_a_dependent_pair(every_node_pairs):
    """The check above fails on a wrong schedule: each node paired with the next (a chain)."""
    ex = _executor(_prepared("mlp"), 2, "all")
    chain = [(i, i + 1) for i in range(0, len(ex.calls) - 1, 2)]
    assert _check_schedule(ex, chain)


# ---- a paired step: the same bits, no allocation ---------------------------------------------------

@pytest.mark.parametrize("model", slow_if_large(MODELS))
def test_a_paired_step_is_bitwise_the_sequential_one(model, every_node_pairs):
    """At 2 threads the paired step equals the sequential step at 2 threads, at 1 thread (no
    pairs run) the one at 1 thread (the two differ where a GEMM is cut in pieces: kernels/matmul.py)."""
    prep = _prepared(model)
    paired = _executor(prep, 2, "all")
    assert paired.paired is not None and len(paired.paired) < len(paired.calls)
    _same_steps(prep, paired, lambda n: _executor(prep, n, "off"), model)


@pytest.mark.parametrize("model", slow_if_large([m for m in MODELS if m not in CONV_NETS]))
def test_paired_products_are_bitwise_the_sequential_step(model, monkeypatch):
    """A pair's products run as one GEMM-pool job, each cut as it is alone (kernels.matmul.
    ProductPair): the paired step equals the sequential one at 2 threads and at 1, so a plan's
    pairs (its offsets) change no number. With the products cut for 3 threads (pieces of 64
    elements), the small models' products are cut in the pairs too."""
    monkeypatch.setattr(parallel, "MIN_ELEMS", 64)
    jobs = []
    original = matmul.ProductPair.__call__
    monkeypatch.setattr(matmul.ProductPair, "__call__", lambda self: jobs.append(original(self)) or jobs[-1])
    prep = _prepared(model)
    paired = _executor(prep, 2, "products")
    assert paired.paired is not None and paired.pairs
    _same_steps(prep, paired, lambda n: _executor(prep, n, "off"), model)
    assert len(jobs) == 6 * len(paired.pairs)  # every pair asked at each 2-thread step
    if matmul.gemm_calls.pool() is not None:  # most pairs one job (not those numpy computes otherwise)
        assert sum(jobs) > len(jobs) / 2, jobs


def _same_steps(prep: Prepared, paired: Executor, sequential, model: str) -> None:
    for n in (2, 1, 2):
        want = _steps(sequential(n), prep, n)
        losses, state = _steps(paired, prep, n)
        assert losses == want[0], (model, n)
        for name, value in want[1].items():
            np.testing.assert_array_equal(state[name], value, err_msg=f"{model} {name} at {n} threads")


def test_pairs_only_where_nothing_else_runs_beside_the_kernels(every_node_pairs):
    prep = _prepared("mlp")
    assert _executor(prep, 2, "off").paired is None
    threads.use_threads(2)
    assert Executor(prep.graph, prep.plan, check_arena=True).paired is None
    assert Executor(prep.graph, prep.plan, wrap=lambda node, fn: fn).paired is None


@pytest.mark.parametrize("mode", ["all", "products"])
def test_no_tensor_sized_allocation_in_a_paired_step(mode, every_node_pairs):
    prep = _prepared("transformer")
    assert step_peak(prep, _executor(prep, 2, mode)) < STEP_ALLOWANCE_BYTES


def test_a_failing_kernel_in_a_pair_names_its_node(every_node_pairs):
    prep = _prepared("mlp")
    ex = _executor(prep, 2, "all")
    victim = ex.calls[ex.pairs[0][1]]

    def broken(ctx, inputs, outputs):
        raise ValueError("planted")

    victim.fn = broken
    ex.load_state(initial_parameters(prep.folder))
    with pytest.raises(KernelError, match=f"node {victim.node.name!r}.*planted"):
        ex.step(step_batches(prep.folder, 1, 0)[0])
