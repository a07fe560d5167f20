"""Static shape inference: real ORT training graphs (every value vs a real run), folding, tricky rules."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from onnxplan.errors import ModelError, UnsupportedOpError
from onnxplan.ir.graph import Node
from onnxplan.ir.shape_rules import find_rule, registered_ops, rule_versions, shape_rule
from onnxplan.ir.shapes import infer_shapes
from onnxplan.ir.tensor import TensorSpec, onnx_to_numpy_dtype
from tests.kernel_harness import RNG

MS = "com.microsoft"
BATCH = 2  # value of every symbolic dim
OPSETS = {"": 17, MS: 1}
N = helper.make_node


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.1).astype(np.float32)


def _init(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _i64(*v):
    return np.array(v, np.int64)


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


# ---- small forward models, turned into training graphs by onnxruntime-training --------------
def _cnn():
    inits = [_init("W1", _w(8, 3, 3, 3)), _init("B1", _w(8)), _init("g1", np.ones(8, np.float32)),
             _init("be1", np.zeros(8, np.float32)), _init("rm1", np.zeros(8, np.float32)),
             _init("rv1", np.ones(8, np.float32)), _init("W2", _w(8, 8, 3, 3)), _init("Wfc", _w(10, 8)),
             _init("bfc", _w(10))]
    nodes = [N("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
             N("BatchNormalization", ["c1", "g1", "be1", "rm1", "rv1"], ["bn", "rm_out", "rv_out"], training_mode=1),
             N("Relu", ["bn"], ["r1"]), N("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             N("Conv", ["p1", "W2"], ["c2"], pads=[1, 1, 1, 1]), N("Relu", ["c2"], ["r2"]),
             N("Add", ["r2", "p1"], ["res"]), N("GlobalAveragePool", ["res"], ["gap"]),
             N("Flatten", ["gap"], ["fl"]), N("Gemm", ["fl", "Wfc", "bfc"], ["logits"], transB=1)]
    outs = [_vi("logits", TP.FLOAT, [BATCH, 10]), _vi("rm_out", TP.FLOAT, [8]), _vi("rv_out", TP.FLOAT, [8])]
    graph = helper.make_graph(nodes, "cnn", [_vi("x", TP.FLOAT, [BATCH, 3, 8, 8])], outs, inits)
    return graph, ["W1", "B1", "g1", "be1", "W2", "Wfc", "bfc"], "ce", "adamw"


def _attention(b="batch", t=6, d=16, v=20, h=2):
    inits = [_init(n, _w(*s)) for n, s in [("emb", (v, d)), ("pos", (t, d)), ("Wq", (d, d)), ("Wk", (d, d)),
                                            ("Wv", (d, d)), ("Wo", (d, d)), ("W1", (d, 4 * d)),
                                            ("b1", (4 * d,)), ("W2", (4 * d, d)), ("Wh", (d, v))]]
    inits += [_init("ln_g", np.ones(d, np.float32)), _init("ln_b", np.zeros(d, np.float32)),
              _init("shp", _i64(0, t, h, d // h)), _init("shp2", _i64(0, 0, d)), _init("flat", _i64(-1, v)),
              _init("mask", np.triu(np.full((t, t), -1e4, np.float32), 1)),
              _init("scale", np.float32(1 / np.sqrt(d // h))), _init("half", np.float32(0.5)),
              _init("one", np.float32(1.0)), _init("rs2", np.float32(1 / np.sqrt(2)))]
    nodes = [N("Gather", ["emb", "ids"], ["e"]), N("Add", ["e", "pos"], ["x0"]),
             N("LayerNormalization", ["x0", "ln_g", "ln_b"], ["ln", "ln_mean", "ln_istd"], axis=-1)]
    for p in "qkv":
        nodes += [N("MatMul", ["ln", f"W{p}"], [p]), N("Reshape", [p, "shp"], [f"{p}4"])]
    nodes += [N("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]), N("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
              N("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]), N("MatMul", ["qt", "kt"], ["s"]),
              N("Mul", ["s", "scale"], ["ss"]), N("Add", ["ss", "mask"], ["sm"]), N("Softmax", ["sm"], ["p"], axis=-1),
              N("MatMul", ["p", "vt"], ["o"]), N("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              N("Reshape", ["ot", "shp2"], ["o3"]), N("MatMul", ["o3", "Wo"], ["ao"]), N("Add", ["x0", "ao"], ["x1"]),
              N("MatMul", ["x1", "W1"], ["hh"]), N("Add", ["hh", "b1"], ["hb"]), N("Mul", ["hb", "rs2"], ["hs"]),
              N("Erf", ["hs"], ["he"]), N("Add", ["he", "one"], ["he1"]), N("Mul", ["hb", "he1"], ["hm"]),
              N("Mul", ["hm", "half"], ["g"]), N("MatMul", ["g", "W2"], ["m2"]), N("Add", ["x1", "m2"], ["x2"]),
              N("MatMul", ["x2", "Wh"], ["l3"]), N("Reshape", ["l3", "flat"], ["logits"])]
    outs = [_vi("logits", TP.FLOAT, ["bt", v]), _vi("ln_mean", TP.FLOAT, [b, t, 1]),
            _vi("ln_istd", TP.FLOAT, [b, t, 1])]
    graph = helper.make_graph(nodes, "attn", [_vi("ids", TP.INT64, [b, t])], outs, inits)
    params = ["emb", "pos", "ln_g", "ln_b", "Wq", "Wk", "Wv", "Wo", "W1", "b1", "W2", "Wh"]
    return graph, params, "ce", "adamw"


def _mlp_sgd():
    inits = [_init("W1", _w(12, 32)), _init("b1", _w(32)), _init("W2", _w(32, 5)), _init("b2", _w(5))]
    nodes = [N("MatMul", ["x", "W1"], ["h"]), N("Add", ["h", "b1"], ["h1"]), N("Sigmoid", ["h1"], ["r"]),
             N("MatMul", ["r", "W2"], ["o"]), N("Add", ["o", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [_vi("x", TP.FLOAT, ["batch", 12])], [_vi("y", TP.FLOAT, ["batch", 5])],
                              inits)
    return graph, ["W1", "b1", "W2", "b2"], "mse", "sgd"


def _wide():
    """Many ops at once, with a symbolic batch: slice, pad, split/concat, tile, clip, expand, where..."""
    inits = [_init("Wc", _w(4, 3, 3, 3)), _init("Wt", _w(2, 4, 2, 2)), _init("pads8", _i64(0, 0, 2, 2, 0, 0, 2, 2)),
             _init("sl_s", _i64(1, 0)), _init("sl_e", _i64(8, 100)), _init("sl_a", _i64(3, 2)),
             _init("sl_st", _i64(2, 1)), _init("split", _i64(16, 16, 32)), _init("W1", _w(64, 16)),
             _init("b1", _w(16)), _init("lo", np.float32(-1)), _init("hi", np.float32(1)), _init("ax0", _i64(0)),
             _init("ax1", _i64(1)), _init("rep", _i64(1, 2, 1)), _init("two", np.float32(2)), _init("W2", _w(16, 16)),
             _init("Wln", np.ones(16, np.float32)), _init("bln", np.zeros(16, np.float32)),
             _init("eshape", _i64(2, 1, 16)), _init("Wg", _w(5, 16)), _init("bg", _w(5))]
    nodes = [N("Conv", ["x", "Wc"], ["c"], pads=[1, 1, 1, 1]),
             N("AveragePool", ["c"], ["ap"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             N("LeakyRelu", ["ap"], ["lr"], alpha=0.1), N("Conv", ["lr", "Wt"], ["ct0"], auto_pad="SAME_UPPER"),
             N("Pad", ["ct0", "pads8"], ["ct"]), N("Slice", ["ct", "sl_s", "sl_e", "sl_a", "sl_st"], ["sl"]),
             N("Tanh", ["sl"], ["th"]), N("Flatten", ["th"], ["fl"]),
             N("Split", ["fl", "split"], ["s1", "s2", "s3"], axis=1), N("Concat", ["s3", "s1", "s2"], ["cat"], axis=1),
             N("MatMul", ["cat", "W1"], ["h"]), N("Add", ["h", "b1"], ["hb"]), N("Mul", ["hb", "hb"], ["hsq"]),
             N("Clip", ["hsq", "lo", "hi"], ["cl"]), N("Unsqueeze", ["cl", "ax1"], ["un"]),
             N("Tile", ["un", "rep"], ["tl"]), N("Transpose", ["tl"], ["tt"], perm=[0, 2, 1]),
             N("ReduceMean", ["tt"], ["rm"], axes=[2], keepdims=0), N("Sigmoid", ["rm"], ["sg"]),
             N("Pow", ["sg", "two"], ["pw"]), N("Div", ["pw", "two"], ["dv"]), N("MatMul", ["dv", "W2"], ["m2"]),
             N("LayerNormalization", ["m2", "Wln", "bln"], ["ln", "lnm", "lni"], axis=-1),
             N("Expand", ["ln", "eshape"], ["ex"]), N("ReduceSum", ["ex", "ax0"], ["rs"], keepdims=0),
             N("Softmax", ["rs"], ["sm"], axis=1), N("Neg", ["sm"], ["ng"]), N("Exp", ["ng"], ["e2"]),
             N("Max", ["e2", "sm"], ["mx"]), N("Where", ["cond", "mx", "sm"], ["wh"]),
             N("Gemm", ["wh", "Wg", "bg"], ["logits"], transB=1)]
    inputs = [_vi("x", TP.FLOAT, ["batch", 3, 8, 8]), _vi("cond", TP.BOOL, ["batch", 16])]
    graph = helper.make_graph(nodes, "wide", inputs, [_vi("logits", TP.FLOAT, ["batch", 5])], inits)
    return graph, ["Wc", "Wt", "W1", "b1", "W2", "Wln", "bln", "Wg", "bg"], "ce", "adamw"


def _pools():
    """ceil_mode pooling where ONNX's and ONNX Runtime 1.19's arithmetic differ (MaxPool 5 -> 3)."""
    nodes = [N("MaxPool", ["x"], ["mp"], kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1),
             N("AveragePool", ["x"], ["ap"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
             N("GlobalMaxPool", ["x"], ["gm"]), N("Flatten", ["mp"], ["f1"]), N("Flatten", ["gm"], ["f3"]),
             N("Flatten", ["ap"], ["f2"]), N("Concat", ["f1", "f3", "f2"], ["f"], axis=1),
             N("ReduceMean", ["f"], ["fm"], axes=[1]), N("Mul", ["fm", "Wp"], ["fw"]),
             N("Add", ["fw", "bp"], ["logits"])]
    graph = helper.make_graph(nodes, "pools", [_vi("x", TP.FLOAT, ["batch", 2, 5, 5])],
                              [_vi("logits", TP.FLOAT, ["batch", 3])], [_init("Wp", _w(1, 3)), _init("bp", _w(3))])
    return graph, ["Wp", "bp"], "ce", "adamw"


MODELS = {"cnn": _cnn, "attention": _attention, "mlp_sgd": _mlp_sgd, "wide": _wide, "pools": _pools}


@pytest.fixture(scope="module")
def artifacts_dir(tmp_path_factory):
    ort.set_default_logger_severity(3)
    logging.disable(logging.WARNING)
    from onnxruntime.training import artifacts  # slow import (torch): only here

    root, built = tmp_path_factory.mktemp("shape-models"), {}

    def build(name):
        if name not in built:
            graph, params, loss, opt = MODELS[name]()
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            model.ir_version = 9
            out = root / name
            out.mkdir()
            losses = {"ce": artifacts.LossType.CrossEntropyLoss, "mse": artifacts.LossType.MSELoss}
            opts = {"adamw": artifacts.OptimType.AdamW, "sgd": artifacts.OptimType.SGD}
            names = [o.name for o in graph.output]
            artifacts.generate_artifacts(model, requires_grad=params, loss=losses[loss], optimizer=opts[opt],
                                         artifact_directory=str(out), loss_input_names=names[:1],
                                         additional_output_names=names[1:] or None)
            built[name] = out
        return built[name]

    return build


def _spec(vi) -> TensorSpec:
    tt = vi.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else BATCH for d in tt.shape.dim]
    if tt.shape.dim and tt.shape.dim[0].dim_param == "bt":
        dims[0] = BATCH * 6
    return TensorSpec(np.dtype(onnx_to_numpy_dtype(tt.elem_type)).name, dims)


def _to_nodes(graph) -> list[Node]:
    return [Node(n.name or f"n{i}", n.op_type, n.domain, list(n.input), list(n.output),
                 {a.name: helper.get_attribute_value(a) for a in n.attribute}) for i, n in enumerate(graph.node)]


def _infer(model):
    known = {vi.name: _spec(vi) for vi in model.graph.input}
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    opsets = {o.domain: o.version for o in model.opset_import}
    return known, infer_shapes(_to_nodes(model.graph), known, consts, opsets)


def _run_exposing_everything(model, known) -> dict[str, np.ndarray]:
    """Run the training model once with every node output as a graph output."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.ir_version = min(m.ir_version, 9)
    exposed = {o.name for o in m.graph.output}
    for name in [o for n in m.graph.node for o in n.output if o and o not in exposed]:
        m.graph.output.append(onnx.ValueInfoProto(name=name))
    # ORT's pooling-gradient kernels read dX's shape from value_info: make it concrete
    for vi in [*m.graph.value_info, *m.graph.input, *m.graph.output]:
        for i, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_param"):
                d.dim_value = BATCH * 6 if d.dim_param == "bt" else BATCH
    rng = np.random.default_rng(1)
    feeds = {}
    for vi in model.graph.input:
        spec = known[vi.name]
        if spec.dtype == "bool":
            feeds[vi.name] = np.ones(spec.shape, bool)
        elif spec.dtype == "int64":
            feeds[vi.name] = rng.integers(0, 3, spec.shape).astype(np.int64)
        elif vi.name.endswith(".accumulation.buffer"):
            feeds[vi.name] = np.zeros(spec.shape, spec.dtype)
        else:
            feeds[vi.name] = (rng.standard_normal(spec.shape) * 0.1).astype(spec.dtype)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


@pytest.mark.parametrize("name", list(MODELS))
def test_every_value_matches_a_real_onnxruntime_run(artifacts_dir, name):
    model = onnx.load(str(artifacts_dir(name) / "training_model.onnx"))
    known, (specs, folded) = _infer(model)
    produced = [o for n in model.graph.node for o in n.output if o]
    assert [v for v in produced if v not in specs] == []
    actual = _run_exposing_everything(model, known)
    assert set(produced) <= set(actual)
    wrong = {v: (str(specs[v]), f"{a.dtype.name}{list(a.shape)}") for v, a in actual.items()
             if (specs[v].dtype, specs[v].shape) != (a.dtype.name, a.shape)}
    assert wrong == {}
    assert {v for v, x in folded.items() if not np.array_equal(x, actual[v])} == set()


@pytest.mark.parametrize("name", ["cnn", "mlp_sgd"])
def test_flattened_optimizer_outputs_match_onnxruntime(artifacts_dir, name):
    folder = artifacts_dir(name)
    opt = onnx.load(str(folder / "optimizer_model.onnx"))
    node = opt.graph.node[0]
    params = {"p0": TensorSpec("float32", (3, 2)), "p1": TensorSpec("float32", (4,))}
    known = {"lr": TensorSpec("float32", (1,)), "step": TensorSpec("int64", (1,))}
    for p, s in params.items():
        known.update({p: s, f"{p}.g": s, f"{p}.m": s, f"{p}.v": s})
    if node.op_type == "AdamWOptimizer":
        ins = ["lr", "step", "p0", "p1", "p0.g", "p1.g", "p0.m", "p1.m", "p0.v", "p1.v"]
        outs = ["flag", "p0'", "p1'", "p0.m'", "p1.m'", "p0.v'", "p1.v'"]
    else:
        ins, outs = ["lr", "p0", "p1", "p0.g", "p1.g"], ["flag", "p0'", "p1'"]
    flat = Node("opt", node.op_type, node.domain, ins, outs, {"num_params": 2}, "optimizer")
    specs, _ = infer_shapes([flat], known, {}, OPSETS)
    assert {o: specs[o] for o in outs[1:]} == {o: params[o.split(".")[0].rstrip("'")] for o in outs[1:]}
    opt.ir_version = 9
    sess = ort.InferenceSession(opt.SerializeToString(), providers=["CPUExecutionProvider"])
    arrays = [np.ones(s.shape, np.float32) for s in params.values()]
    feeds = {"learning_rate": np.array([0.1], np.float32), "step": np.array([1], np.int64), "params": arrays,
             "gradients": arrays, "first_order_moments": arrays, "second_order_moments": arrays}
    flag = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})[0]
    assert specs["flag"] == TensorSpec(flag.dtype.name, flag.shape)


# ---- single ops checked against ONNX Runtime ------------------------------------------------
def _check_against_ort(nodes, inputs: dict, consts: dict, opset: int = 17):
    """Infer the nodes' shapes, run them in ORT, compare every output (and folded value)."""
    outs = [o for n in nodes for o in n.output if o]
    graph = helper.make_graph(nodes, "g", [_vi(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                                           for k, v in inputs.items()],
                              [onnx.ValueInfoProto(name=o) for o in outs], [_init(k, v) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    model.ir_version = 9
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    actual = dict(zip(outs, sess.run(outs, inputs)))
    known = {k: TensorSpec(v.dtype.name, v.shape) for k, v in inputs.items()}
    specs, folded = infer_shapes(_to_nodes(graph), known, consts, {"": opset, MS: 1})
    for o in outs:
        assert specs[o] == TensorSpec(actual[o].dtype.name, actual[o].shape), o
    for o, v in folded.items():
        np.testing.assert_array_equal(v, actual[o])
    return specs, folded


F = np.float32


def _x(*shape, dtype=F):
    return (np.arange(int(np.prod(shape))) % 7).reshape(shape).astype(dtype)


@pytest.mark.parametrize("attrs, a, b", [
    (dict(transA=1), (5, 3), (5, 4)), (dict(transB=1), (3, 5), (4, 5)),
    (dict(transA=1, transB=1), (5, 3), (4, 5)), (dict(transA=1), (2, 6, 5, 3), (5, 4)),
    (dict(transBatchA=1), (5, 2, 3), (2, 3, 4)), (dict(transBatchB=1), (2, 5, 3), (3, 2, 4)),
    (dict(transBatchA=1, transA=1), (3, 2, 5), (2, 3, 4)), (dict(transBatchB=1, transB=1), (2, 5, 3), (4, 2, 3)),
    (dict(alpha=2.0), (7,), (2, 7, 3)),
])
def test_fused_matmul_transposes(attrs, a, b):
    _check_against_ort([N("FusedMatMul", ["a", "b"], ["y"], domain=MS, **attrs)], {"a": _x(*a), "b": _x(*b)}, {})


@pytest.mark.parametrize("attrs, a, b", [(dict(transA=1), (5, 3), (5, 4)), (dict(transB=1), (3, 5), (4, 5)),
                                         (dict(transA=1, transB=1), (5, 3), (4, 5))])
def test_gemm_transposes(attrs, a, b):
    _check_against_ort([N("Gemm", ["a", "b", "c"], ["y"], **attrs)], {"a": _x(*a), "b": _x(*b)},
                       {"c": np.ones(4, F)})


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ((-1, 0), (-1000, 100), (3, 2), (-2, 1)), ((10,), (-10,), (1,), (-3,)), ((-3, 1), (2**62, -1), None, None),
    ((0,), (5,), (-1,), (-1,)), ((5, 5), (0, 0), (0, 1), (-1, -2)),
])
def test_slice_with_negative_steps(starts, ends, axes, steps):
    consts = {"s": _i64(*starts), "e": _i64(*ends)}
    ins = ["x", "s", "e"]
    if axes is not None:
        consts["a"], consts["st"], ins = _i64(*axes), _i64(*steps), ins + ["a", "st"]
    _check_against_ort([N("Slice", ins, ["y"])], {"x": _x(6, 7, 8, 9)}, consts)


def test_squeeze_unsqueeze_with_axes_as_inputs():
    nodes = [N("Unsqueeze", ["x", "ua"], ["u"]), N("Squeeze", ["u", "sa"], ["s"]), N("Squeeze", ["u"], ["all"])]
    specs, _ = _check_against_ort(nodes, {"x": _x(3, 1, 4)}, {"ua": _i64(-1, 0), "sa": _i64(0, 2)})
    assert specs["u"].shape == (1, 3, 1, 4, 1) and specs["all"].shape == (3, 4)


def test_ort_training_ops_against_their_kernels():
    nodes = [
        N("ConvGrad", ["dy", "x", "w"], ["dx", "dw", "db"], domain=MS, pads=[1, 1, 1, 1], strides=[2, 2]),
        N("ConvGrad", ["dy", "x", "w"], ["", "dw2"], domain=MS, pads=[1, 1, 1, 1], strides=[2, 2]),
        N("BatchNormInternal", ["x", "g", "b", "m", "v"], ["y", "rm", "rv", "sm", "sis"], domain=MS),
        N("SoftmaxCrossEntropyLoss", ["sc", "lab"], ["loss", "logp"], reduction="none"),
        N("SoftmaxCrossEntropyLossGrad", ["dl", "logp", "lab"], ["dsc"], domain=MS, reduction="none"),
        N("GatherGrad", ["gshape", "idx", "dg"], ["demb"], domain=MS),
        N("InPlaceAccumulatorV2", ["buf", "dw", "flag"], ["done", "buf_out"], domain=MS),
        N("BroadcastGradientArgs", ["sa", "sb"], ["ra", "rb"], domain=MS),
        N("LayerNormalization", ["sc", "g5", "b5"], ["ln", "lnm", "lni"], axis=1),
    ]
    inputs = {"dy": _x(2, 4, 3, 3), "x": _x(2, 3, 5, 5), "sc": _x(2, 5, 3), "lab": np.zeros((2, 3), np.int64),
              "dl": _x(2, 3), "idx": np.array([[1, 0, 2]], np.int64), "dg": _x(1, 3, 4), "buf": _x(4, 3, 3, 3),
              "flag": np.array([True])}
    consts = {"w": _x(4, 3, 3, 3), "g": np.ones(3, F), "b": np.zeros(3, F), "m": np.zeros(3, F),
              "v": np.ones(3, F), "gshape": _i64(6, 4), "sa": _i64(2, 1, 5), "sb": _i64(7, 1),
              "g5": np.ones((5, 3), F), "b5": np.zeros((5, 3), F)}
    specs, folded = _check_against_ort(nodes, inputs, consts)
    assert specs["db"] == TensorSpec("float32", (4,)) and specs["sis"].shape == (3,)
    assert specs["lnm"] == TensorSpec("float32", (2, 1, 1))
    assert folded["ra"].tolist() == [1] and folded["rb"].tolist() == [2, 0]


def _ort_cases():
    """(nodes, data inputs, constant inputs) per group of ops; each group runs once in ORT."""
    x, dy, bias = _x(2, 3, 4), _x(2, 3, 4), np.ones(4, F)
    acts = [N(op, ["dy", "x"], [op], domain=MS) for op in
            ("ReluGrad", "SigmoidGrad", "TanhGrad", "GeluGrad", "FastGeluGrad", "SoftmaxGrad", "LogSoftmaxGrad")]
    acts += [N("BiasGeluGrad_dX", ["dy", "x", "bias"], ["bg"], domain=MS), N("Gelu", ["x"], ["g"], domain=MS),
             N("SoftmaxGrad_13", ["dy", "x"], ["sg"], domain=MS, axis=-1), N("FastGelu", ["x", "bias"], ["fg"], domain=MS),
             N("LogSoftmaxGrad_13", ["dy", "x"], ["lsg"], domain=MS, axis=1)]
    norms = [N("LayerNormalization", ["x", "g", "bias"], ["y", "m", "isd"], axis=-1),
             N("LayerNormalizationGrad", ["dy", "x", "g", "m", "isd"], ["dx", "dg", "db"], domain=MS, axis=-1),
             N("SimplifiedLayerNormalization", ["x", "g"], ["sy", "sisd"], axis=-1),
             N("SimplifiedLayerNormalizationGrad", ["dy", "x", "g", "sisd"], ["sdx", "sdg"], domain=MS, axis=-1),
             N("BatchNormInternal", ["xb", "gb", "bb", "mb", "vb"], ["yb", "rm", "rv", "sm", "sis"], domain=MS),
             N("BatchNormalizationGrad", ["xb", "xb", "gb", "sm", "sis"], ["dxb", "dgb", "dbb"], domain=MS, epsilon=1e-5)]
    c3 = {n: np.full(3, v, F) for n, v in (("gb", 1), ("bb", 0), ("mb", 0), ("vb", 1))}
    nn = [N("Conv", ["x", "w"], ["c1"], auto_pad="SAME_UPPER", strides=[2, 2]),
          N("Conv", ["x", "w"], ["c2"], dilations=[2, 2], pads=[0, 1, 2, 0]),
          N("Conv", ["x", "wg"], ["c3"], group=2, auto_pad="VALID", strides=[3, 1]),
          N("Conv", ["x", "w"], ["c4"], auto_pad="SAME_LOWER", strides=[3, 2]),
          N("ConvTranspose", ["x", "wt"], ["t1"], strides=[2, 3], output_padding=[1, 0], pads=[1, 0, 0, 1]),
          N("ConvTranspose", ["x", "wt"], ["t2"], strides=[2, 2], auto_pad="SAME_UPPER"),
          N("ConvTranspose", ["x", "wt"], ["t3"], strides=[2, 2], output_shape=[15, 16]),
          N("MaxPool", ["x"], ["m1", "i1"], kernel_shape=[3, 2], dilations=[2, 1], strides=[1, 2]),
          N("MaxPool", ["x"], ["m2"], kernel_shape=[3, 3], auto_pad="SAME_LOWER", strides=[2, 2]),
          N("AveragePool", ["x"], ["a1"], kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 3]),
          N("AveragePool", ["x"], ["a2"], kernel_shape=[2, 4], strides=[3, 3], ceil_mode=1, pads=[1, 1, 0, 0]),
          N("GlobalAveragePool", ["x"], ["gap"]), N("InstanceNormalization", ["x", "s", "b"], ["inn"]),
          N("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn", "rm", "rv"], training_mode=1),
          N("MatMul", ["v1", "x"], ["mm1"]), N("MatMul", ["x", "v2"], ["mm2"])]
    c4 = {n: np.full(4, v, F) for n, v in (("s", 1), ("b", 0), ("m", 0), ("v", 1))}
    misc = [N("Trilu", ["m"], ["tu"], domain=MS), N("Range", ["a", "b", "c"], ["r"]), N("Tile", ["m", "rep"], ["t"]),
            N("TopK", ["m", "k"], ["tv", "ti"], axis=1), N("OneHot", ["ids", "depth", "vals"], ["oh"], axis=1),
            N("Pad", ["m", "pads"], ["p"]), N("GatherElements", ["m", "gi"], ["ge"], axis=1),
            N("GatherND", ["m", "ndi"], ["gnd"]), N("Split", ["m"], ["s1", "s2"], axis=1), N("Mod", ["a", "c"], ["md"]),
            N("ArgMax", ["m"], ["am"], axis=1, keepdims=0), N("Expand", ["m1", "es"], ["ex"]),
            N("LogSoftmax", ["m"], ["lsm"], axis=0), N("Resize", ["img", "", "scales"], ["rz"], mode="nearest"),
            N("NegativeLogLikelihoodLoss", ["m", "lab"], ["nll"], reduction="none")]
    misc_c = {"a": np.int64(1), "b": np.int64(10), "c": np.int64(3), "rep": _i64(2, 1), "k": _i64(2),
              "ids": _i64(0, 2, 1), "depth": np.int64(5), "vals": np.array([0, 1], F), "pads": _i64(1, 0, 2, 3),
              "gi": np.zeros((4, 2), np.int64), "ndi": _i64(1, 2).reshape(1, 2), "m1": _x(1, 6), "es": _i64(3, 1, 1),
              "scales": np.array([1, 1, 2, 1.5], F), "lab": _i64(0, 1, 2, 3)}
    return {
        "activation_grads": (acts, {"dy": dy, "x": x}, {"bias": bias}),
        "norms_and_grads": (norms, {"x": x, "dy": dy, "xb": _x(2, 3, 4, 4)}, {"g": bias, "bias": bias, **c3}),
        "sce_internal": ([N("SoftmaxCrossEntropyLossInternal", ["sc", "lab"], ["l", "lp"], domain=MS),
                          N("SoftmaxCrossEntropyLossInternalGrad", ["dl", "lp", "lab"], ["d"], domain=MS)],
                         {"sc": _x(2, 5, 3), "lab": np.zeros((2, 3), np.int64), "dl": np.array(1.0, F)}, {}),
        "reduce_sum_training": ([N("ReduceSumTraining", ["x", "ax"], ["y"], domain=MS, keepdims=0),
                                 N("ReduceSumTraining", ["x", "e"], ["z"], domain=MS, noop_with_empty_axes=1)],
                                {"x": x}, {"ax": _i64(-1, 0), "e": np.zeros(0, np.int64)}),
        "slice_and_gather_grads": ([N("SliceGrad", ["dy", "shp", "s", "e", "a", "st"], ["dx"], domain=MS),
                                    N("GatherElementsGrad", ["dy", "shp", "idx"], ["dx2"], domain=MS, axis=1)],
                                   {"dy": _x(2, 4), "idx": np.zeros((2, 4), np.int64)},
                                   {"shp": _i64(2, 9), "s": _i64(1), "e": _i64(9), "a": _i64(1), "st": _i64(2)}),
        "concat_split_training": ([N("ConcatTraining", ["a", "b"], ["c", "len"], domain=MS, axis=1),
                                   N("SplitTraining", ["c", "len"], ["a2", "b2"], domain=MS, axis=1)],
                                  {"a": _x(2, 3), "b": _x(2, 5)}, {}),
        "scale_divgrad_dropout": ([N("Scale", ["x", "s"], ["y"], domain=MS), N("Dropout", ["x", "r", "t"], ["d", "mask"]),
                                   N("DivGrad", ["dy", "x", "b"], ["da", "db"], domain=MS),
                                   N("DropoutGrad", ["x", "mask", "r", "t"], ["dx"], domain=MS)],
                                  {"x": x, "dy": dy, "b": _x(1, 3, 1) + 1},
                                  {"s": np.float32(2), "r": np.float32(0.3), "t": np.array(True)}),
        "accumulators": ([N("InPlaceAccumulator", ["buf", "g", "flag"], ["o"], domain=MS),
                          N("ZeroGradient", ["buf", "g"], ["z"], domain=MS),
                          N("InPlaceAccumulatorV2", ["buf", "g"], ["done"], domain=MS)],
                         {"buf": _x(3, 2), "g": _x(3, 2), "flag": np.array([True])}, {}),
        "conv_pool_norm": (nn, {"x": _x(2, 4, 7, 8)}, {"w": _x(6, 4, 3, 3), "wg": _x(6, 2, 2, 3), "wt": _x(4, 3, 3, 2),
                                                      "v1": _x(7), "v2": _x(8), **c4}),
        "tensor_ops": (misc, {"m": _x(4, 6), "img": _x(1, 2, 3, 3)}, misc_c),
    }


@pytest.mark.parametrize("group", list(_ort_cases()))
def test_op_groups_against_onnxruntime(group):
    _check_against_ort(*_ort_cases()[group])


def test_max_and_average_pool_gradients_take_the_forward_input_shape():
    pool = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    nodes = [Node("mp", "MaxPool", "", ["x"], ["y", "idx"], pool),
             Node("mpg", "MaxPoolGrad", "", ["dy", "idx"], ["dx"], pool),
             Node("apg", "AveragePoolGrad", "", ["dy"], ["x_grad_1"], pool),
             Node("apg1", "AveragePoolGrad", "", ["dy"], ["other"], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]))]
    known = {"x": TensorSpec("float32", (2, 3, 112, 112)), "dy": TensorSpec("float32", (2, 3, 56, 56))}
    specs, _ = infer_shapes(nodes, known, {}, OPSETS)
    assert specs["y"].shape == specs["idx"].shape == (2, 3, 56, 56) and specs["idx"].dtype == "int64"
    assert specs["dx"] == specs["x_grad_1"] == known["x"]  # 111 would be the naive inverse
    assert specs["other"].shape == (2, 3, 56, 56)  # stride 1: the inverse is exact
    with pytest.raises(ModelError, match="ambiguous"):
        infer_shapes(nodes[3:4] + [Node("a", "AveragePoolGrad", "", ["dy"], ["q"], pool)], known, {}, OPSETS)
    hinted = {**known, "q": TensorSpec("float32", (2, 3, 111, 111))}  # e.g. from value_info
    assert infer_shapes([Node("a", "AveragePoolGrad", "", ["dy"], ["q"], pool)], hinted, {}, OPSETS)[0]["q"] == \
        hinted["q"]


# ---- engine: folding, errors, registry ------------------------------------------------------
def test_shape_gather_concat_reshape_chain_folds():
    nodes = [N("Shape", ["x"], ["s"]), N("Gather", ["s", "i0"], ["b"], axis=0),
             N("Shape", ["x"], ["tail"], start=-3), N("ReduceProd", ["tail"], ["hw"], keepdims=1),
             N("Unsqueeze", ["b", "ax"], ["b1"]), N("Concat", ["b1", "hw"], ["target"], axis=0),
             N("Reshape", ["x", "target"], ["y"]), N("Size", ["y"], ["n"]), N("Cast", ["n"], ["nf"], to=TP.FLOAT),
             N("ConstantOfShape", ["target"], ["zeros"], value=helper.make_tensor("v", TP.INT32, [1], [3])),
             N("Range", ["i0", "b", "one"], ["r"]), N("Constant", [], ["c"], value_ints=[4, 5])]
    specs, folded = _check_against_ort(nodes, {"x": _x(3, 4, 5, 6)}, {"i0": np.int64(0), "ax": _i64(0),
                                                                       "one": np.int64(1)})
    assert folded["target"].tolist() == [3, 120] and specs["y"].shape == (3, 120)
    assert folded["nf"].dtype == np.float32 and folded["zeros"].dtype == np.int32 and folded["r"].tolist() == [0, 1, 2]
    assert "y" not in folded  # x is data, not a constant


def test_folding_is_limited_to_small_values():
    nodes = [Node("z", "ConstantOfShape", "", ["shape"], ["big"], {})]
    specs, folded = infer_shapes(nodes, {}, {"shape": _i64(1000, 1000)}, OPSETS)
    assert specs["big"] == TensorSpec("float32", (1000, 1000)) and folded == {}


def test_split_training_takes_its_split_from_a_large_concat_training():
    """per_input_length is static (the inputs' extents) even when the concatenation is too large to fold."""
    nodes = [Node("c", "ConcatTraining", MS, ["a", "b"], ["cat", "len"], {"axis": 1}),
             Node("s", "SplitTraining", MS, ["cat", "len"], ["a2", "b2"], {"axis": 1})]
    known = {"a": TensorSpec("float32", (8, 300, 4)), "b": TensorSpec("float32", (8, 500, 4))}
    specs, folded = infer_shapes(nodes, known, {}, OPSETS)
    assert folded["len"].tolist() == [300, 500] and "cat" not in folded
    assert specs["a2"] == known["a"] and specs["b2"] == known["b"]


@pytest.fixture
def test_rules(monkeypatch):
    """Rules a test registers for its own test.domain ops are gone after it (the registry is
    global: tests/test_kernel_coverage.py checks every registered op has a kernel)."""
    from onnxplan.ir import shape_rules

    for op in ("TestNewOp", "TestOnlyOp"):
        monkeypatch.setitem(shape_rules._REGISTRY, ("test.domain", op), [])


def test_every_unsupported_op_is_listed_in_one_line(test_rules):
    nodes = [Node("a", "Foo", MS, ["x"], ["y"]), Node("b", "Relu", "", ["y"], ["z"]),
             Node("c", "Bar", "", ["z"], ["w"]), Node("d", "Foo", MS, ["w"], ["v"])]
    with pytest.raises(UnsupportedOpError) as err:
        infer_shapes(nodes, {"x": TensorSpec("float32", (2,))}, {}, OPSETS)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("no shape rule for op com.microsoft.Foo")
    assert msg == "no shape rule for op com.microsoft.Foo (nodes 'a', 'd'), op Bar (node 'c')"
    shape_rule("TestNewOp", "test.domain", since=5)(lambda node, specs, consts: list(specs))
    with pytest.raises(UnsupportedOpError, match=r"^no shape rule for op test.domain.TestNewOp at opset 3 \(node 'n'\)$"):
        infer_shapes([Node("n", "TestNewOp", "test.domain", ["x"], ["y"])], {"x": TensorSpec("float32", (1,))}, {},
                     {"test.domain": 3})


def test_unknown_input_and_wrong_order_are_clear_errors():
    with pytest.raises(ModelError, match=r"node 'r' \(Relu\): input 'nope' has no known shape"):
        infer_shapes([Node("r", "Relu", "", ["nope"], ["y"])], {}, {}, OPSETS)
    nodes = [Node("r", "Relu", "", ["y"], ["z"]), Node("s", "Sigmoid", "", ["x"], ["y"])]
    with pytest.raises(ModelError, match="before node 's' produces it"):
        infer_shapes(nodes, {"x": TensorSpec("float32", (2,))}, {}, OPSETS)
    with pytest.raises(ModelError, match=r"node 'rs' \(Reshape\): its shape \(input 1, 't'\) is not a constant"):
        infer_shapes([Node("rs", "Reshape", "", ["x", "t"], ["y"])],
                     {"x": TensorSpec("float32", (6,)), "t": TensorSpec("int64", (2,))}, {}, OPSETS)


def test_rules_are_registered_by_opset_range(test_rules):
    def old(node, specs, consts):
        return [specs[0]]

    def new(node, specs, consts):
        return [specs[0].with_dtype("float64")]

    shape_rule("TestOnlyOp", "test.domain", since=1, until=12)(old)
    shape_rule("TestOnlyOp", "test.domain", since=13)(new)
    assert rule_versions("test.domain", "TestOnlyOp") == [(1, 12), (13, None)]
    node, x = Node("t", "TestOnlyOp", "test.domain", ["x"], ["y"]), {"x": TensorSpec("float32", (2,))}
    assert infer_shapes([node], x, {}, {"test.domain": 12})[0]["y"].dtype == "float32"
    assert infer_shapes([node], x, {}, {"test.domain": 18})[0]["y"].dtype == "float64"
    assert find_rule("ai.onnx", "Relu", 17) is find_rule("", "Relu", 17) is not None
    with pytest.raises(ValueError, match="overlapping"):
        shape_rule("TestOnlyOp", "test.domain", since=12, until=13)(old)
    assert ("com.microsoft", "InPlaceAccumulatorV2") in registered_ops()


def test_required_ops_have_rules():
    onnx_ops = ("Add Sub Mul Div Pow Sqrt Reciprocal Neg Exp Log Erf Tanh Sigmoid Relu LeakyRelu Abs Where Equal "
                "Less Greater Not Cast CastLike Identity Constant ConstantOfShape Shape Size Gather GatherElements "
                "Concat Split Slice Reshape Flatten Squeeze Unsqueeze Transpose Expand Tile Range MatMul Gemm Conv "
                "ConvTranspose MaxPool AveragePool GlobalAveragePool BatchNormalization LayerNormalization Softmax "
                "LogSoftmax ReduceSum ReduceMean ReduceMax ReduceSumSquare SoftmaxCrossEntropyLoss "
                "NegativeLogLikelihoodLoss Dropout Trilu Sum Max Min Clip MaxPoolGrad AveragePoolGrad").split()
    ms_ops = ("ReluGrad SigmoidGrad TanhGrad GeluGrad FastGeluGrad BiasGeluGrad_dX Gelu FastGelu SoftmaxGrad "
              "SoftmaxGrad_13 LogSoftmaxGrad LogSoftmaxGrad_13 SoftmaxCrossEntropyLossGrad "
              "SoftmaxCrossEntropyLossInternal SoftmaxCrossEntropyLossInternalGrad SoftmaxCrossEntropy "
              "SoftmaxCrossEntropyGrad ConvGrad BatchNormInternal BatchNormalizationGrad LayerNormalizationGrad "
              "SimplifiedLayerNormalizationGrad InvertibleLayerNormalizationGrad FusedMatMul TransposeMatMul "
              "GatherGrad GatherElementsGrad Scale ReduceSumTraining InPlaceAccumulatorV2 InPlaceAccumulator "
              "ZeroGradient YieldOp DropoutGrad BiasDropout MixedPrecisionScale BroadcastGradientArgs "
              "ConcatTraining SplitTraining SliceGrad SGDOptimizerV2 AdamWOptimizer").split()
    missing = [op for op in onnx_ops if find_rule("", op, 17) is None]
    missing += [op for op in ms_ops if find_rule(MS, op, 1) is None]
    missing += [op for op in ("AdamWUpdate", "SGDUpdate") if find_rule("onnxplan", op, 1) is None]
    assert missing == []


def test_per_parameter_updates_and_layer_norm_stats():
    known = {n: TensorSpec("float32", (3, 4)) for n in ("p", "g", "m", "v")}
    known.update(lr=TensorSpec("float32", (1,)), step=TensorSpec("int64", (1,)), x=TensorSpec("float16", (2, 5, 6)))
    nodes = [Node("u", "AdamWUpdate", "onnxplan", ["lr", "step", "p", "g", "m", "v"], ["p2", "m2", "v2"]),
             Node("s", "SGDUpdate", "onnxplan", ["lr", "p", "g"], ["p3"]),
             Node("ln", "LayerNormalization", "", ["x", "p"], ["y", "mean", "istd"], {"axis": 1})]
    known["p"] = TensorSpec("float16", (5, 6))
    specs, _ = infer_shapes(nodes, known, {}, OPSETS)
    assert specs["m2"] == specs["v2"] == known["m"] and specs["p3"] == known["p"]
    assert specs["mean"] == specs["istd"] == TensorSpec("float32", (2, 1, 1)) and specs["y"].dtype == "float16"




@pytest.mark.parametrize("op, opset, name", [("Pad", 2, "pads"), ("Reshape", 1, "shape")])
def test_a_missing_required_attribute_is_named(op, opset, name):
    with pytest.raises(ModelError, match=rf"node 'p' \({op}\): attribute '{name}' is missing$"):
        infer_shapes([Node("p", op, "", ["x"], ["y"])], {"x": TensorSpec("float32", (2, 3))}, {}, {"": opset})
