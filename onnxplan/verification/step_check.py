"""`run --verify`: each training step of a plan compared with ONNX Runtime from the same state.

Per step k (our executor runs the plan exactly as `run` does: arena, swap, recompute):
  1. our state before the step (every parameter, AdamW's moments, the step count) and the
     step's data are written to a scratch store on disk (verification/store.py) and ONNX
     Runtime's training model runs one step from it in a child process
     (onnxplan.verification.ort_process, ort_step): both sides start from the same state, so
     rounding differences never compound over steps; its gradients, the loss node's inputs,
     running statistics and random draws go to the store too, and a second child measures the
     step's rounding noise;
  2. our step runs with ONNX Runtime's random values (Dropout keep-masks, Random*Like outputs)
     given to our random ops; right before each optimizer node, a per-node hook compares our
     gradient with ONNX Runtime's (read back from the store) and replaces it with that, so
  3. the loss and every gradient are compared by relative norm error (tolerances below), the
     optimizer's update (parameters and moments) against ONNX Runtime's optimizer model run on
     the same state and the same gradients (read back a group of parameters at a time), and
     the BatchNorm running statistics; in the same step, the hook also runs ONNX Runtime's
     kernel of each node alone on copies of our kernel's inputs and compares the outputs within
     that node's own rounding (node_check.py: the per-node check, blind to nothing upstream);
  4. on a failure of the end-to-end checks, the step is run again from the same state (read
     back) on both sides with every intermediate value of ONNX Runtime's training model
     exposed, ours compared node by node in execution order: the first value beyond tolerance
     names the node that computed it, unless a node whose kernel differs per node comes no
     later (then that node: a kernel fault named where it is, not where it first shows).

Memory: ONNX Runtime's training runs happen in child processes while this one holds only its
state (the arena's pages given back); beside our executor the verification then holds a tensor
or an update group read back from the store (and ONNX Runtime's optimizer session for that
group); never a second copy of the model's state, gradients or intermediates (these only while
explaining a failure, read back one at a time).

ONNX Runtime's training model is the reference as generated, except where ONNX Runtime is
wrong: its ConvGrad ignores auto_pad, so those nodes get explicit pads
(ort_step.explicit_conv_grad_pads; a wrong reference is repaired, never met with a wider
tolerance).

Tolerances (measured on correct runs of the zoo, reports/verify.md): our kernels against ONNX
Runtime from the same state differ by <= 5e-6 relative norm in a gradient, except where a
pre-activation within rounding of zero flips a ReLU (one element of resnet18's layer1 moved the
bias gradients by up to 4.3e-3); hence 3e-2 for gradients and intermediates. A gradient that
is zero in exact arithmetic (attention key biases) is pure rounding on both sides, so each
tensor's tolerance is also at least 10x its own noise: ONNX Runtime against itself from the
state with every float input and parameter moved one ulp at random. The optimizer's update on
identical inputs agrees to ~2 ulp (2.3e-7 of the tensor's magnitude): tolerance 1e-5. Running
statistics from the same state agree to <= 1e-6: tolerance 1e-4. Planted bugs move a tensor by
far more (tests/test_verify_faults.py).

A BatchNorm statistic (running mean and variance, the saved batch mean) is a reduction, and a
reduction can cancel: a channel whose exact mean is zero (a bias-free conv of a zero-mean input)
gets a float32 mean that is pure rounding on both sides, so no relative tolerance holds. Its
tolerance is therefore also at least an absolute floor from the magnitudes it is computed from
(see bn_floor): the float32 rounding both sides may make, not a measured constant.

Every gradient gets such a floor too, from the computation that produced it: each reduction
(ConvGrad, Gemm, MatMul, ReduceSum, Sum; BatchNormalizationGrad by bn_grad_floor) has its own
rounding floor, c(K) u ||kernel(|inputs|)|| (reduction_floor: our own kernel run on the inputs'
magnitudes), and every op adds the relative floor its inputs carry in times its output's norm
(_Hooks._inherited). A gradient of a well-conditioned path keeps a floor far below 3e-2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from onnxplan.executor import runner
from onnxplan.executor.runner import Executor, _download, _upload, initial_parameters
from onnxplan.hostmem import give_back_freed
from onnxplan.ir.graph import original_name
from onnxplan.ort import ort_cause
from onnxplan.step_analysis import step_analysis
from onnxplan.threads import current as current_threads
from onnxplan.verification import ort_step
from onnxplan.verification.checks import Check, NodeChecks, StepReport, Verification
from onnxplan.verification.compare import rel_norm_error, update_error
from onnxplan.verification.node_check import NODE_TOLERANCE, NodeFeeds, NodeReference, compare_node
from onnxplan.verification.norm_floors import bn_floor, bn_grad_floor, ln_grad_floor, sum_rounding
from onnxplan.verification.ort_process import OrtProcess, StepOutcome
from onnxplan.verification.ort_step import ORT_DEFAULT_LEARNING_RATE, OrtOptimizerStep, OrtTrainingStep
from onnxplan.verification.store import StoredTensors, TensorStore

__all__ = ["TOLERANCES", "Check", "StepReport", "Verification", "verify_run"]

# relative norm error per tensor (loss: relative error), and the optimizer's per-element error
# relative to the largest magnitude of the tensor it updates
TOLERANCES = {"loss": 1e-5, "gradient": 3e-2, "running": 1e-4, "update": 1e-5, "intermediate": 3e-2}
NOISE_FACTOR = 10.0  # ... or this many times the tensor's own rounding noise in this step, if larger


# gradient-producing reductions: their floor is our own kernel run on the inputs' magnitudes
# (forward Conv too: its output's floor is the relative error a BatchNorm's statistics inherit).
# The sums and means of ONNX Runtime's training graphs are here too: a bias gradient
# (ReduceSumTraining) or a mean of centred values cancels to ~0, where two correct float32
# kernels differ by their rounding, all of it (found by review: 0.64-0.75 against 1e-4 per node)
REDUCTION_OPS = frozenset({"Conv", "ConvTranspose", "ConvGrad", "Gemm", "MatMul", "FusedMatMul", "ReduceSum", "Sum",
                           "ConvTransposeGrad", "ReduceSumTraining", "ReduceMean", "ReduceSumSquare", "ReduceL1",
                           "ReduceL2", "GlobalAveragePool", "AveragePool"})


_NORM_BLOCK = 1 << 20  # elements per block of _norm's float64 sums


def _norm(a) -> float:
    """||a||_2 in float64, a block at a time (no copy of the tensor: the hook takes the norm of
    every value with a floor, the largest of them too)."""
    flat = (a if isinstance(a, np.ndarray) else _download(a)).reshape(-1)
    total = 0.0
    for i in range(0, flat.size, _NORM_BLOCK):
        block = flat[i:i + _NORM_BLOCK].astype(np.float64)
        total += float(block @ block)
    return math.sqrt(total)


def reduction_floor(fn, ctx, inputs, outputs, xp) -> dict[int, tuple[float, float]]:
    """Output index -> (c, M), M = ||kernel(|inputs|)||: c M is the norm of an absolute error
    bound for a reduction (a sum of products: ConvGrad's dX, dW and dB, Gemm/MatMul, ReduceSum, Sum), from our own kernel run once more on
    |inputs|: that run computes, per output element, sum |a_i||b_i| over the element's K terms
    (for ConvGrad, Gemm and MatMul every term is a product of one element of each input).
    A float32 sum of K terms is off by <= gamma_K sum|terms| (Higham 3.1); a blocked or
    sequential BLAS sum (MLAS, Eigen, numpy's) reaches that only in adversarial cases: with
    rounding errors independent and of mean zero, the error is <= lambda sqrt(K) u sum|terms|
    with probability >= 1 - 2 exp(-lambda^2 / 2) (Higham and Mary, SIAM J. Sci. Comput. 2019,
    Thm 2.4). With lambda = 6 (failure probability 3e-8 per element) and two independent sides:
        floor = 2 (6 sqrt(K) + 2) u ||kernel(|inputs|)||
    (+2: the product's own rounding and the output's store), K per output from the sizes
    (_terms). Where
    the reduction does not cancel, ||kernel(|x|)|| ~ ||kernel(x)|| and the floor is ~1e-5 of the
    value or less, far below the gradient tolerance; where the exact result cancels to ~0
    (a gradient behind a BatchNorm whose output is ~constant), it is what rounding may leave."""
    sizes = [int(np.prod(np.shape(a))) for a in inputs if a is not None and a.dtype.kind == "f"]
    abs_in = [xp.abs(a) if a is not None and a.dtype.kind == "f" else a for a in inputs]
    abs_out = [None if o is None else xp.empty_like(o) for o in outputs]
    if ctx.scratch is not None:  # its own scratch: the planned one may share memory with a dying input
        ctx = replace(ctx, scratch=xp.empty_like(ctx.scratch))
    fn(ctx, abs_in, abs_out)
    out = {}
    for j, o in enumerate(abs_out):
        if o is not None and o.dtype.kind == "f":
            c = sum_rounding(_terms(sizes, int(np.prod(o.shape)), ctx.node.op_type == "Sum"), 2)
            out[j] = (c, _norm(o))
    return out


def _terms(sizes: list[int], out: int, n_ary: bool) -> float:
    """How many terms each output element sums, from the sizes alone: Sum of n tensors, n;
    one input (ReduceSum), |in| / |out|; a product of two (MatMul A[M,K] B[K,N]: sqrt(MK KN / MN)
    = K; ConvGrad's dX: C_out sqrt(kh kw), its dW: N H W / sqrt(kh kw), within a factor 3 of
    the true count), sqrt(|a| |b| / |out|); never more than the largest input holds."""
    if not sizes:
        return 1.0
    if n_ary:
        k = float(len(sizes))
    elif len(sizes) == 1:
        k = sizes[0] / max(out, 1)
    else:
        k = math.sqrt(sizes[0] * sizes[1] / max(out, 1))
    return min(max(k, 1.0), float(max(sizes)))


def gradient_error(ours, want, tolerance: float, floor: float) -> float:
    """The error of a gradient against ONNX Runtime's, on the scale of `tolerance`: the relative
    norm error, except against an all-zero reference, where only an absolute rounding `floor`
    can judge (a gradient that is zero in exact arithmetic may come out exactly zero on one side
    and as rounding noise on the other, and ONNX Runtime's threaded reductions round differently
    from run to run): ||ours|| / floor * tolerance, so it passes when ||ours|| <= floor."""
    err = rel_norm_error(ours, want)
    if math.isinf(err) and floor > 0 and np.shape(ours) == np.shape(want) and not np.any(want):
        got = np.asarray(ours, np.float64)
        if np.all(np.isfinite(got)):
            return float(np.linalg.norm(got)) / floor * tolerance
    return err


def floored(tolerance: float, floor: float, want) -> float:
    """`tolerance` on a relative norm error, raised to what an absolute error `floor` is
    relative to ||want|| (an all-zero `want` keeps it: exact zeros agree exactly)."""
    if not floor > 0:
        return tolerance
    ref = _norm(np.asarray(want))  # blockwise: no float64 copy of a large output (GPT-2's logits: 411 MB)
    return max(tolerance, floor / ref) if ref > 0 else tolerance


class _Hooks:
    """The per-node hook: capture and replace gradients before the optimizer; compare every
    output with ONNX Runtime's in a traced step."""

    def __init__(self, grad_names: set[str], xp: Any) -> None:
        self.grad_names, self.xp = grad_names, xp
        # our gradient (name, array) where it reaches the optimizer -> the value to use instead
        self.on_gradient: Callable[[str, Any], np.ndarray | None] = lambda name, array: None
        self.reference: dict[str, np.ndarray] | None = None  # traced step: ORT's intermediates
        self.tolerance: dict[str, float] = {}  # value -> its tolerance, where not "intermediate"
        self.floor: dict[str, float] = {}  # value -> its absolute error floor (bn_floor, bn_grad_floor, reduction_floor)
        self.first: Check | None = None
        self.nodes: NodeReference | None = None  # ONNX Runtime's kernels, node by node (node_check.py)
        self.node_checks: NodeChecks | None = None  # the step's per-node checks, while they are made

    def wrap(self, node, fn):
        # a gradient may reach the optimizer as a swapped-in copy, `NAME@inK`
        grads = [k for k, i in enumerate(node.inputs) if original_name(i) in self.grad_names]
        counterpart = self.nodes.counterpart(node) if self.nodes is not None else "no reference"

        def run(ctx, inputs, outputs):
            for k in grads:
                want = self.on_gradient(original_name(node.inputs[k]), inputs[k])
                if want is not None:
                    _upload(self.xp, inputs[k], want)
            feeds = self._node_feeds(counterpart, inputs, outputs)  # copies before ours: in-place kernels
            rho, floors, own = self._own_floors(node, fn, ctx, inputs, outputs)
            fn(ctx, inputs, outputs)
            # ONNX Runtime's node after ours: a kernel refusing garbage (indices out of range) raises
            # first, where ONNX Runtime's may crash the process
            theirs = self._node_reference(node, counterpart, feeds)
            for k, (o, arr) in enumerate(zip(node.outputs, outputs)):
                if not o or arr is None or arr.dtype.kind != "f":
                    continue
                c, m = own.get(k, (0.0, 0.0))
                f = floors.get(k, 0.0) + c * m
                if rho > 0:  # the relative error the inputs carry in, passed on (see _inherited)
                    f += rho * _norm(arr)
                if f > 0:
                    self.floor[original_name(o)] = f
            if theirs is not None and feeds is not None and self.node_checks is not None:
                own_floors = {k: c * m for k, (c, m) in own.items()}
                if floors and rho > 0:  # the statistics' floors without what the input carries in
                    floors = self._stat_floors(node, inputs, 0.0)
                for k, f in floors.items():
                    own_floors[k] = own_floors.get(k, 0.0) + f
                for check in compare_node(node, outputs, theirs, own_floors, list(feeds.inputs.values())):
                    self.node_checks.add(check)
            if self.reference is not None and self.first is None:
                self._compare(node, outputs)

        return run

    def _own_floors(self, node, fn, ctx, inputs, outputs) -> tuple[float, dict, dict]:
        """Before the kernel (it may update its inputs in place): rho, the relative error the
        inputs carry in; the statistics' absolute floors (output -> floor, with rho); the
        reductions' own floors (output -> (c, M))."""
        stats = ort_step.is_batch_norm(node.domain, node.op_type) and len(node.inputs) >= 5 \
            and len([o for o in node.outputs if o]) > 1
        bn_grad = node.op_type == "BatchNormalizationGrad" and len(node.inputs) >= 5
        ln_grad = node.op_type == "LayerNormalizationGrad" and len(node.inputs) >= 5
        # BatchNormalizationGrad: only dY carries error in relative to itself; the saved mean's
        # floor is absolute (a centred channel's mean is ~0) and bn_grad_floor counts it already
        rho = self._inherited(node.inputs[:1] if bn_grad or ln_grad else node.inputs, inputs)
        floors: dict[int, float] = {}
        own: dict[int, tuple[float, float]] = {}
        if stats:
            floors = self._stat_floors(node, inputs, self._inherited(node.inputs[:1], inputs[:1]))
        elif bn_grad:
            own = bn_grad_floor(*(_download(a) for a in inputs[:5]))
        elif ln_grad:
            dy, x, scale, mean, inv_std = (_download(a) for a in inputs[:5])
            own = ln_grad_floor(dy, x, scale, mean, inv_std, axis=node.attrs.get("axis", -1))
        elif node.op_type in REDUCTION_OPS:
            own = reduction_floor(fn, ctx, inputs, outputs, self.xp)
        return rho, floors, own

    @staticmethod
    def _stat_floors(node, inputs, rho: float) -> dict[int, float]:
        return bn_floor(_download(inputs[0]), _download(inputs[3]), _download(inputs[4]),
                        node.attrs.get("momentum", 0.9), rho)

    def _node_feeds(self, counterpart, inputs, outputs) -> NodeFeeds | None:
        """Copies of what ONNX Runtime's node will read (None: the per-node check is off or the
        node has no counterpart: the reason is counted)."""
        checks, nodes = self.node_checks, self.nodes
        if checks is None or nodes is None:
            return None
        if isinstance(counterpart, str):
            checks.skipped[counterpart] += 1
            return None
        return nodes.feeds(counterpart, inputs, outputs)

    def _node_reference(self, node, counterpart, feeds) -> dict[int, np.ndarray] | None:
        """ONNX Runtime's outputs of `node` on `feeds` (None where there are none to compare)."""
        checks, nodes = self.node_checks, self.nodes
        if feeds is None or checks is None or nodes is None:
            return None
        try:
            theirs = nodes.run(counterpart, feeds)
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime refusing a node alone is a skip, counted
            checks.skipped[f"ONNX Runtime refused {node.op_type} alone: {ort_cause(str(exc))}"] += 1
            return None
        checks.checked += 1
        return theirs

    def _inherited(self, names, inputs) -> float:
        """The largest of the inputs' floors relative to their norms: the relative error they
        carry in from the reductions upstream, passed on as a relative error of each output
        (an estimate, not a bound: rounding errors of random sign pass through a linear map
        about as the values do; bounding them by magnitudes, ||kernel(|error|)||, would grow
        by ~sqrt(K) per layer and swallow everything in a deep network)."""
        rho = 0.0
        for name, arr in zip(names, inputs):
            f = self.floor.get(original_name(name), 0.0) if name else 0.0
            if f > 0 and arr is not None:
                n = _norm(arr)
                rho = max(rho, f / n if n > 0 else 0.0)
        return rho

    def _compare(self, node, outputs) -> None:
        reference = self.reference
        assert reference is not None  # the caller checks
        for name, arr in zip(node.outputs, outputs):
            want = reference.get(original_name(name)) if name else None
            if want is None or arr is None or tuple(want.shape) != tuple(arr.shape):
                continue
            err = rel_norm_error(_download(arr), want)
            tol = floored(self.tolerance.get(original_name(name), TOLERANCES["intermediate"]),
                          self.floor.get(original_name(name), 0.0), want)
            if err > tol:
                self.first = Check("intermediate", name, err, tol, node.name)
                return


class StepVerifier:
    """Our executor and ONNX Runtime's models, stepped together."""

    def __init__(self, graph, plan, folder: Path, *, xp: Any = np, learning_rate: float | None = None,
                 swap_dir=None, check_arena: bool = False) -> None:
        self.graph, self.folder = graph, Path(folder)
        self.params = list(graph.optimizer["params"])
        self.grad_name = dict(zip(self.params, graph.optimizer["grads"]))
        self.hooks = _Hooks(set(self.grad_name.values()), xp)
        # the training model read here for what it computes (gradients, running statistics, the
        # loss node; ConvGrad's pads repaired as ONNX Runtime runs it); it runs in a child process
        # per step (verification/ort_process.py), its nodes one at a time here (node_check.py)
        shapes = {n: v.spec.shape for n, v in graph.values.items() if v.spec is not None}
        self.ort = OrtTrainingStep(self.folder, shapes)
        self.hooks.nodes = NodeReference(self.ort.model)
        self.ex = Executor(graph, plan, xp=xp, check_arena=check_arena, swap_dir=swap_dir, wrap=self.hooks.wrap)
        # each side's own default: a default that differs between them is a difference to find
        self.ex.learning_rate = float(learning_rate) if learning_rate is not None else runner.DEFAULT_LEARNING_RATE
        self.lr = float(learning_rate) if learning_rate is not None else ORT_DEFAULT_LEARNING_RATE
        self.ort_opt = OrtOptimizerStep(self.folder)
        self.hooks.tolerance = {v: TOLERANCES["running"] for v in self.ort.running_of.values()}
        self.optimizer_node = {original_name(i): n.name for n in graph.nodes if n.phase == "optimizer"
                               for i in n.inputs if original_name(i) in self.grad_name}
        a = step_analysis(graph)  # recomputed copies make copies of values (`NAME@rcK`), not the originals
        self.grad_node = {}  # parameter -> the node that computed its gradient (before accumulating)
        self.grad_value = {}  # parameter -> the value that node computed
        for p, g in self.grad_name.items():
            n, self.grad_value[p] = a.producer_node(g), g
            if n is not None and n.op_type == "InPlaceAccumulatorV2" and n.inputs[1] in a.producer:
                self.grad_value[p] = n.inputs[1]
                n = a.producer_node(n.inputs[1])
            self.grad_node[p] = n.name if n is not None else ""
        # running statistic -> the node that updates it (its first reader)
        self.stat_node = {r: a.consumers[r][0] for r in self.ort.running_of if a.consumers.get(r)}
        # the state before the step and ONNX Runtime's gradients and loss inputs, out of memory
        self.store = TensorStore(swap_dir)
        self.ort_process = OrtProcess(self.folder, self.store, self.ort.conv_grad_shapes(shapes),
                                      current_threads().threads, graph.persistent_bytes)
        self._state_names: list[str] = []
        self._param_names: list[str] = []  # the parameters in the state's order (ORT's inputs)
        self.grad_param = {g: p for p, g in self.grad_name.items()}
        self.hooks.on_gradient = self._on_gradient
        self._theirs: Mapping[str, np.ndarray] = {}  # parameter -> ONNX Runtime's gradient
        self._grad_checks: dict[str, Check] | None = None  # the step's gradient checks, as made
        self._zero_grads: list[str] = []  # the step's parameters whose gradient is 0 on both sides
        self._noise_now: dict = {}  # this step's noise (ort_process: ONNX Runtime against itself)

    def close(self) -> None:
        if self.hooks.nodes is not None:
            self.hooks.nodes.close()
        self.store.close()
        if self.ex.swap is not None:
            self.ex.swap.close()

    def start(self, params: dict[str, np.ndarray]) -> None:
        self.ex.load_state(params)

    def _our_step(self, batch, random: list[str], reference=None) -> float:
        """Our step with ONNX Runtime's random draws (the nodes `random`, read from the store)."""
        h = self.hooks
        h.first, h.reference, h.floor = None, reference, {}
        self.ex.random.given = {n: self.store.get("random:" + n) for n in random}
        try:
            return self.ex.step(batch)
        finally:
            h.reference, self.ex.random.given = None, {}

    def _on_gradient(self, name: str, array: Any) -> np.ndarray | None:
        """Our gradient where it reaches the optimizer: compared with ONNX Runtime's now (the
        step's checks; none while explaining), which is returned to be used instead. ONNX
        Runtime's is read from the store here and dropped by the caller: one at a time."""
        p = self.grad_param.get(name)
        if p is None or p not in self._theirs:
            return None
        want = self._theirs[p]
        if self._grad_checks is not None:
            ours = array if isinstance(array, np.ndarray) else _download(array)
            floor = self.hooks.floor.get(self.grad_value[p], 0.0)
            t = floored(max(TOLERANCES["gradient"], NOISE_FACTOR * self._noise_now[("gradient", p)]), floor, want)
            self._grad_checks[p] = Check("gradient", p, gradient_error(ours, want, t, floor), t,
                                         self.grad_node.get(p, ""))
            if not np.any(want) and not np.any(ours):
                self._zero_grads.append(p)
        return want

    def _keep_state(self, batch: dict[str, np.ndarray]) -> None:
        """The state before the step (parameters, optimizer state) and the step's data into the
        store, each written from where it is (the state region): ONNX Runtime's process reads
        them, and so do ONNX Runtime's optimizer and the explanation of a failure."""
        self.store.clear()
        self._state_names = []
        for vclass in ("parameter", "optimizer_state"):
            for name, array in self.ex.state_views(vclass):
                self.store.put("state:" + name, array)
                self._state_names.append(name)
            if vclass == "parameter":
                self._param_names = list(self._state_names)
        for name, array in batch.items():
            self.store.put("batch:" + name, array)

    def step(self, k: int, batch: dict[str, np.ndarray]) -> StepReport:
        done = self.ex.steps_done
        self._release_arena()
        self._keep_state(batch)
        # ONNX Runtime's step and its noise run, in a child process while we hold only the state
        ort = self.ort_process.step(self._param_names, list(batch))
        self._noise_now = ort.noise
        self._theirs, self._grad_checks, self._zero_grads = StoredTensors(self.store, self.params, "grad:"), {}, []
        nodes = self.hooks.node_checks = NodeChecks()
        if self.ex.views:  # read-only views of their input: no kernel runs
            nodes.skipped["a view (no kernel)"] = len(self.ex.views)
        try:
            loss = self._our_step(batch, ort.random)
            grads = self._grad_checks
        finally:
            self._grad_checks = self.hooks.node_checks = None
        checks = [self._loss_check(loss, ort)]
        for p in self.params:  # a gradient that never reached the optimizer: inf
            checks.append(grads.get(p) or Check("gradient", p, float("inf"), TOLERANCES["gradient"],
                                                self.grad_node.get(p, "")))
        checks += self._update_checks(done)
        checks += self._running_checks(ort)
        checks += nodes.failures + ([nodes.worst] if nodes.worst is not None and nodes.worst.ok else [])
        worst: dict[str, Check] = {}
        for c in checks:
            if c.kind not in worst or c.ratio > worst[c.kind].ratio:
                worst[c.kind] = c
        failures = sorted((c for c in checks if not c.ok), key=lambda c: -c.ratio)
        rep = StepReport(k, loss, ort.loss, worst, failures, zero_gradients=tuple(self._zero_grads), nodes=nodes)
        if any(c.kind != "node" for c in failures):  # the end-to-end comparison failed: found again node by node
            self._explain(rep, batch, done)
        first_node = nodes.failures[0] if nodes.failures else None
        eo = self.ex.eo
        if first_node is not None and (rep.first_difference is None or eo.get(first_node.node, len(eo))
                                       <= eo.get(rep.first_difference.node, len(eo))):
            # the first difference in execution order is a kernel that differs on the same inputs
            rep.first_difference = first_node
            rep.explanation = "our kernel and ONNX Runtime's differ on the same inputs at this node"
        return rep

    def _release_arena(self) -> None:
        """Before ONNX Runtime's process runs: the arena's pages given back (nothing in it is live
        between steps) and what this process freed, so that it holds only the state meanwhile."""
        if self.ex.swap is None and self.ex.checker is None:  # (a swap policy may prefetch across
            self.ex.arena.release_pages()  # steps; the checker reads poison)
        give_back_freed()

    def _loss_check(self, loss: float, ort: StepOutcome) -> Check:
        check = Check("loss", "loss", abs(loss - ort.loss) / max(abs(ort.loss), 1e-12), TOLERANCES["loss"])
        check.tolerance = max(TOLERANCES["loss"], NOISE_FACTOR * self._noise_now["loss"],
                              ort.loss_floor / max(abs(ort.loss), 1e-30))
        if not check.ok:  # ONNX Runtime's own float32 reduction may be the less accurate one
            n = len(self.ort.loss_node.input) if self.ort.loss_node is not None else 0
            exact = self.ort.exact_loss([self.store.get(f"loss:{k}") if k in ort.loss_inputs else None
                                         for k in range(n)])
            if exact is not None and exact != 0.0:
                ours_err, ort_err = abs(loss - exact) / abs(exact), abs(ort.loss - exact) / abs(exact)
                if ours_err < ort_err:
                    check = Check("loss", "loss (against the loss node in float64 on ONNX Runtime's inputs)",
                                  ours_err, check.tolerance)
        return check

    def _running_checks(self, ort: StepOutcome) -> list[Check]:
        checks = []
        running = self.ex.parameters(ort.running)
        for name, want in StoredTensors(self.store, ort.running, "running:").items():
            got = running.get(name)
            err = float("inf") if got is None else rel_norm_error(got, want)
            t = max(TOLERANCES["running"], NOISE_FACTOR * self._noise_now[("running", name)])
            t = floored(t, self.hooks.floor.get(self.ort.running_of[name], 0.0), want)
            checks.append(Check("running", name, err, t, self.stat_node.get(name, "")))
        return checks

    def _update_checks(self, done: int) -> list[Check]:
        """ONNX Runtime's optimizer on the state before the step and its gradients (both read
        from the store), against our updated parameters and moments, a group of parameters at a
        time (UPDATE_GROUP_BYTES): the whole model's updates never exist twice at once."""
        checks = []
        before = StoredTensors(self.store, self._state_names, "state:")
        sizes = {p: self.graph.values[p].nbytes for p in self.params}
        try:
            for names in _groups(self.params, sizes, UPDATE_GROUP_BYTES):
                want = self.ort_opt.run(names, self.lr, done + 1, before, self._theirs, before)
                got = {**self.ex.parameters(names), **self.ex.optimizer_state(set(want) - set(names))}
                for name, w in want.items():
                    g = got.get(name)
                    p = name.split(".exp_avg")[0]
                    # scale: ORT's update without its NaNs (NaN where ours is NaN too is agreement)
                    err = float("inf") if g is None else update_error(g, w, np.nan_to_num(w, nan=0.0))
                    checks.append(Check("update", name, err, TOLERANCES["update"], self.optimizer_node.get(p, "")))
        finally:
            self.ort_opt.release()
        return checks

    def _explain(self, rep: StepReport, batch, done: int) -> None:
        """Both sides again from the same state (read back from the store), ONNX Runtime exposing
        every intermediate; ours compared node by node in EO (gradients replaced by ORT's as
        before, so the optimizer nodes read what ORT computed)."""
        state = StoredTensors(self.store, self._state_names, "state:")
        self.ex.load_state(state, state, done)
        self._release_arena()
        ort = self.ort_process.explain(self._param_names, list(batch))
        self._theirs = StoredTensors(self.store, self.params, "grad:")
        self._our_step(batch, ort.random, reference=StoredTensors(self.store, ort.values, "value:"))
        first = self.hooks.first
        if first is not None:
            rep.first_difference = first
            return
        kinds = {c.kind for c in rep.failures}
        if kinds <= {"update"}:
            rep.explanation = ("every value of the training step matches; the optimizer's update differs "
                               "on identical inputs")
        elif kinds <= {"update", "running"}:
            rep.explanation = "the forward and backward values match; the state update differs"
        else:
            rep.explanation = "no single intermediate differs beyond tolerance; the differences accumulate"
        eo = self.ex.eo
        rep.first_difference = min(rep.failures, key=lambda c: eo.get(c.node, len(eo)))


UPDATE_GROUP_BYTES = 64 << 20  # parameters whose updates are compared at once (their moments: twice this)


def _groups(names: list[str], sizes: Mapping[str, int], limit: int) -> list[list[str]]:
    """`names` in order, cut into groups of at most `limit` bytes (`sizes`: name -> bytes; a
    larger one alone)."""
    groups: list[list[str]] = [[]]
    size = 0
    for name in names:
        n = sizes[name]
        if groups[-1] and size + n > limit:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += n
    return [g for g in groups if g]


def verify_run(prepared, *, steps: int, seed: int = 0, learning_rate: float | None = None, xp: Any = np,
               swap_dir=None, check_arena: bool = False, batches: list | None = None) -> Verification:
    """Verify `steps` steps of a prepared plan from the artifacts' checkpoint, on the seeded
    step data (as `run`). Stops after the first failing step (later steps would start from a
    state the failure produced)."""
    import onnxruntime

    from onnxplan.executor.runner import step_batches

    onnxruntime.set_default_logger_severity(3)
    batches = batches if batches is not None else step_batches(prepared.folder, steps, seed)
    v = StepVerifier(prepared.graph, prepared.plan, prepared.folder, xp=xp, learning_rate=learning_rate,
                     swap_dir=swap_dir, check_arena=check_arena)
    try:
        v.start(initial_parameters(prepared.folder))
        reports: list[StepReport] = []
        for k in range(steps):
            reports.append(v.step(k, batches[k]))
            if not reports[-1].ok:
                break
    finally:
        v.close()
    return Verification(all(r.ok for r in reports), reports, {**TOLERANCES, "node": NODE_TOLERANCE}, len(v.params),
                        v.ort_process.peak_rss_bytes)
