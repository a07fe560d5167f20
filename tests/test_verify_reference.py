"""The reference `--verify` compares with is ONNX Runtime's training model, repaired where ONNX
Runtime 1.19 is wrong (onnxplan.verification.ort_step.explicit_conv_grad_pads): its CPU ConvGrad
ignores auto_pad. Both ways against a brute-force float64 ConvGrad: the node as ONNX Runtime's
gradient builder writes it (auto_pad copied from the Conv) is wrong, the repaired node is right."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

from onnxplan.verification.ort_step import explicit_conv_grad_pads


def _conv_grad_model(auto_pad: str, x_shape, w_shape, dy_shape, strides, group: int) -> onnx.ModelProto:
    node = helper.make_node("ConvGrad", ["dY", "X", "W"], ["dX", "dW"], name="g", domain="com.microsoft",
                            auto_pad=auto_pad, kernel_shape=list(w_shape[2:]), strides=list(strides),
                            dilations=[1, 1], group=group)
    graph = helper.make_graph(
        [node], "conv_grad",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (("dY", dy_shape), ("X", x_shape),
                                                                              ("W", w_shape))],
        [helper.make_tensor_value_info("dX", TensorProto.FLOAT, x_shape),
         helper.make_tensor_value_info("dW", TensorProto.FLOAT, w_shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


def _run(model, feeds):
    opts = onnxruntime.SessionOptions()
    opts.log_severity_level = 3
    sess = onnxruntime.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _brute_force(dy, x, w, strides, pads_begin, group):
    """dX and dW of Y = Conv(X, W) by the definition, in float64: Y[n,m,oy,ox] = sum over the
    group's channels c and taps (i, j) of W[m,c,i,j] Xpad[n,c,oy*s+i,ox*s+j]."""
    dy, x, w = (a.astype(np.float64) for a in (dy, x, w))
    n, _, h, wd = x.shape
    m, cg, kh, kw = w.shape
    (sh, sw), (ph, pw) = strides, pads_begin
    dx, dw = np.zeros_like(x), np.zeros_like(w)
    for b, f, oy, ox, ci, i, j in itertools.product(range(n), range(m), range(dy.shape[2]), range(dy.shape[3]),
                                                    range(cg), range(kh), range(kw)):
        y, xx = oy * sh + i - ph, ox * sw + j - pw
        if 0 <= y < h and 0 <= xx < wd:
            ch = (f // (m // group)) * cg + ci
            dw[f, ci, i, j] += dy[b, f, oy, ox] * x[b, ch, y, xx]
            dx[b, ch, y, xx] += dy[b, f, oy, ox] * w[f, ci, i, j]
    return dx, dw


def _rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize(("auto_pad", "size", "kernel", "stride", "group"), [
    ("SAME_UPPER", 8, 3, 1, 4),  # hf-efficientnet's depthwise 3x3 (TorchScript export)
    ("SAME_UPPER", 7, 3, 2, 1),
    ("SAME_LOWER", 8, 2, 1, 1),  # an even window: the pads are asymmetric, the extra one at the start
    ("SAME_UPPER", 8, 4, 2, 2),
])
def test_onnxruntime_conv_grad_ignores_auto_pad_and_the_repair_is_exact(auto_pad, size, kernel, stride, group):
    rng = np.random.default_rng(size * 100 + kernel * 10 + stride + group)
    c, m = 4, 4
    out = -(-size // stride)
    x = rng.standard_normal((2, c, size, size)).astype(np.float32)
    w = rng.standard_normal((m, c // group, kernel, kernel)).astype(np.float32)
    dy = rng.standard_normal((2, m, out, out)).astype(np.float32)
    model = _conv_grad_model(auto_pad, x.shape, w.shape, dy.shape, (stride, stride), group)
    feeds = {"dY": dy, "X": x, "W": w}
    total = max(0, (out - 1) * stride + kernel - size)
    begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2  # ONNX's SAME rule
    want_dx, want_dw = _brute_force(dy, x, w, (stride, stride), (begin, begin), group)

    dx, dw = _run(model, feeds)
    assert _rel(dx, want_dx) > 0.1 or _rel(dw, want_dw) > 0.1, (
        "ONNX Runtime's ConvGrad now honours auto_pad: explicit_conv_grad_pads is no longer needed")

    shapes = {"dY": dy.shape, "X": x.shape, "W": w.shape}
    assert explicit_conv_grad_pads(model, shapes) == ["g"]
    attrs = {a.name: helper.get_attribute_value(a) for a in model.graph.node[0].attribute}
    assert "auto_pad" not in attrs and attrs["pads"] == [begin, begin, total - begin, total - begin]
    dx, dw = _run(model, feeds)
    assert _rel(dx, want_dx) < 1e-6 and _rel(dw, want_dw) < 1e-6


def test_the_repair_leaves_other_nodes_and_unknown_shapes_alone():
    shapes = {"dY": (1, 2, 4, 4), "X": (1, 2, 4, 4), "W": (2, 2, 3, 3)}
    for auto_pad in ("NOTSET", "VALID"):
        model = _conv_grad_model(auto_pad, shapes["X"], shapes["W"], shapes["dY"], (1, 1), 1)
        before = model.SerializeToString()
        assert explicit_conv_grad_pads(model, shapes) == []
        assert model.SerializeToString() == before
    model = _conv_grad_model("SAME_UPPER", shapes["X"], shapes["W"], shapes["dY"], (1, 1), 1)
    assert explicit_conv_grad_pads(model, {"dY": shapes["dY"]}) == []  # X's shape unknown: left as it is
