"""Every statically inferred shape of every zoo model equals what ONNX Runtime produces."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxplan.data import make_step_batch, read_input_specs
from onnxplan.ir.load import read_step
from tests.zoo_small import SMALL, slow_if_large, small_artifacts


def _ort_values(folder, graph):
    """Run training_model.onnx once with every node output exposed; name -> array."""
    model = onnx.load(str(folder / "training_model.onnx"))
    exposed = {o.name for o in model.graph.output}
    for n in model.graph.node:
        for o in n.output:
            if o and o not in exposed:
                model.graph.output.append(onnx.ValueInfoProto(name=o))
                exposed.add(o)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    inputs, labels = read_input_specs(folder)
    feeds = make_step_batch(inputs, labels, seed=0, step=0)
    rng = np.random.default_rng(0)
    for i in sess.get_inputs():
        if i.name in feeds:
            continue
        spec = graph.values[i.name].spec
        if spec.dtype == "bool":
            feeds[i.name] = np.ones(spec.shape, bool)
        else:
            feeds[i.name] = (rng.standard_normal(spec.shape) * 0.1).astype(spec.dtype)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


@pytest.mark.parametrize("name", slow_if_large(SMALL))
def test_inferred_shapes_match_onnxruntime(name):
    folder = small_artifacts(name)
    graph = read_step(folder)
    assert graph.unshaped_values() == []
    actual = _ort_values(folder, graph)
    compared = 0
    for value, arr in actual.items():
        spec = graph.values[value].spec
        assert spec.shape == tuple(arr.shape), f"{name}: {value}: inferred {spec}, ORT {arr.dtype}{list(arr.shape)}"
        assert np.dtype(spec.dtype) == arr.dtype, f"{name}: {value}: dtype {spec.dtype} vs {arr.dtype}"
        compared += 1
    # every value a training-model node produces was compared
    produced = {o for n in graph.nodes if n.phase != "optimizer" for o in n.outputs if o}
    produced -= {o for o in produced if o.endswith(".accumulation.buffer.updated")}
    assert produced <= set(actual), sorted(produced - set(actual))[:5]
    assert compared >= len(produced)
    # optimizer outputs take their input's spec: parameters and moments are updated in place
    for p in graph.optimizer["params"]:
        assert graph.values[p + ".updated"].spec == graph.values[p].spec
