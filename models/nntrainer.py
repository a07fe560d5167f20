"""NNTrainer's component test cases (paper Table 4), trained with MSE and SGD.

Table 4 gives only input and output (label) shapes and a theoretical memory figure:

    Linear      64:1:1:150528 -> 64:1:1:300      390,590 KiB
    Conv2D      64:3:224:224  -> 64:3:112:112     65,856 KiB
    FC-FC-FC    2048:1:1:784  -> 2048:1:1:100    135,928 KiB
    Conv-AC-FL  64:3:224:224  -> 64:1:1:37632     65,856 KiB

(the LSTM case is not in the zoo). What the paper leaves open, assumed here:
- Linear is one fully connected layer with bias (Gemm).
- Conv2D is one convolution with 3 filters, 3x3 kernel, stride 2, padding 1, with bias:
  224 -> (224 + 2 - 3) // 2 + 1 = 112. Parameters 3*3*3*3 + 3 = 84.
- FC-FC-FC is three fully connected layers with bias and no activation in between (an
  NNTrainer fully connected layer has none), hidden sizes 4096 and 768. The paper does not
  give them; these are the round sizes for which the paper's own accounting (2 x parameters
  + input + 2 x each layer output: it reproduces the Linear row within 0.002 %) gives the
  FC-FC-FC row's 135,928 KiB within 0.06 %. Figure 10's non-trainable experiment freezes the
  second layer: `nnt-fc3-frozen`.
- Conv-AC-FL is the Conv2D case followed by an activation (ReLU: NNTrainer runs it in place)
  and a Flatten: 3 * 112 * 112 = 37632 outputs, matching the table, and its theoretical
  memory equals the Conv2D row's because both extra layers are views of the conv output.
"""

from __future__ import annotations

from onnxplan.forward.spec import ForwardModel
from onnxplan.models._graph import GraphBuilder

__all__ = [
    "build_nnt_conv2d",
    "build_nnt_conv_ac_fl",
    "build_nnt_fc3",
    "build_nnt_fc3_frozen",
    "build_nnt_linear",
]


def build_nnt_linear(batch: int = 64, loss: str = "mse", in_features: int = 150528,
                     out_features: int = 300) -> ForwardModel:
    """One Linear layer (Gemm) 150528 -> 300.

    Input `x` float32 [batch, 150528]; output `y` float32 [batch, 300].
    Parameters 150528*300 + 300 = 45,158,700 (172 MiB): big whatever the batch.
    """
    g = GraphBuilder("nnt-linear", seed=0)
    x = g.input("x", "float32", (batch, in_features), -1.0, 1.0)
    y = g.linear(x, in_features, out_features, "fc1", gain=1.0)
    return g.forward(y, (batch, out_features), loss, doc=build_nnt_linear.__doc__ or "")


def build_nnt_conv2d(batch: int = 64, loss: str = "mse", size: int = 224) -> ForwardModel:
    """One Conv2D: 3 -> 3 channels, kernel 3, stride 2, padding 1, with bias.

    Input `x` float32 [batch, 3, 224, 224]; output `y` float32 [batch, 3, 112, 112].
    Parameters 84. `size` (even) shrinks the image for quick tests: output is size / 2.
    """
    g = GraphBuilder("nnt-conv2d", seed=0)
    x = g.input("x", "float32", (batch, 3, size, size), -1.0, 1.0)
    y = g.conv(x, 3, 3, 3, 2, 1, "conv1")
    return g.forward(y, (batch, 3, size // 2, size // 2), loss, doc=build_nnt_conv2d.__doc__ or "")


def build_nnt_fc3(batch: int = 2048, loss: str = "mse", hidden: tuple[int, int] = (4096, 768),
                  frozen_middle: bool = False, name: str = "nnt-fc3") -> ForwardModel:
    """Three fully connected layers (Gemm, no activation) 784 -> 4096 -> 768 -> 100.

    Input `x` float32 [batch, 784]; output `y` float32 [batch, 100].
    Parameters 784*4096+4096 + 4096*768+768 + 768*100+100 = 6,438,756.
    `frozen_middle` keeps fc2 out of requires_grad (paper Figure 10).
    """
    g = GraphBuilder(name, seed=0)
    h = g.input("x", "float32", (batch, 784), -1.0, 1.0)
    sizes = (784, *hidden, 100)
    for i in range(3):
        h = g.linear(h, sizes[i], sizes[i + 1], f"fc{i + 1}", frozen=frozen_middle and i == 1, gain=1.0)
    return g.forward(h, (batch, 100), loss, doc=build_nnt_fc3.__doc__ or "")


def build_nnt_fc3_frozen(batch: int = 2048, loss: str = "mse",
                         hidden: tuple[int, int] = (4096, 768)) -> ForwardModel:
    """`nnt-fc3` with its second layer (fc2, 4096x768 + 768) non-trainable (paper Figure 10).

    Input `x` float32 [batch, 784]; output `y` float32 [batch, 100].
    """
    return build_nnt_fc3(batch, loss, hidden, frozen_middle=True, name="nnt-fc3-frozen")


def build_nnt_conv_ac_fl(batch: int = 64, loss: str = "mse", size: int = 224) -> ForwardModel:
    """Conv2D (3 -> 3, k3 s2 p1) -> ReLU -> Flatten.

    Input `x` float32 [batch, 3, 224, 224]; output `y` float32 [batch, 37632] (3*112*112).
    Parameters 84. `size` (even) shrinks the image for quick tests.
    """
    g = GraphBuilder("nnt-conv-ac-fl", seed=0)
    x = g.input("x", "float32", (batch, 3, size, size), -1.0, 1.0)
    h = g.node("Relu", [g.conv(x, 3, 3, 3, 2, 1, "conv1")], name="relu1")
    y = g.node("Flatten", [h], name="flatten", axis=1)
    return g.forward(y, (batch, 3 * (size // 2) ** 2), loss, doc=build_nnt_conv_ac_fl.__doc__ or "")
