"""Execute a plan: every node's kernel writes into views of one arena, in the plan's order."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onnxplan import settings
from onnxplan.data import warm_up_steps
from onnxplan.errors import ModelError, OnnxplanError, UsageError
from onnxplan.executor import interop
from onnxplan.executor.arena import Arena
from onnxplan.executor.binding import bind, is_view_node, state_layout, state_values
from onnxplan.executor.check_arena import ArenaChecker
from onnxplan.executor.prepare import Prepared, prepare
from onnxplan.ir.graph import StepGraph
from onnxplan.kernels import _xp, parallel
from onnxplan.kernels.matmul import ProductPair, ProductWork
from onnxplan.kernels.random import DEFAULT_SEED, Randomness, recompute_draws
from onnxplan.kernels.registry import PAIRABLE, KernelContext, bound_kernel, find_kernel
from onnxplan.loading.request import LoadRequest
from onnxplan.passes.split import is_piece_node
from onnxplan.plan import Plan
from onnxplan.planning import PlanOptions
from onnxplan.step_analysis import step_analysis
from onnxplan.threads import current as thread_settings
from onnxplan.threads import use_threads

__all__ = [
    "DEFAULT_LEARNING_RATE",
    "Executor",
    "KernelError",
    "RunResult",
    "check_batches",
    "execute",
    "initial_parameters",
    "run_plan",
    "step_batches",
]

DEFAULT_LEARNING_RATE = 1e-3  # onnxruntime.training.api.Optimizer's initial learning rate
LEARNING_RATE = "learning_rate"
STEP = "step"  # AdamW's step input: ORT feeds (completed steps + 1), then counts the step


class KernelError(OnnxplanError):
    """A kernel failed while running a node."""

    exit_code = 1


@dataclass(slots=True)
class _Call:
    fn: Any
    ctx: KernelContext
    inputs: list
    outputs: list
    node: Any
    writeback: list = field(default_factory=list)


class Executor:
    """A planned step bound to memory: the arena (transient values and scratch at their planned
    offsets) and the state region (parameters, optimizer state, constants), both allocated here,
    once. `step(batch)` runs one training step without allocating tensor-sized memory."""

    def __init__(self, graph: StepGraph, plan: Plan, *, xp: Any = np, check_arena: bool = False,
                 swap_dir: str | Path | None = None, wrap: Callable[[Any, Any], Any] | None = None,
                 seed: int = DEFAULT_SEED) -> None:
        """`wrap(node, fn) -> fn` wraps each node's kernel (inside the swap machinery, so the
        node's inputs are in place when the wrapper runs): verification's per-node hook.
        `seed` seeds the random ops (onnxplan.kernels.random)."""
        if xp is not np and any(is_piece_node(n) for n in graph.nodes):
            raise UsageError("a plan with split nodes runs on the CPU only (its pieces move through a host "
                             "store from numpy arrays): run it without --device, or plan with a budget at or "
                             "above swap's floor")
        self.graph, self.plan, self.xp = graph, plan, xp
        self.random = Randomness(seed)
        self.warmup_steps = 0  # the warm-up steps execute() ran before it restored the initial state
        self.random.keep = recompute_draws(n.name for n in graph.nodes)
        self.layout = state_layout(graph)
        self.arena = Arena(plan.arena_bytes, xp)
        self.state = Arena(self.layout.nbytes, xp)
        self.binding = bind(graph, plan, self.arena, self.state, self.layout)
        self.swap = None  # onnxplan.swap: a file-backed store and its I/O worker (opened last, below)
        if plan.swaps:
            from onnxplan.executor.swap_io import (
                SwapRuntime,  # it declares the swap nodes' kernels, looked up below
            )
        arrays = self.binding.arrays
        nodes = {n.name: n for n in graph.nodes}
        self.pieces = None  # onnxplan.passes.split's transfers: a host store of their own
        if any(is_piece_node(n) for n in graph.nodes):
            from onnxplan.executor.piece_io import PieceRuntime

            self.pieces = PieceRuntime(graph, swap_dir)
        self.calls: list[_Call] = []
        self.views: list[tuple[int, Any]] = []  # (EO, node) of the read-only views skipped
        for t, name in enumerate(plan.order):
            node = nodes[name]
            if is_view_node(node):
                self.views.append((t, node))
                continue
            decl = find_kernel(node, graph.opsets.get(node.domain or ""))
            spec = lambda v: graph.values[v].spec if v else None
            ctx = KernelContext(xp, node, [spec(i) for i in node.inputs], [spec(o) for o in node.outputs],
                                self.binding.scratch.get(name), self.random)
            ins = [arrays[i] if i else None for i in node.inputs]
            outs = [arrays[o] if o else None for o in node.outputs]
            both = _xp.one_object_per_buffer(ins + outs)  # an in-place output: its input's object
            outs = both[len(ins):]
            fn = bound_kernel(decl, ctx, ins, outs) if self.pieces is None or not is_piece_node(node) \
                else self.pieces.kernel(node, ins, outs)
            fn = fn if wrap is None else wrap(node, fn)
            self.calls.append(_Call(fn, ctx, ins, outs, node, self.binding.writeback_after.get(name, [])))
        self.eo = {name: t for t, name in enumerate(plan.order)}
        self.feeds = [v for v in graph.inputs if v != LEARNING_RATE]
        self.loss = arrays[graph.loss]
        self.learning_rate = DEFAULT_LEARNING_RATE
        self.steps_done = 0
        self.classes = state_values(graph)
        self.checker = ArenaChecker(graph, plan, self.binding, self.arena) if check_arena else None
        # ONNXPLAN_INTEROP=1: two independent nodes at once at 2+ compute threads (executor/interop.py),
        # where nothing else runs beside the kernels: the plan's order as is with swaps, split
        # pieces, wrapped kernels, the arena check or a GPU
        plain = xp is np and wrap is None and not plan.swaps and self.pieces is None and not check_arena
        self.pairs: list[tuple[int, int]] = []  # (i, j): calls[j] runs alongside calls[i] (interop.py)
        self.schedule: list[tuple[int, ...]] = []  # the paired step's order: (i,) alone, (i, j) a pair
        mode = settings.current().interop
        self.paired = self._pair_calls(mode == "products") if plain and mode != "off" else None
        if plan.swaps:  # last: a constructor failing earlier (a missing kernel) leaves no runtime open
            self.swap = SwapRuntime(graph, plan, self.binding, self.arena, folder=swap_dir, sync=check_arena)
            self.swap.attach(self.calls)

    def _pair_calls(self, products: bool) -> list[Callable[[], None]] | None:
        """The step as zero-argument calls, two independent nodes in one (interop.py's rule, on
        the bound bytes; `self.pairs` their indices in `calls`); None when no two nodes pair.
        `products`: only bound matrix products pair, of any size, each pair one GEMM-pool job
        (kernels.matmul.ProductPair); else any two nodes of interop.PAIR_MIN_BYTES or more, on
        the Python pool."""
        random = step_analysis(self.graph).random
        touches = [interop.touch(c.inputs, c.outputs, c.ctx.scratch, c.writeback) for c in self.calls]
        works: list[ProductWork | None] = [getattr(c.fn, PAIRABLE, None) if products and not c.writeback else None
                                           for c in self.calls]
        alone = [c.node.name in random or (products and w is None) for c, w in zip(self.calls, works)]
        schedule = interop.pair_schedule(touches, alone, least=0 if products else None)
        self.pairs = [(e[0], e[1]) for e in schedule if len(e) == 2]
        self.schedule = schedule
        if not self.pairs:
            return None
        one = [functools.partial(self._call, c) for c in self.calls]

        def pair(i: int, j: int) -> Callable[[], None]:
            first, second = works[i], works[j]
            if first is not None and second is not None:
                return interop.job_runner(ProductPair(first, second), one[i], one[j])
            return interop.pair_runner(parallel.run, one[i], one[j])

        return [one[e[0]] if len(e) == 1 else pair(*e) for e in schedule]

    # ---- state -------------------------------------------------------------------------
    def load_state(self, params: Mapping[str, np.ndarray], optimizer_state: Mapping[str, np.ndarray] | None = None,
                   steps_done: int = 0) -> None:
        """Parameters from `params` (every one, trainable and frozen), optimizer state from
        `optimizer_state` or zero (ORT starts its moments at zero), constants from the graph,
        the step counter at `steps_done`; the random generator restarts from its seed."""
        optimizer_state = optimizer_state or {}
        arrays, g = self.binding.arrays, self.graph
        missing = [p for p in self.classes["parameter"] if p not in params]
        if missing:
            raise ModelError(f"no initial value for parameter {missing[0]!r} ({len(missing)} missing)")
        for name in self.classes["parameter"]:
            _upload(self.xp, arrays[name], np.asarray(params[name]).reshape(arrays[name].shape))
        for name in self.classes["optimizer_state"]:
            if name in optimizer_state:
                _upload(self.xp, arrays[name], np.asarray(optimizer_state[name]).reshape(arrays[name].shape))
            else:
                arrays[name].fill(0)
        for name in self.classes["constant"]:
            if name not in g.initializers:
                raise ModelError(f"constant {name!r} has no value")
            _upload(self.xp, arrays[name], np.asarray(g.initializers[name]).reshape(arrays[name].shape))
        if self.swap is not None:  # evicted parameters and optimizer state start in the store
            self.swap.load_state(params, optimizer_state)
        if self.pieces is not None:  # and state homed by a split update in the piece store
            self.pieces.load_state(params, optimizer_state)
        self.steps_done = steps_done
        self.random.reset()

    def parameters(self, names: Collection[str] | None = None) -> dict[str, np.ndarray]:
        """Copies of every parameter, trainable and frozen (or of those in `names`), on the host."""
        return self._state_copies("parameter", names)

    def optimizer_state(self, names: Collection[str] | None = None) -> dict[str, np.ndarray]:
        """Copies of the optimizer state (AdamW's moments; `step` is fed, not kept), or of those in
        `names`, on the host."""
        return self._state_copies("optimizer_state", names)

    def state_views(self, vclass: str = "parameter") -> Iterator[tuple[str, np.ndarray]]:
        """(name, host array) for every value of `vclass` ("parameter" or "optimizer_state"), one
        at a time: a view of the state region where it lives in host memory (valid until the
        next step or load_state changes it; read it, never keep it), a copy where it is on a
        device or evicted to the swap store."""
        arrays, swap = self.binding.arrays, self.swap
        evicted = swap.state if swap is not None else {}
        for name in self.classes[vclass]:
            if name != STEP and name not in evicted:
                yield name, arrays[name] if self.xp is np else _download(arrays[name])
        for name, (value_class, _) in evicted.items():
            if swap is not None and value_class == vclass:
                yield from swap.parameters(vclass, {name}).items()
        pieces = self.pieces
        for name, (value_class, _) in (pieces.state.items() if pieces is not None else ()):
            if pieces is not None and value_class == vclass:
                yield from pieces.parameters(vclass, {name}).items()

    def _state_copies(self, vclass: str, names: Collection[str] | None) -> dict[str, np.ndarray]:
        out = {name: _download(self.binding.arrays[name]) for name in self.classes[vclass]
               if name != STEP and (names is None or name in names)}
        if self.swap is not None:
            out.update(self.swap.parameters(vclass, names))
        if self.pieces is not None:
            out.update(self.pieces.parameters(vclass, names))
        return out

    # ---- one step ----------------------------------------------------------------------
    def _feed(self, batch: dict[str, np.ndarray]) -> None:
        arrays = self.binding.arrays
        self.random.new_step()
        for name in self.feeds:
            if name not in batch:
                raise ModelError(f"the step data has no input {name!r}")
            _upload(self.xp, arrays[name], batch[name])
        if LEARNING_RATE in arrays:
            arrays[LEARNING_RATE].fill(self.learning_rate)
        if STEP in arrays:
            arrays[STEP].fill(self.steps_done + 1)

    def step(self, batch: dict[str, np.ndarray]) -> float:
        """Feed the batch, run every node in plan order, return the loss."""
        if self.checker is not None:
            return self._checked_step(batch)
        self._feed(batch)
        self._run_calls()
        self._end_step()
        return float(self.loss.reshape(-1)[0])

    def _run_calls(self) -> None:
        """Every node's kernel in plan order: _call's body inlined (per-node overhead counts on
        small models with hundreds of nodes); a failure is reported as _call reports it. At 2+
        compute threads, the paired schedule (interop.py) where the plan has one."""
        if self.paired is not None and thread_settings().compute > 1:
            for run in self.paired:
                run()
            return
        copyto = self.xp.copyto
        c: _Call | None = None
        try:
            for c in self.calls:
                c.fn(c.ctx, c.inputs, c.outputs)
                if c.writeback:
                    for dst, src in c.writeback:
                        copyto(dst, src)
        except OnnxplanError:
            raise
        except Exception as exc:
            if c is None:  # not a kernel's failure
                raise
            raise self._kernel_error(c, exc) from exc

    def _call(self, c: _Call) -> None:
        """Run one node's kernel and its write-backs: the body of every step loop (plain, timed, checked)."""
        try:
            c.fn(c.ctx, c.inputs, c.outputs)
        except OnnxplanError:
            raise
        except Exception as exc:
            raise self._kernel_error(c, exc) from exc
        for dst, src in c.writeback:
            self.xp.copyto(dst, src)

    def timed_nodes(self, batch: dict[str, np.ndarray],
                    clock: Callable[[], float] = time.perf_counter) -> tuple[float, dict[str, float]]:
        """One step with `clock` around every kernel: (loss, seconds by node name). For
        profiles; the plain step has no per-node overhead. On a GPU the device is synchronised
        around each kernel: its time is its completion, not its launch."""
        self._feed(batch)
        seconds: dict[str, float] = {}
        sync = (lambda: None) if self.xp is np else self.xp.cuda.Device().synchronize
        for c in self.calls:
            sync()
            t0 = clock()
            self._call(c)
            sync()
            seconds[c.node.name] = clock() - t0
        self._end_step()
        return float(self.loss.reshape(-1)[0]), seconds

    def timed_step(self, batch: dict[str, np.ndarray]) -> tuple[float, dict[str, float]]:
        """timed_nodes summed by op type: (loss, seconds by op type)."""
        loss, seconds = self.timed_nodes(batch)
        by_op: dict[str, float] = {}
        for c in self.calls:
            by_op[c.node.op_type] = by_op.get(c.node.op_type, 0.0) + seconds[c.node.name]
        return loss, by_op

    def _end_step(self) -> None:
        if self.swap is not None:
            self.swap.end_step()
        for dst, src in self.binding.writeback_end:
            self.xp.copyto(dst, src)
        self.steps_done += 1

    def _kernel_error(self, call: _Call, exc: Exception) -> KernelError:
        n = call.node
        op = f"{n.domain}.{n.op_type}" if n.domain else n.op_type
        return KernelError(f"kernel {op} failed on node {n.name!r} (EO {self.eo[n.name]}): "
                           f"{type(exc).__name__}: {exc}")

    def _checked_step(self, batch: dict[str, np.ndarray]) -> float:
        chk = self.checker
        if chk is None:
            raise RuntimeError("a checked step without the arena checker")
        chk.start_step()
        self._feed(batch)
        chk.fed([*self.feeds, LEARNING_RATE])
        calls = iter(self.calls)
        views = dict(self.views)
        for t, name in enumerate(self.plan.order):
            if t in views:
                chk.before(t, views[t])
                chk.after(t, views[t])
                continue
            c = next(calls)
            chk.before(t, c.node)
            self._call(c)
            chk.after(t, c.node)
        self._end_step()
        return float(self.loss.reshape(-1)[0])


def _upload(xp: Any, dst: Any, src: np.ndarray) -> None:
    if xp is np:
        np.copyto(dst, src, casting="same_kind")
    else:
        dst.set(np.asarray(src, dtype=dst.dtype, order="C").reshape(dst.shape))  # 0-d stays 0-d


def _download(a: Any) -> np.ndarray:
    return np.array(a, copy=True) if isinstance(a, np.ndarray) else a.get()


# ---- the library entry point ---------------------------------------------------------------

@dataclass
class RunResult:
    """What a planned run computed and what it occupied."""

    losses: list[float]  # per measured step
    step_seconds: list[float]
    params: dict[str, np.ndarray]  # every parameter after the last step
    arena_bytes: int  # the arena allocated (= plan.arena_bytes)
    persistent_bytes: int  # the plan's persistent bytes (parameters, optimizer state, constants)
    peak_bytes: int  # planned: persistent + arena
    plan: Plan
    state_region_bytes: int = 0  # the state region allocated (slots aligned)
    folder: Path | None = None
    swap: dict | None = None  # swap accounting (onnxplan.executor.swap_io.SwapRuntime.summary)

    @property
    def median_step_seconds(self) -> float:
        return float(np.median(self.step_seconds)) if self.step_seconds else float("nan")


def step_batches(folder: Path, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """The seeded data of steps 0..count-1, exactly as the ONNX Runtime reference feeds it."""
    from onnxplan.data import make_step_batch, read_input_specs

    inputs, labels = read_input_specs(folder)
    return [make_step_batch(inputs, labels, seed, k) for k in range(count)]


def initial_parameters(folder: Path) -> dict[str, np.ndarray]:
    """Every parameter's initial value from the folder's checkpoint (imports torch: run time only)."""
    from onnxplan.ort import import_training

    import_training()  # on its own thread: its stored exception holds none of our frames
    from onnxruntime.training.api import CheckpointState

    from onnxplan.ir.checkpoint_file import require_values

    path = Path(folder) / "checkpoint"
    require_values(path)  # a nominal checkpoint (a model built by reference) holds names only
    try:
        state = CheckpointState.load_checkpoint(str(path))
    except Exception as exc:  # noqa: BLE001 - ORT raises plain RuntimeErrors
        raise ModelError(f"{path}: unreadable checkpoint ({str(exc).splitlines()[0]})") from None
    return {name: np.array(p.data, copy=True) for name, p in state.parameters}


def check_fits(prepared: Prepared, count: int, on_host: bool = True) -> None:
    """Refuse (BudgetError, exit 3) a run whose arena and state (when on the host), initial
    parameters and `count` steps of data do not fit in the memory available, before any of
    it is allocated."""
    from onnxplan.data import read_input_specs, step_specs
    from onnxplan.hostmem import require_memory

    inputs, labels = read_input_specs(prepared.folder)
    plan = prepared.plan
    need = {"arena": plan.arena_bytes if on_host else 0, "state": plan.persistent_bytes if on_host else 0,
            "initial parameters": plan.persistent_bytes,
            "step data": count * sum(spec.nbytes for spec in step_specs(inputs, labels))}
    require_memory(need, f"running {plan.model}")


def check_batches(graph: StepGraph, batch: dict[str, np.ndarray]) -> None:
    """The step data must have the planned shapes and dtypes."""
    for name in graph.inputs:
        if name == LEARNING_RATE:
            continue
        spec, arr = graph.values[name].known_spec, batch.get(name)
        if arr is None or tuple(arr.shape) != spec.shape or arr.dtype != np.dtype(spec.dtype):
            got = "nothing" if arr is None else f"{arr.dtype}{list(arr.shape)}"
            raise ModelError(f"step input {name!r}: the data has {got}, the plan expects {spec}")


def execute(prepared: Prepared, batches: list, params: dict, *, steps: int, warmup: int,
            learning_rate: float | None, check_arena: bool, xp: Any = np,
            threads: int | None = None, swap_dir: str | Path | None = None,
            on_step: Callable[[str], None] | None = None, warmup_seconds: float = 0.0) -> tuple[Executor, list, list]:
    """Warm up on the initial state (`warmup` steps on batches 0.., on until `warmup_seconds`:
    data.warm_up_steps), restore it, run the measured steps: (executor, losses, seconds); the
    executor's `warmup_steps` says how many warm-up steps ran. `threads` sizes every thread pool
    of the process first (onnxplan.threads; None: every available core); `on_step(text)` is told
    which step starts (progress)."""
    on_step = on_step or (lambda text: None)
    use_threads(threads, swapping=bool(prepared.plan.swaps))
    ex = Executor(prepared.graph, prepared.plan, xp=xp, check_arena=check_arena, swap_dir=swap_dir)
    if learning_rate is not None:
        ex.learning_rate = float(learning_rate)
    if warmup:
        ex.load_state(params)
        for k in warm_up_steps(warmup, warmup_seconds):
            on_step(f"warm-up step {k + 1}/{warmup}" if k < warmup else f"warm-up step {k + 1} ({warmup_seconds:g} s)")
            ex.step(batches[k % warmup])
            ex.warmup_steps = k + 1
    ex.load_state(params)
    losses, seconds = [], []
    for k in range(steps):
        on_step(f"step {k + 1}/{steps}")
        t0 = time.perf_counter()
        losses.append(ex.step(batches[k]))
        seconds.append(time.perf_counter() - t0)
    return ex, losses, seconds


def run_plan(folder_or_request: str | Path | LoadRequest, plan_options_or_plan: PlanOptions | Plan | None = None,
             *, steps: int = 3, warmup: int = 0, seed: int = 0, check_arena: bool = False,
             learning_rate: float | None = None, prepared: Prepared | None = None,
             threads: int | None = None, swap_dir: str | Path | None = None, xp: Any = np,
             on_step: Callable[[str], None] | None = None) -> RunResult:
    """Plan (or adopt a plan), then run `steps` seeded training steps from the checkpoint.

    Step k feeds make_step_batch(seed, k), as the ONNX Runtime reference does. Warm-up steps
    run first on batches 0.., then the initial state is restored, so they never change the
    losses or parameters reported. `prepared` skips loading and planning; `threads` sizes the
    thread pools of this process (onnxplan.threads); `xp` is the array module (numpy, or cupy: onnxplan.device)."""
    if steps < 0 or warmup < 0:
        raise ModelError("steps and warmup must be >= 0")
    prep = prepared or prepare(folder_or_request, plan_options_or_plan)
    check_fits(prep, max(steps, warmup), on_host=xp is np)
    batches = step_batches(prep.folder, max(steps, warmup), seed)
    if batches:
        check_batches(prep.graph, batches[0])
    params = initial_parameters(prep.folder)
    ex, losses, seconds = execute(prep, batches, params, steps=steps, warmup=warmup,
                                  learning_rate=learning_rate, check_arena=check_arena, threads=threads,
                                  swap_dir=swap_dir, xp=xp, on_step=on_step)
    plan = prep.plan
    params = ex.parameters()
    swap = ex.swap.summary() if ex.swap is not None else None
    if ex.swap is not None:
        ex.swap.close()  # the store's file goes with it
    if ex.pieces is not None:
        ex.pieces.close()
    return RunResult(losses, seconds, params, plan.arena_bytes, plan.persistent_bytes,
                     plan.peak_bytes, plan, ex.layout.nbytes, prep.folder, swap)
