"""The arena itself: no allocation during a step, --check-arena catches planted bugs, plans adopted."""

from __future__ import annotations

import dataclasses
import json
import tracemalloc

import numpy as np
import pytest

from onnxplan.errors import ModelError
from onnxplan.executor import ArenaCheckError, Executor, adopt_plan, run_plan
from onnxplan.executor.arena import Arena
from onnxplan.executor.prepare import Prepared
from onnxplan.executor.runner import initial_parameters, step_batches
from onnxplan.loading import open_step
from onnxplan.offsets.buffers import ALIGNMENT
from onnxplan.plan import Plan
from onnxplan.planning import PlanOptions, plan_step
from tests.zoo_small import SMALL, slow_if_large, small_artifacts

# tracemalloc sees numpy's data allocations. A step may create Python objects (views, floats,
# argument lists) and the kernels' blockwise temporaries (each at most
# onnxplan.kernels._xp.BLOCK_BYTES = 64 KiB, a few alive at once: erf in Gelu keeps ~6), but
# nothing tensor-sized: the peak traced during one step stays under 8 blocks, and does not
# grow when the batch (and every activation) grows 4x.
STEP_ALLOWANCE_BYTES = 8 * 64 * 1024


def _prepared(model: str, optimizer: str | None = None, opts: PlanOptions | None = None):
    opts = opts or PlanOptions("given", "best-fit")
    folder, graph = open_step(small_artifacts(model, optimizer))
    out = plan_step(graph, opts)
    return Prepared(folder, out.graph, out.plan)


def test_arena_is_aligned_and_views_land_at_offsets():
    from onnxplan.ir.tensor import TensorSpec

    arena = Arena(1000)
    assert arena.address % ALIGNMENT == 0 and arena.data.size == 1000
    v = arena.view(128, TensorSpec("float32", (3, 4)))
    v[...] = 7
    assert v.__array_interface__["data"][0] == arena.address + 128
    assert np.all(arena.bytes(128, 48).view(np.float32) == 7)
    with pytest.raises(ValueError):
        arena.view(992, TensorSpec("float32", (4,)))


def step_peak(prep: Prepared, ex: Executor | None = None) -> int:
    """Peak bytes traced by tracemalloc during one step of `ex` (default: an executor of the
    plan made here; the second step: the first warms caches)."""
    batches = step_batches(prep.folder, 2, 0)
    ex = ex or Executor(prep.graph, prep.plan)
    ex.load_state(initial_parameters(prep.folder))
    ex.step(batches[0])
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        ex.step(batches[1])
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("model", slow_if_large(m for m in SMALL if m not in ("mlp-frozen", "nnt-fc3-frozen")))
@pytest.mark.parametrize("interleave", [True, False], ids=["interleave", "joined"])
def test_no_tensor_sized_allocation_during_a_step(model, interleave):
    prep = _prepared(model, opts=PlanOptions("given", "best-fit", interleave))
    peak = step_peak(prep)
    assert peak < STEP_ALLOWANCE_BYTES, (model, peak)


@pytest.mark.parametrize("model", slow_if_large(["transformer", "vgg16"]))
def test_step_allocations_do_not_grow_with_the_tensors(model):
    from onnxplan.loading.artifacts import build_artifacts
    from onnxplan.models import get_model

    peaks, largest = [], []
    for scale in (1, 4):
        kw = {**SMALL[model], "batch": SMALL[model]["batch"] * scale}
        folder, graph = open_step(build_artifacts(get_model(model).builder(**kw), None, optimizer="sgd"))
        out = plan_step(graph, PlanOptions("given", "best-fit"))
        peaks.append(step_peak(Prepared(folder, out.graph, out.plan)))
        largest.append(max(b.bytes for b in out.plan.buffers if b.vclass == "activation"))
    assert largest[1] >= 4 * largest[0]  # the largest activation grew with the batch
    assert peaks[1] <= peaks[0] + 64 * 1024, (model, peaks, largest)


def _shorten(lifetimes_fn, victim: dict):
    """A lifetimes analysis with a bug: one buffer's life ends one EO before its last reader."""

    def buggy(g, order, *args):
        lt = lifetimes_fn(g, order, *args)
        bufs = list(lt.buffers)
        i = max((k for k, b in enumerate(bufs) if b.last > b.first + 1 and not b.name.startswith("scratch:")),
                key=lambda k: bufs[k].nbytes)
        victim["name"] = bufs[i].name
        bufs[i] = dataclasses.replace(bufs[i], last=bufs[i].last - 1)
        return dataclasses.replace(lt, buffers=tuple(bufs))

    return buggy


def test_check_arena_catches_a_buffer_freed_one_eo_early(monkeypatch):
    """The planner and the verifier share the buggy lifetimes, so the plan passes verification;
    --check-arena still catches the read after the planned end of life."""
    from onnxplan import planning

    victim: dict = {}
    monkeypatch.setattr(planning, "lifetimes", _shorten(planning.lifetimes, victim))
    prep = _prepared("mlp", "sgd")
    monkeypatch.undo()
    with pytest.raises(ArenaCheckError, match=f"reads .*{victim['name']}.*outside the planned life"):
        run_plan(None, None, steps=1, check_arena=True, prepared=prep)


def test_check_arena_catches_overlapping_buffers():
    """A plan whose offsets put a buffer over a live one (verification bypassed): the live
    value's bytes change before its reader runs."""
    prep = _prepared("mlp", "sgd")
    bufs = sorted(prep.plan.buffers, key=lambda b: -b.bytes)
    long_lived = next(b for b in bufs if b.last_eo - b.first_eo >= 3 and b.vclass != "input")
    intruder = next(b for b in prep.plan.buffers if long_lived.first_eo < b.first_eo < long_lived.last_eo
                    and b.bytes > 0 and b.name != long_lived.name)
    moved = tuple(dataclasses.replace(b, offset=long_lived.offset) if b.name == intruder.name else b
                  for b in prep.plan.buffers)
    bad = dataclasses.replace(prep.plan, buffers=moved)
    ex = Executor(prep.graph, bad, check_arena=True)
    ex.load_state(initial_parameters(prep.folder))
    with pytest.raises(ArenaCheckError, match="overwritten by another buffer|poisoned"):
        ex.step(step_batches(prep.folder, 1, 0)[0])


def test_check_arena_changes_no_number():
    prep = _prepared("nnt-fc3", "adamw")
    a = run_plan(None, None, steps=2, prepared=prep)
    b = run_plan(None, None, steps=2, check_arena=True, prepared=prep)
    assert a.losses == b.losses
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name])


def test_warmup_changes_nothing_reported():
    prep = _prepared("mlp", "adamw")
    a = run_plan(None, None, steps=2, warmup=0, prepared=prep)
    b = run_plan(None, None, steps=2, warmup=3, prepared=prep)
    assert a.losses == b.losses and len(b.step_seconds) == 2
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name])


def test_a_plan_survives_json_and_is_adopted():
    folder = small_artifacts("nnt-fc3", "sgd")
    direct = run_plan(folder, PlanOptions("greedy", "greedy-size", False), steps=2)
    plan = Plan.from_json(json.loads(direct.plan.dumps()))
    adopted = run_plan(folder, plan, steps=2)
    assert adopted.losses == direct.losses and adopted.arena_bytes == direct.arena_bytes
    for name in direct.params:
        np.testing.assert_array_equal(adopted.params[name], direct.params[name])


def test_adopt_plan_refuses_another_model_or_shape():
    from onnxplan.loading.artifacts import build_artifacts
    from onnxplan.models import get_model

    plan = _prepared("mlp", "sgd").plan
    _, same = open_step(small_artifacts("mlp", "sgd"))
    _, other = open_step(small_artifacts("nnt-fc3", "sgd"))
    with pytest.raises(ModelError, match="the plan is for model 'mlp'"):
        adopt_plan(other, plan)
    _, bigger = open_step(build_artifacts(get_model("mlp").builder(batch=8), None, optimizer="sgd"))
    with pytest.raises(ModelError, match="does not match"):  # other artifacts: other node names
        adopt_plan(bigger, plan)
    x = next(b for b in plan.buffers if b.name == "x")
    resized = dataclasses.replace(plan, buffers=tuple(dataclasses.replace(b, bytes=2 * b.bytes) if b is x else b
                                                      for b in plan.buffers))
    with pytest.raises(ModelError, match="does not fit 'mlp' as loaded: buffer 'x'"):
        adopt_plan(same, resized)
    reordered = dataclasses.replace(plan, order=plan.order[::-1])
    with pytest.raises(ModelError, match="before its dependency"):
        adopt_plan(same, reordered)


def test_state_updates_are_written_back_when_not_aliased(monkeypatch):
    """Without the in-place state alias the updated parameter lands in its own slot and is
    copied back at the end of the step: the same numbers."""
    from onnxplan import planning

    prep = _prepared("mlp", "sgd", PlanOptions("given", "best-fit", False))
    monkeypatch.setattr(planning, "pipeline_names", lambda opts: ["realize"])
    folder, graph = open_step(small_artifacts("mlp", "sgd"))
    out = plan_step(graph, PlanOptions("given", "best-fit", False))
    monkeypatch.undo()
    assert not any(n.aliases for n in out.graph.nodes if n.op_type == "SGDOptimizerV2")
    plain = run_plan(None, None, steps=2, prepared=Prepared(folder, out.graph, out.plan))
    ref = run_plan(None, None, steps=2, prepared=prep)
    assert plain.losses == ref.losses
    for name in ref.params:
        np.testing.assert_array_equal(plain.params[name], ref.params[name])


def test_release_pages_gives_whole_pages_back_and_they_read_zero():
    """Verification gives the arena's pages back between steps: every whole page inside the
    arena reads zero afterwards (and is writable again); the bytes outside them are kept."""
    import mmap

    arena = Arena(1 << 20)
    arena.data.fill(7)
    released = arena.release_pages()
    assert released >= (1 << 20) - 2 * mmap.PAGESIZE and released % mmap.PAGESIZE == 0
    start = (-arena.address) % mmap.PAGESIZE
    assert not arena.data[start:start + released].any()
    assert (arena.data[:start] == 7).all() and (arena.data[start + released:] == 7).all()
    arena.data.fill(3)
    assert (arena.data == 3).all()
    assert Arena(100).release_pages() == 0  # no whole page inside
