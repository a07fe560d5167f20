"""Multi-layer perceptrons: the MNIST-sized `mlp` and its frozen-middle twin `mlp-frozen`."""

from __future__ import annotations

from onnxplan.forward.spec import ForwardModel
from onnxplan.models._graph import GraphBuilder

__all__ = ["build_mlp", "build_mlp_frozen"]


def build_mlp(batch: int = 64, loss: str = "ce", sizes: tuple[int, ...] = (784, 256, 128, 10),
              frozen_layers: tuple[int, ...] = (), name: str = "mlp") -> ForwardModel:
    """MLP 784-256-128-10: Gemm + Relu per hidden layer, plain Gemm at the end.

    Input `x` float32 [batch, 784] in [-1, 1); output `logits` float32 [batch, 10].
    Layers are named fc1..fcN; `frozen_layers` (1-based) are kept out of requires_grad.
    Parameters: 784*256+256 + 256*128+128 + 128*10+10 = 235,146.
    """
    g = GraphBuilder(name, seed=0)
    h = g.input("x", "float32", (batch, sizes[0]), -1.0, 1.0)
    n_layers = len(sizes) - 1
    for i in range(n_layers):
        last = i == n_layers - 1
        h = g.linear(h, sizes[i], sizes[i + 1], f"fc{i + 1}", frozen=(i + 1) in frozen_layers,
                     gain=1.0 if last else 2.0)
        if not last:
            h = g.node("Relu", [h], name=f"relu{i + 1}")
    return g.forward(h, (batch, sizes[-1]), loss, doc=build_mlp.__doc__ or "")


def build_mlp_frozen(batch: int = 64, loss: str = "ce") -> ForwardModel:
    """The `mlp` (784-256-128-10) with its middle layer fc2 (256x128 + 128) frozen.

    NNTrainer's non-trainable-layer case: fc2's weights stay parameters (in the checkpoint)
    but get no gradient and no optimizer state, so its input activation need not be kept
    for a weight gradient. Input `x` float32 [batch, 784]; output `logits` [batch, 10].
    Trainable: 202,122 parameters; frozen: 32,896.
    """
    return build_mlp(batch, loss, frozen_layers=(2,), name="mlp-frozen")
