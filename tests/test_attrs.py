"""One reading of attributes and axes for the shape rules and the kernels (issue 14)."""

import pytest

from onnxplan.ir import attrs
from onnxplan.ir.graph import Node
from onnxplan.ir.shape_rules import ShapeInferenceError, _common
from onnxplan.kernels import _xp


def _node(**attributes) -> Node:
    return Node(name="n", op_type="Softmax", domain="", inputs=["x"], outputs=["y"], attrs=dict(attributes))


@pytest.mark.parametrize("rank", [0, 1, 2, 4])
def test_shape_rules_and_kernels_normalize_every_axis_alike(rank):
    for axis in range(-rank - 2, rank + 2):
        try:
            kernel = _xp.norm_axis(axis, rank)
        except ValueError:
            kernel = None
        try:
            rule = _common.norm_axis(_node(), axis, rank)
        except ShapeInferenceError:
            rule = None
        assert kernel == rule, (axis, rank)


def test_rank0_axis_minus_one_names_the_only_position():
    # the two copies used to disagree here: the kernels accepted -1 (and returned -1), the rules refused it
    assert _xp.norm_axis(-1, 0) == 0
    assert _common.norm_axis(_node(), -1, 0) == 0
    with pytest.raises(ShapeInferenceError):
        _common.norm_axis(_node(), -2, 0)


def test_string_attributes_decode_alike():
    node = _node(mode=b"reflect")
    assert _common.attr_str(node, "mode", "constant") == _xp.attr_str(node.attrs.get("mode"), "constant") == "reflect"
    assert _common.attr_str(_node(), "mode", "constant") == _xp.attr_str(None, "constant") == "constant"
    assert attrs.attr({"axis": None}, "axis", 1) == 1
