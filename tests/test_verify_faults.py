"""`run --verify` is right when the run is right and wrong when it is wrong: it passes on correct
plans (plain, swap, recompute) and fails on planted bugs of six kinds, naming the node."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from onnxplan.executor.prepare import Prepared
from onnxplan.loading.request import LoadRequest
from onnxplan.planning import PlanOptions
from onnxplan.verification.step_check import verify_run
from tests.faults import FAULTS, patch_kernel, prepared

FAULT = {f.name: f for f in FAULTS}

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _failure(prep: Prepared, steps: int = 1):
    v = verify_run(prep, steps=steps)
    assert not v.ok, "a planted fault passed verification"
    bad = next(s for s in v.steps if not s.ok)
    assert bad.first_difference is not None
    print(f"\nnamed: {bad.first_difference}")  # pytest -s shows what --verify says
    return bad.first_difference


@pytest.fixture(scope="module")
def mlp():
    return prepared("mlp", 2, "sgd")


def test_correct_runs_pass(mlp):
    v = verify_run(mlp, steps=2)
    assert v.ok, v.summary()


def test_gradient_sign_on_part_of_output(monkeypatch, mlp):
    def make(fn):
        def bad(ctx, inputs, outputs):
            fn(ctx, inputs, outputs)
            out = outputs[0].reshape(-1)
            out[: out.size // 4] *= -1
        return bad

    patch_kernel(monkeypatch, mlp.graph, "ReluGrad", "com.microsoft", make)
    first = _failure(mlp)
    assert first.node == "relu2_Grad/ReluGrad_0"  # the first ReluGrad in execution order


def test_overlapped_live_buffers(mlp):
    bufs = {b.name: b for b in mlp.plan.buffers}
    a, b = bufs["fc2"], bufs["relu2_grad"]  # both live over EO 10..20
    assert a.first_eo <= b.last_eo and b.first_eo <= a.last_eo
    moved = [dataclasses.replace(x, offset=a.offset) if x.name == b.name else x for x in mlp.plan.buffers]
    bad = Prepared(mlp.folder, mlp.graph, dataclasses.replace(mlp.plan, buffers=tuple(moved)))
    first = _failure(bad)
    assert first.node == "relu2_Grad/ReluGrad_0"  # reads relu2 (buffer fc2) after relu2_grad clobbered it


@pytest.mark.slow
def test_dropped_accumulation(monkeypatch):
    prep = prepared("resnet18", 2, "sgd")

    def make(fn):
        def bad(ctx, inputs, outputs):
            fn(ctx, inputs[:-1], outputs)  # the last term of the sum is dropped
        return bad

    patch_kernel(monkeypatch, prep.graph, "Sum", "", make)
    first = _failure(prep)
    order = [n for n in prep.plan.order]
    sums = [n.name for n in prep.graph.nodes if n.op_type == "Sum"]
    assert first.node == min(sums, key=order.index)


@pytest.mark.slow
def test_wrong_conv_stride(monkeypatch):
    prep = prepared("resnet18", 2, "sgd")

    def make(fn):
        def bad(ctx, inputs, outputs):
            if list(ctx.attrs.get("strides", [1, 1])) == [2, 2]:  # sample the odd positions
                x = np.roll(inputs[0], -1, axis=-1)
                return fn(ctx, [x, *inputs[1:]], outputs)
            return fn(ctx, inputs, outputs)
        return bad

    patch_kernel(monkeypatch, prep.graph, "Conv", "", make)
    first = _failure(prep)
    strided = [n.name for n in prep.graph.nodes if n.op_type == "Conv" and list(n.attrs.get("strides", [1, 1])) == [2, 2]]
    assert first.node == min(strided, key=list(prep.plan.order).index)


@pytest.mark.slow
def test_recompute_reads_wrong_value():
    prep = prepared("resnet18", 2, "sgd", checkpoint="sqrt")
    copies = [n for n in prep.graph.nodes if "@rc" in n.name and n.op_type == "Relu"]
    assert copies, "the sqrt schedule recomputes no Relu"
    victim = copies[0]
    spec = prep.graph.values[victim.inputs[0]].spec
    wrong = next(v for v, val in prep.graph.values.items()
                 if val.spec == spec and v != victim.inputs[0] and v.split("@")[0] != victim.inputs[0].split("@")[0]
                 and val.vclass.value == "activation")
    victim.inputs[0] = wrong
    first = _failure(prep)
    assert first.node.startswith(victim.name.split("@")[0])


def test_stale_swap_in(monkeypatch):
    from onnxplan.executor.swap_io import SwapRuntime

    prep = prepared("mlp", 2, "sgd", swap="on-demand", budget=None)
    if not prep.plan.swaps:
        pytest.skip("no swap planned")
    monkeypatch.setattr(SwapRuntime, "_swap_in", lambda self, name: (lambda ctx, inputs, outputs: None))
    first = _failure(prep)
    readers = {n.name for n in prep.graph.nodes if any("@in" in i or "@start" in i for i in n.inputs)}
    assert first.node in readers


# ---- random ops: ONNX Runtime's keep-masks are given to ours --------------------------------
def _dropout_model(path) -> str:
    """x -> Gemm -> Relu -> Dropout(0.3, training) -> Gemm: a forward model with a random op."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    init = [numpy_helper.from_array(rng.normal(0, 0.3, (16, 32)).astype(np.float32), "w1"),
            numpy_helper.from_array(np.zeros(32, np.float32), "b1"),
            numpy_helper.from_array(rng.normal(0, 0.3, (32, 5)).astype(np.float32), "w2"),
            numpy_helper.from_array(np.zeros(5, np.float32), "b2")]
    nodes = [helper.make_node("Constant", [], ["ratio"], value=numpy_helper.from_array(np.array(0.3, np.float32))),
             helper.make_node("Constant", [], ["train"], value=numpy_helper.from_array(np.array(True))),
             helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Dropout", ["r", "ratio", "train"], ["d", "mask"], name="drop"),
             helper.make_node("Gemm", ["d", "w2", "b2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "drop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


@pytest.fixture(scope="module")
def dropout_model(tmp_path_factory):
    from onnxplan.executor.prepare import prepare

    path = _dropout_model(tmp_path_factory.mktemp("drop") / "drop.onnx")
    return prepare(LoadRequest(path, 8, "adamw", "ce"), PlanOptions())


def test_dropout_model_verifies_with_ort_masks(dropout_model):
    assert any(n.op_type == "DropoutGrad" for n in dropout_model.graph.nodes)
    v = verify_run(dropout_model, steps=2)
    assert v.ok, v.summary()
    nodes = v.steps[0].nodes  # the random node is not compared per node (ONNX Runtime's alone would draw)
    assert nodes is not None and nodes.skipped["random"] == 1 and nodes.checked > 0, nodes


def test_dropout_ignoring_the_mask_is_caught(monkeypatch, dropout_model):
    import onnxplan.kernels.random as krandom

    def make(fn):
        def bad(ctx, inputs, outputs):  # draws its own mask, ignoring the one it is given
            saved, ctx.random.given = ctx.random.given, {}
            try:
                fn(ctx, inputs, outputs)
            finally:
                ctx.random.given = saved
        return bad

    assert krandom.Randomness  # the kernels' module is loaded
    patch_kernel(monkeypatch, dropout_model.graph, "Dropout", "", make)
    first = _failure(dropout_model)
    assert first.node == "drop"


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_ort_step_is_the_training_apis_step(optimizer):
    """ONNX Runtime's side of the verification (training and optimizer models in
    InferenceSessions, the state fed in) computes what onnxruntime.training.api's Module and
    Optimizer compute for the same step: the same loss and parameters after one step."""
    from onnxplan.executor.runner import initial_parameters, step_batches
    from onnxplan.verification.ort_step import ORT_DEFAULT_LEARNING_RATE, OrtOptimizerStep, OrtTrainingStep
    from onnxplan.verification.reference import run_reference

    mlp = prepared("mlp", 2, optimizer)
    params = initial_parameters(mlp.folder)
    batch = step_batches(mlp.folder, 1, 0)[0]
    ort = OrtTrainingStep(mlp.folder).run(params, batch)
    names = list(mlp.graph.optimizer["params"])
    zeros = {f"{p}.{m}": np.zeros_like(params[p]) for p in names for m in ("exp_avg", "exp_avg_sq")}
    new = OrtOptimizerStep(mlp.folder).run(names, ORT_DEFAULT_LEARNING_RATE, 1, params, ort.grads, zeros)
    ref = run_reference(mlp.folder, steps=1)
    assert ort.loss == ref.losses[0]
    for p in names:
        np.testing.assert_array_equal(new[p], ref.params[p], err_msg=p)


def test_loss_judged_against_float64_when_ort_reduction_is_the_less_accurate(monkeypatch, mlp):
    """A loss that differs from ONNX Runtime's only because ORT's float32 reduction is less
    accurate passes (judged against the loss node in float64 on ORT's inputs); a wrong loss
    kernel still fails."""
    from onnxplan.verification.ort_process import OrtProcess

    real_step = OrtProcess.step

    def inaccurate(self, *args, **kwargs):  # ORT's loss off by 1e-4 relative, its inputs intact
        out = real_step(self, *args, **kwargs)  # (ONNX Runtime's process: its loss as it reports it)
        out.loss *= 1 + 1e-4
        return out

    monkeypatch.setattr(OrtProcess, "step", inaccurate)
    v = verify_run(mlp, steps=1)
    assert v.ok, v.summary()
    assert "float64" in v.steps[0].checks["loss"].name

    def make(fn):
        def bad(ctx, inputs, outputs):
            fn(ctx, inputs, outputs)
            outputs[0][...] *= 1.001
        return bad

    patch_kernel(monkeypatch, mlp.graph, "SoftmaxCrossEntropyLoss", "", make)
    assert not verify_run(mlp, steps=1).ok


@pytest.mark.slow
def test_unbiased_running_variance_is_caught(monkeypatch):
    """BatchNorm updating running_var with the unbiased batch variance (PyTorch's convention,
    not ORT's): caught on the running statistics, naming the first BatchNorm node where the
    change (a factor n/(n-1) on the batch term) exceeds the tolerance."""
    prep = prepared("resnet18", 2, "sgd")
    assert FAULT["unbiased-var"].plant(monkeypatch, prep) is not None  # tests/faults.py: every BatchNormInternal
    v = verify_run(prep, steps=1)
    assert not v.ok
    kinds = {c.kind for c in v.steps[0].failures}  # the running statistics, and the BatchNorms per node
    assert kinds == {"running", "node"}, v.steps[0].failures
    assert all(c.node.endswith("BatchNormInternal") for c in v.steps[0].failures if c.kind == "node")
    order = list(prep.plan.order)
    first_bad = min((c.node for c in v.steps[0].failures), key=order.index)
    first = v.steps[0].first_difference
    print(f"\nnamed: {first}")
    assert first.node == first_bad and first.node.endswith("BatchNormInternal")


class _ZeroMeanBN:
    """conv -> BN -> 1x1 conv without bias (weights x1e-7) -> BN -> ReLU -> Linear: the second
    BN's input is ~1e-7 with per-channel means exactly zero in exact arithmetic (the first BN's
    output is centred), so its batch mean and running mean are float32 rounding on both sides."""

    @staticmethod
    def export(path) -> str:
        import warnings

        torch = pytest.importorskip("torch")
        nn = torch.nn

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
                self.conv2, self.bn2 = nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8)
                self.fc = nn.Linear(8 * 6 * 6, 5)
                with torch.no_grad():
                    self.conv2.weight.mul_(1e-7)

            def forward(self, x):
                return self.fc(torch.flatten(torch.relu(self.bn2(self.conv2(self.bn1(self.conv1(x))))), 1))

        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(Net().train(), (torch.randn(2, 3, 6, 6),), str(path), dynamo=False, opset_version=17,
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                              input_names=["x"], output_names=["y"])
        return str(path)


def test_batchnorm_statistics_of_rounding_noise_are_no_false_alarm(monkeypatch, tmp_path):
    """The running mean of a BN whose input cancels to zero is rounding on both sides: a correct
    run passes, and a real fault after that BN (the Linear's output 10% off) is named, not the BN's
    statistics (the explanation's intermediate check had a relative tolerance only)."""
    prep = prepared(_ZeroMeanBN.export(tmp_path / "zero_mean_bn.onnx"), 2, "sgd")
    v = verify_run(prep, steps=2)
    assert v.ok, v.summary()

    def make(fn):
        def bad(ctx, inputs, outputs):
            fn(ctx, inputs, outputs)
            outputs[0][...] *= 1.1
        return bad

    patch_kernel(monkeypatch, prep.graph, "Gemm", "", make)
    first = _failure(prep)
    assert first.node.endswith("Gemm"), first


@pytest.mark.slow
def test_fault_where_gradients_are_rounding_sized_is_caught(monkeypatch):
    """hf-efficientnet's TorchScript export (seeded init, tests/test_corpus.py): every BatchNorm
    scales its gradient down ~30x, so the embeddings' gradients are ~1e-16 (no cancellation: each
    BatchNormalizationGrad's dX is as large as its terms), and ONNX Runtime's (its ConvGrad repaired
    for auto_pad: ort_step.explicit_conv_grad_pads) agree with ours to ~1e-6 relative. A fault
    that far down, the embeddings' BatchNormalizationGrad dX 10% off (a random direction, three
    times the 3e-2 tolerance; a smaller one passes by design, at any node), is named at that node."""
    pytest.importorskip("transformers")
    prep = prepared("hf-efficientnet", None, "sgd")
    assert verify_run(prep, steps=1).ok
    target = next(n.name for n in prep.graph.nodes
                  if n.op_type == "BatchNormalizationGrad" and "/embeddings/batchnorm/" in n.name)
    rng = np.random.default_rng(11)

    def make(fn):
        def bad(ctx, inputs, outputs):
            fn(ctx, inputs, outputs)
            if ctx.node.name == target:
                dx = outputs[0]
                r = rng.standard_normal(dx.shape)
                dx += (0.1 * np.linalg.norm(dx) / np.linalg.norm(r) * r).astype(dx.dtype)
        return bad

    patch_kernel(monkeypatch, prep.graph, "BatchNormalizationGrad", "com.microsoft", make)
    first = _failure(prep)
    assert first.node == target
    assert first.error / first.tolerance > 2


def test_updates_are_compared_a_group_of_parameters_at_a_time(monkeypatch):
    """The optimizer's updates are checked in groups (memory: never the whole model's updates
    twice): every parameter in a group of its own gives the same figures as one group, and a
    wrong update of the last parameter is still named."""
    from onnxplan.executor.runner import Executor
    from onnxplan.verification import step_check

    prep = prepared("mlp", 2, "adamw")
    monkeypatch.setattr(step_check, "UPDATE_GROUP_BYTES", 1 << 40)
    whole = verify_run(prep, steps=1)
    monkeypatch.setattr(step_check, "UPDATE_GROUP_BYTES", 1)  # every parameter alone
    each = verify_run(prep, steps=1)
    assert whole.ok and each.ok, each.summary()
    assert each.steps[0].checks["update"] == whole.steps[0].checks["update"]
    last = prep.graph.optimizer["params"][-1]
    step = Executor.step

    def wrong_update(self, batch):
        loss = step(self, batch)
        self.binding.arrays[last][...] *= np.float32(1.001)
        return loss

    monkeypatch.setattr(Executor, "step", wrong_update)
    bad = verify_run(prep, steps=1)
    assert not bad.ok and any(c.kind == "update" and c.name == last for c in bad.steps[0].failures)
