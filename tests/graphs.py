"""Hand-made step graphs for pass and planner tests."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from onnxplan.ir import Node, StepGraph, TensorSpec, Value, ValueClass

__all__ = ["GraphBuilder", "all_orders", "linear_chain", "make_graph", "three_linear_step"]


class GraphBuilder:
    """Build a StepGraph node by node with float32 values of given shapes."""

    def __init__(self, name: str = "g") -> None:
        self.g = StepGraph(name, [], {}, [], [], opsets={"": 17, "com.microsoft": 1})

    def value(self, name: str, shape, vclass=ValueClass.ACTIVATION, dtype="float32", trainable=False):
        self.g.values[name] = Value(name, TensorSpec(dtype, tuple(shape)), vclass, trainable)
        if vclass == ValueClass.INPUT:
            self.g.inputs.append(name)
        return name

    def const(self, name: str, array) -> str:
        arr = np.asarray(array)
        self.value(name, arr.shape, ValueClass.CONSTANT, arr.dtype.name)
        self.g.initializers[name] = arr
        return name

    def node(self, op: str, inputs, outputs, shapes=None, domain="", phase="forward",
             vclass=ValueClass.ACTIVATION, name=None, **attrs) -> Node:
        for k, o in enumerate(outputs):
            if o and o not in self.g.values:
                shape = shapes[k] if shapes else self.g.values[inputs[0]].spec.shape
                self.value(o, shape, vclass)
        n = Node(name or f"{op}_{len(self.g.nodes)}", op, domain, list(inputs), list(outputs), attrs, phase)
        self.g.nodes.append(n)
        return n


def three_linear_step(optimizer: str = "SGD", batch: int = 4) -> StepGraph:
    """NNTrainer Figure 6: three linear layers (MatMul), MSE-like loss, per-parameter grads,
    the joined optimizer node last, as onnxruntime-training lays a step out."""
    b = GraphBuilder("three-linear")
    T, G = ValueClass.TEMPORARY, ValueClass.GRADIENT
    b.value("x", (batch, 8), ValueClass.INPUT)
    b.value("lr", (1,), ValueClass.INPUT)
    for i, (k, m) in enumerate([(8, 16), (16, 16), (16, 4)]):
        b.value(f"W{i}", (k, m), ValueClass.PARAMETER, trainable=True)
    b.node("MatMul", ["x", "W0"], ["a0"], [(batch, 16)])
    b.node("Relu", ["a0"], ["r0"])
    b.node("MatMul", ["r0", "W1"], ["a1"], [(batch, 16)])
    b.node("Relu", ["a1"], ["r1"])
    b.node("MatMul", ["r1", "W2"], ["y"], [(batch, 4)])
    b.node("ReduceSumSquare", ["y"], ["loss"], [()], keepdims=0)
    b.g.outputs.append("loss")
    b.g.loss = "loss"
    bw = dict(phase="backward", vclass=T)
    b.node("Scale", ["y"], ["dy"], domain="com.microsoft", **bw)
    b.node("Gemm", ["r1", "dy"], ["dW2"], [(16, 4)], phase="backward", vclass=G, transA=1)
    b.node("Gemm", ["dy", "W2"], ["dr1"], [(batch, 16)], transB=1, **bw)
    b.node("ReluGrad", ["dr1", "r1"], ["da1"], domain="com.microsoft", **bw)
    b.node("Gemm", ["r0", "da1"], ["dW1"], [(16, 16)], phase="backward", vclass=G, transA=1)
    b.node("Gemm", ["da1", "W1"], ["dr0"], [(batch, 16)], transB=1, **bw)
    b.node("ReluGrad", ["dr0", "r0"], ["da0"], domain="com.microsoft", **bw)
    b.node("Gemm", ["x", "da0"], ["dW0"], [(8, 16)], phase="backward", vclass=G, transA=1)
    params, grads = ["W0", "W1", "W2"], ["dW0", "dW1", "dW2"]
    outs = [f"{p}.updated" for p in params]
    for o, p in zip(outs, params):
        b.value(o, b.g.values[p].spec.shape, ValueClass.PARAMETER, trainable=True)
    if optimizer == "SGD":
        b.node("SGDOptimizerV2", ["lr", *params, *grads], ["flag", *outs], [(1,)] * 4,
               domain="com.microsoft", phase="optimizer", vclass=T, num_params=3)
    else:
        b.value("step", (1,), ValueClass.OPTIMIZER_STATE, "int64")
        ms = [f"{p}.m" for p in params]
        vs = [f"{p}.v" for p in params]
        for s, p in zip(ms + vs, params + params):
            b.value(s, b.g.values[p].spec.shape, ValueClass.OPTIMIZER_STATE)
            b.value(s + ".updated", b.g.values[p].spec.shape, ValueClass.OPTIMIZER_STATE)
        b.node("AdamWOptimizer", ["lr", "step", *params, *grads, *ms, *vs],
               ["flag", *outs, *[s + ".updated" for s in ms + vs]], [(1,)] * 10,
               domain="com.microsoft", phase="optimizer", vclass=T, num_params=3)
    b.g.values["flag"].spec = TensorSpec("bool", (1,))
    b.g.outputs.extend(outs)
    b.g.optimizer = {"type": optimizer, "params": params, "grads": grads}
    return b.g


def make_graph(nodes, sizes, *, inputs=(), params=(), frozen=(), outputs=(), grads=()) -> StepGraph:
    """nodes: (name, inputs, outputs[, phase[, op, domain]]); sizes: value -> bytes.

    Values in `inputs` are step inputs, in `params`/`frozen` parameters, in `grads`
    gradients, names ending in ".updated" updated parameters; the rest are activations
    (forward) or temporaries. The first output is the loss.
    """
    values: dict[str, Value] = {}

    def add(name, vclass, trainable=False):
        if name not in values:
            values[name] = Value(name, TensorSpec("uint8", (sizes.get(name, 0),)), vclass, trainable)

    for x in inputs:
        add(x, ValueClass.INPUT)
    for p in params:
        add(p, ValueClass.PARAMETER, True)
    for p in frozen:
        add(p, ValueClass.PARAMETER, False)
    out = []
    for spec in nodes:
        name, ins, outs = spec[:3]
        phase = spec[3] if len(spec) > 3 else "forward"
        op, domain = (spec[4], spec[5]) if len(spec) > 5 else ("Op", "")
        for o in outs:
            if o.endswith(".updated"):
                add(o, ValueClass.PARAMETER, True)
            elif o in grads:
                add(o, ValueClass.GRADIENT)
            else:
                add(o, ValueClass.ACTIVATION if phase == "forward" else ValueClass.TEMPORARY)
        out.append(Node(name, op, domain, list(ins), list(outs), {}, phase))
    return StepGraph("hand", out, values, list(inputs), list(outputs),
                     loss=outputs[0] if outputs else "")


def all_orders(mm):
    """Every topological order of a small memory model."""
    succs = mm.succs()
    waiting = {n: len(mm.preds[n]) for n in mm.nodes}
    out, prefix = [], []

    def walk():
        if len(prefix) == len(mm.nodes):
            out.append(tuple(prefix))
            return
        for n in mm.nodes:
            if waiting[n] == 0 and n not in prefix:
                prefix.append(n)
                for s in succs[n]:
                    waiting[s] -= 1
                walk()
                for s in succs[n]:
                    waiting[s] += 1
                prefix.pop()

    walk()
    return out


def linear_chain(layers: int = 5, batch: int = 32, dim: int = 32, optimizer: str = "SGD"):
    """NNTrainer Figure 7: `layers` linear layers with ReLU, softmax cross-entropy, the
    backward pass and the joined optimizer, as onnxruntime-training lays a step out; every
    tensor is at least 4 KiB so every one of them may swap."""
    b = GraphBuilder(f"linear{layers}")
    T, G, P = ValueClass.TEMPORARY, ValueClass.GRADIENT, ValueClass.PARAMETER
    b.value("x", (batch, dim), ValueClass.INPUT)
    b.value("learning_rate", (1,), ValueClass.INPUT)
    params = [b.value(f"W{i}", (dim, dim), P, trainable=True) for i in range(layers)]
    h = "x"
    acts = []
    for i in range(layers):
        b.node("MatMul", [h, f"W{i}"], [f"a{i}"], [(batch, dim)])
        b.node("Relu", [f"a{i}"], [f"r{i}"])
        acts.append(h)
        h = f"r{i}"
    b.value("labels", (batch,), ValueClass.INPUT, "int64")
    b.node("SoftmaxCrossEntropyLoss", [h, "labels"], ["loss", "log_prob"], [(), (batch, dim)], reduction="mean")
    b.g.outputs.append("loss")
    b.g.loss = "loss"
    b.const("loss_grad", np.float32(1.0))
    b.node("SoftmaxCrossEntropyLossGrad", ["loss_grad", "log_prob", "labels"], ["d_r"], [(batch, dim)],
           domain="com.microsoft", phase="backward", vclass=T, reduction="mean")
    grads = []
    d = "d_r"
    for i in reversed(range(layers)):
        b.node("ReluGrad", [d, f"r{i}"], [f"da{i}"], domain="com.microsoft", phase="backward", vclass=T)
        b.node("Gemm", [acts[i], f"da{i}"], [f"dW{i}"], [(dim, dim)], phase="backward", vclass=G, transA=1)
        if i:
            b.node("Gemm", [f"da{i}", f"W{i}"], [f"dx{i}"], [(batch, dim)], phase="backward", vclass=T, transB=1)
            d = f"dx{i}"
        grads.append(f"dW{i}")
    grads.reverse()
    outs = [f"{p}.updated" for p in params]
    for o, p in zip(outs, params):
        b.value(o, (dim, dim), P, trainable=True)
    b.node("SGDOptimizerV2", ["learning_rate", *params, *grads], ["flag", *outs], [(1,)] * (layers + 1),
           domain="com.microsoft", phase="optimizer", vclass=T, num_params=layers)
    b.g.values["flag"].spec = TensorSpec("bool", (1,))
    b.g.outputs.extend(outs)
    b.g.optimizer = {"type": optimizer, "params": params, "grads": grads}
    return b.g


@st.composite
def step_graphs(draw, max_nodes: int = 8):
    """A random DAG laid out as a step: forward nodes, backward nodes (some named
    `<fwd>_Grad/...`, some not, some misleadingly), per-parameter updates at the end."""
    n_fwd = draw(st.integers(1, max(1, max_nodes // 2)))
    n_bwd = draw(st.integers(0, max_nodes - n_fwd))
    n_upd = draw(st.integers(0, 2))
    sizes = st.integers(0, 100)
    nodes, size, made = [], {"x": draw(sizes), "acc": draw(sizes)}, ["x"]
    params = [f"W{i}" for i in range(n_upd)]
    fwd_names = []
    for i in range(n_fwd + n_bwd):
        backward = i >= n_fwd
        pool = made if not backward else made + ["acc"]
        ins = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True))
        if params and draw(st.booleans()):
            ins.append(draw(st.sampled_from(params)))
        outs = [f"v{i}"] + ([f"u{i}"] if draw(st.booleans()) else [])
        for o in outs:
            size[o] = draw(sizes)
        if backward and draw(st.booleans()):
            name = f"{draw(st.sampled_from(fwd_names))}_Grad/Op_{i}"
        else:
            name = f"n{i}"
        if not backward:
            fwd_names.append(name)
        nodes.append((name, ins, outs, "backward" if backward else "forward"))
        made.extend(outs)
    for j, w in enumerate(params):
        grad = draw(st.sampled_from(made[1:]))
        nodes.append((f"upd{j}", ["x", w, grad], [f"{w}.updated"], "optimizer", "SGDUpdate", "onnxplan"))
    loss = draw(st.sampled_from(made[1:]))
    return make_graph(nodes, size, inputs=["x"], params=params, outputs=[loss])


def three_steps(g, opts, params, batch, *, poison=False, swap_dir=None, check_arena=False):
    """(losses, parameters, executor) after 3 steps of `g` planned with `opts` on one batch
    (learning rate 0.1); `poison` fills the arena with NaNs before each step, so a read of bytes
    that have not arrived yet (a late swap-in) shows."""
    from onnxplan.executor.runner import Executor
    from onnxplan.planning import plan_step

    res = plan_step(g, opts)
    ex = Executor(res.graph, res.plan, swap_dir=swap_dir, check_arena=check_arena)
    ex.load_state(params)
    ex.learning_rate = 0.1
    losses = []
    for _ in range(3):
        if poison:
            ex.arena.poison()
        losses.append(ex.step(batch))
    return losses, ex.parameters(), ex
