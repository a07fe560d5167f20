"""Convolutional networks for 3x32x32 (CIFAR-sized) images: VGG16 and ResNet18."""

from __future__ import annotations

from onnxplan.forward.spec import ForwardModel
from onnxplan.models._graph import GraphBuilder

__all__ = ["VGG16_CONVS", "build_resnet18", "build_vgg16"]

# VGG16's conv stack: channel counts, "M" = 2x2 max pool with stride 2.
VGG16_CONVS = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def build_vgg16(batch: int = 64, loss: str = "ce", classes: int = 10,
                fc: tuple[int, ...] = (256, 256)) -> ForwardModel:
    """VGG16 for 32x32 images, as in NNTrainer's swap experiment (batch 64, 32x32x3).

    Conv stack 64,64,M,128,128,M,256x3,M,512x3,M,512x3,M: each conv 3x3, stride 1, pad 1,
    with bias, followed by ReLU; M is MaxPool 2x2 stride 2, so 32x32 ends at 512x1x1.
    Classifier (assumed: the paper does not give it; two hidden layers of 256 after
    NNTrainer's VGG application): Flatten -> FC 512->256 -> ReLU -> FC 256->256 -> ReLU
    -> FC 256->10. Input `x` float32 [batch, 3, 32, 32]; output `logits` [batch, 10].
    Parameters 14,714,688 (convs) + 199,690 (classifier) = 14,914,378.
    """
    g = GraphBuilder("vgg16", seed=0)
    h = g.input("x", "float32", (batch, 3, 32, 32), -1.0, 1.0)
    c_in, conv_i, pool_i = 3, 0, 0
    for item in VGG16_CONVS:
        if item == "M":
            pool_i += 1
            h = g.node("MaxPool", [h], name=f"pool{pool_i}", kernel_shape=[2, 2], strides=[2, 2])
            continue
        conv_i += 1
        h = g.node("Relu", [g.conv(h, c_in, item, 3, 1, 1, f"conv{conv_i}")], name=f"relu{conv_i}")
        c_in = item
    h = g.node("Flatten", [h], name="flatten", axis=1)
    sizes = (c_in, *fc, classes)
    for i in range(len(sizes) - 1):
        last = i == len(sizes) - 2
        h = g.linear(h, sizes[i], sizes[i + 1], f"fc{i + 1}", gain=1.0 if last else 2.0)
        if not last:
            h = g.node("Relu", [h], name=f"fc_relu{i + 1}")
    return g.forward(h, (batch, classes), loss, doc=build_vgg16.__doc__ or "")


def _basic_block(g: GraphBuilder, x: str, c_in: int, c_out: int, stride: int, name: str) -> str:
    """conv3x3-BN-ReLU-conv3x3-BN + shortcut (1x1 conv + BN when the shape changes), ReLU."""
    h = g.conv(x, c_in, c_out, 3, stride, 1, f"{name}.conv1", bias=False)
    h = g.node("Relu", [g.batchnorm(h, c_out, f"{name}.bn1")], name=f"{name}.relu1")
    h = g.batchnorm(g.conv(h, c_out, c_out, 3, 1, 1, f"{name}.conv2", bias=False), c_out, f"{name}.bn2")
    shortcut = x
    if stride != 1 or c_in != c_out:
        sc = g.conv(x, c_in, c_out, 1, stride, 0, f"{name}.downsample.conv", bias=False)
        shortcut = g.batchnorm(sc, c_out, f"{name}.downsample.bn")
    return g.node("Relu", [g.node("Add", [h, shortcut], name=f"{name}.add")], name=f"{name}.relu2")


def build_resnet18(batch: int = 64, loss: str = "ce", classes: int = 10) -> ForwardModel:
    """ResNet18, CIFAR variant: 3x3 stem (64, stride 1, no max pool), 4 stages of 2 basic blocks.

    Stages 64, 128, 256, 512 channels; the first block of stages 2-4 has stride 2 and a
    1x1 conv + BN shortcut. Convs have no bias; BatchNormalization runs in training mode
    (outputs Y, running_mean, running_var declared; running stats are frozen parameters).
    Then GlobalAveragePool -> Flatten -> FC 512->10.
    Input `x` float32 [batch, 3, 32, 32]; output `logits` float32 [batch, 10].
    Parameters 11,173,962 trainable + 9,600 frozen (BN running stats).
    """
    g = GraphBuilder("resnet18", seed=0)
    h = g.input("x", "float32", (batch, 3, 32, 32), -1.0, 1.0)
    h = g.node("Relu", [g.batchnorm(g.conv(h, 3, 64, 3, 1, 1, "conv1", bias=False), 64, "bn1")],
               name="relu1")
    c_in = 64
    for stage, c_out in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            stride = 2 if stage > 1 and block == 0 else 1
            h = _basic_block(g, h, c_in, c_out, stride, f"layer{stage}.{block}")
            c_in = c_out
    h = g.node("Flatten", [g.node("GlobalAveragePool", [h], name="avgpool")], name="flatten", axis=1)
    h = g.linear(h, c_in, classes, "fc", gain=1.0)
    return g.forward(h, (batch, classes), loss, doc=build_resnet18.__doc__ or "")
