"""ONNX's own node conformance cases (onnx.backend.test.loader.load_model_tests(kind="node")) for
every op our kernels implement, and how one case runs: the op's shape rule gives the expected output
specs and its kernel the expected values, or the node is refused at plan time with one line (an
attribute value, opset form or dtype we do not support, listed in REFUSALS).

Outcomes of a case: "pass"; "ort" (an ORT_FOLLOWED case: equal to ONNX Runtime's output on the
case's own model, which departs from ONNX's expected one there); "refused"; "fail" (a wrong shape
or number); "error" (anything else raised). Dropout in training mode draws a random keep-mask: the
case's own mask (its mask output, or where its Y is not 0) is given to the kernel as the verifier
gives it ORT's, so Y is compared exactly too.

`python -m tests.conformance [-a]` prints the tally per op (-a: every op, not only those with
other outcomes than pass) and each case that does not pass.
"""

from __future__ import annotations

import collections
import sys
import warnings

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from onnxplan.errors import UnsupportedOpError
from onnxplan.ir.graph import Node
from onnxplan.ir.load import _attrs
from onnxplan.ir.shape_rules import ShapeInferenceError
from onnxplan.ir.shapes import infer_shapes
from onnxplan.ir.tensor import TensorSpec
from onnxplan.kernels.random import Randomness
from onnxplan.kernels.registry import DECLS, _load_all, find_kernel
from tests.kernel_harness import call_kernel

__all__ = ["ORT_FOLLOWED", "REFUSALS", "cases", "run_case", "tally"]

# Where our kernels follow ONNX Runtime 1.19 and it departs from ONNX (documented in the kernels'
# docstrings and README's kernel section): the training steps run on ORT and are verified against
# it, and the pooling gradients (com.microsoft AveragePoolGrad, MaxPoolGrad) exist only there.
ORT_FOLLOWED = {
    "test_averagepool_2d_ceil_last_window_starts_on_pad": "ORT keeps a ceil-mode window that starts in "
    "the right padding (it averages to 0)",
    "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True": "with count_include_pad "
    "ORT divides by the kernel size where a ceil-mode window overhangs the padded input; ONNX (and "
    "PyTorch) by the positions inside it",
    "test_resize_downsample_scales_linear_align_corners": "ORT's (and PyTorch's) align_corners divides by "
    "the integer output length - 1, ONNX's reference by input length * scale - 1",
}

# op -> the one-line refusals its node may get at plan time (a phrase of each message)
REFUSALS = {
    "Resize": ("mode 'cubic' is not supported", "'tf_crop_and_resize' is not supported",
               "antialias=1 is not supported", "keep_aspect_ratio_policy other than 'stretch' is not supported"),
    "Einsum": ("Einsum on bfloat16 is not supported",),
    # ONNX drops the window, ONNX Runtime 1.19 keeps it and reads outside the input (not reproducible)
    "MaxPool": ("starts past the input and its padding is not supported",),
}

# ops whose input 0 is not data but a shape the rule must read as a constant
_SHAPE_INPUT0 = {"ConstantOfShape"}


def _implemented() -> set[str]:
    _load_all()
    return {op for (domain, op), decls in DECLS.items() if domain == "" and any(d.fn for d in decls)}


def cases() -> list:
    """Every single-node default-domain node case whose op has a kernel, by name."""
    from onnx.backend.test.loader import load_model_tests

    ops = _implemented()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        every = load_model_tests(kind="node")
    chosen = {c.name: c for c in every
              if len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type in ops
              and c.model.graph.node[0].domain in ("", "ai.onnx")}
    return [chosen[name] for name in sorted(chosen)]


def _array(value) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, TensorProto) else np.asarray(value)


def _assert_values(got, want, case) -> None:
    if want.dtype.isbuiltin != 1:  # ml_dtypes' bfloat16, float8, int4...: exactly, NaN where NaN
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
    elif want.dtype.kind in "fc":
        np.testing.assert_allclose(got, want, rtol=max(case.rtol, 1e-5), atol=max(case.atol, 1e-5))
    else:
        np.testing.assert_array_equal(got, want)


def _ort_outputs(case, feeds: dict) -> list[np.ndarray]:
    """ONNX Runtime 1.19 on the case's model (stamped with the newest opset and IR it reads)."""
    import onnxruntime as ort

    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = min(opset.version, 21)
    model.ir_version = min(model.ir_version, 10)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [vi.name for vi in model.graph.input]
    return [np.asarray(r) for r in session.run(None, {k: v for k, v in feeds.items() if k in names})]


def _differs(a: np.ndarray, b: np.ndarray, case) -> bool:
    try:
        _assert_values(a, b, case)
    except AssertionError:
        return True
    return a.shape != b.shape


def _dropout_mask(proto, feeds, expected) -> Randomness | None:
    """The case's own keep-mask for a Dropout in training mode (None: not one)."""
    if proto.op_type != "Dropout":
        return None
    training = len(proto.input) > 2 and proto.input[2] and bool(np.asarray(feeds[proto.input[2]]))
    ratio = float(np.asarray(feeds[proto.input[1]])) if len(proto.input) > 1 and proto.input[1] else 0.5
    if not training or ratio == 0:
        return None
    if len(expected) > 1:
        keep = expected[1]
    else:
        assert np.all(feeds[proto.input[0]] != 0), "a zero input hides the case's mask"
        keep = expected[0] != 0
    random = Randomness()
    random.given["n"] = np.asarray(keep, dtype=bool)
    return random


def _run(case) -> str:
    """Run every data set of the case; "pass" or "ort", else raises."""
    model = case.model
    proto = model.graph.node[0]
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    node = Node("n", proto.op_type, "", list(proto.input), list(proto.output), _attrs(proto))
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    follow_ort = case.name in ORT_FOLLOWED
    for inputs, expected in case.data_sets:
        feeds = dict(values)
        feeds.update({vi.name: _array(a) for vi, a in zip(model.graph.input, inputs)})
        expected = [_array(w) for w in expected]
        if follow_ort:
            ort_out = _ort_outputs(case, feeds)
            assert any(_differs(o, w, case) for o, w in zip(ort_out, expected)), \
                f"{case.name}: ONNX Runtime now agrees with ONNX here (drop it from ORT_FOLLOWED)"
            expected = ort_out
        known = {k: TensorSpec(v.dtype.name, v.shape) for k, v in feeds.items()}
        # what a shape rule may read: every input but the data (input 0, unless a scalar or a shape)
        consts = {k: v for k, v in feeds.items()
                  if k != proto.input[0] or v.ndim == 0 or proto.op_type in _SHAPE_INPUT0}
        try:
            specs, _ = infer_shapes([node], known, consts, {"": opset})
        except ShapeInferenceError as exc:
            if "not supported" in str(exc):
                raise UnsupportedOpError(str(exc)) from None
            raise
        for name, want in zip(proto.output, expected):
            if name:
                assert specs[name] == TensorSpec(want.dtype.name, want.shape), (name, specs[name], want.shape)
        find_kernel(node, opset)
        outs = [np.full(w.shape, np.nan if w.dtype.kind == "f" else 0, w.dtype) for w in expected]
        outs += [None] * (len(proto.output) - len(outs))
        call_kernel(node, [feeds[n] if n else None for n in proto.input],
                    [o if name else None for o, name in zip(outs, proto.output)],
                    random=_dropout_mask(proto, feeds, expected))
        for got, want in zip(outs, expected):
            _assert_values(got, want, case)
    return "ort" if follow_ort else "pass"


def run_case(case) -> tuple[str, str]:
    """(outcome, message) of one case: pass, ort, refused, fail or error (see the module docstring)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _run(case), ""
    except UnsupportedOpError as exc:
        return "refused", str(exc)
    except AssertionError as exc:
        return "fail", " ".join(str(exc).split())[:400]
    except Exception as exc:  # noqa: BLE001 - an error is an outcome here
        return "error", f"{type(exc).__name__}: {exc}"


def tally(chosen=None) -> tuple[dict[str, collections.Counter], list[tuple[str, str, str, str]]]:
    """Per op, its outcomes' counts; and (op, case, outcome, message) of each case not passing."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    others = []
    for case in chosen if chosen is not None else cases():
        op = case.model.graph.node[0].op_type
        outcome, message = run_case(case)
        counts[op][outcome] += 1
        if outcome != "pass":
            others.append((op, case.name, outcome, message))
    return counts, others


def main(argv: list[str]) -> None:
    counts, others = tally()
    total: collections.Counter = collections.Counter()
    kinds = ("pass", "ort", "fail", "error", "refused")
    print(f"{sum(sum(c.values()) for c in counts.values())} cases over {len(counts)} ops")
    for op in sorted(counts):
        total.update(counts[op])
        if "-a" in argv or set(counts[op]) != {"pass"}:
            print(f"{op:28s} " + " ".join(f"{k} {counts[op][k]:3d}" for k in kinds))
    print(f"{'TOTAL':28s} " + " ".join(f"{k} {total[k]:3d}" for k in kinds))
    for op, name, outcome, message in others:
        print(f"{outcome:8s} {op:16s} {name}: {message[:200]}")


if __name__ == "__main__":
    main(sys.argv[1:])
