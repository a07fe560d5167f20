"""Token-level losses (issue 26.3): `--loss ce` on a [B, S, C] output with [B, S] labels (the mean
over the tokens not labelled onnxplan.losses.IGNORE_INDEX) and `--loss causal-lm` (the token ids
shifted by one: a Hugging Face causal LM's loss), on a tiny GPT-2 LM; checked against ONNX Runtime's
training model and against the loss written out in numpy from the logits ONNX Runtime computed in
the same run. Skipped without `transformers`."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import onnxplan
from onnxplan.cli.app import app
from onnxplan.data import read_input_specs
from onnxplan.errors import UsageError
from onnxplan.executor.prepare import Prepared, adopt_plan
from onnxplan.executor.runner import initial_parameters, step_batches
from onnxplan.forward.spec import InputSpec, labels_for_output, losses_for
from onnxplan.losses import IGNORE_INDEX
from onnxplan.verification.ort_step import OrtTrainingStep
from onnxplan.verification.step_check import verify_run

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

LM = "hf-gpt2-lm"  # GPT-2 with its LM head: logits [2, 16, 100]


def _ce(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean cross-entropy over the labels that are not IGNORE_INDEX, in float64."""
    x = logits.reshape(-1, logits.shape[-1]).astype(np.float64)
    y = labels.reshape(-1)
    keep = y != IGNORE_INDEX
    m = x.max(axis=1, keepdims=True)
    log_p = x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    return float(-log_p[keep, y[keep]].mean())


def _ort_loss_and_logits(step, batch):
    ort = OrtTrainingStep(step.folder, {n: v.spec.shape for n, v in step.graph.values.items() if v.spec is not None})
    out = ort.run(initial_parameters(step.folder), batch, expose_all=True)
    return out.loss, out.values["logits"]


@pytest.mark.parametrize("loss", ["ce", "causal-lm"])
def test_token_losses_plan_run_and_verify_against_ort(loss):
    step = onnxplan.load(LM, loss=loss)
    plan = onnxplan.plan(step)
    report = onnxplan.run(step, plan, steps=2, warmup=0, verify=True)
    assert report.verified, report
    assert all(np.isfinite(report.loss))


def test_causal_lm_is_the_mean_over_the_next_tokens():
    step = onnxplan.load(LM, loss="causal-lm")
    inputs, labels = read_input_specs(step.folder)
    assert labels is None and [s.name for s in inputs] == ["input_ids"]  # no labels fed: the ids are
    batch = step_batches(step.folder, 1, seed=3)[0]
    loss, logits = _ort_loss_and_logits(step, batch)
    ids = batch["input_ids"]
    assert logits.shape == (*ids.shape, 100)
    # Hugging Face: shift_logits = logits[:, :-1], shift_labels = labels[:, 1:], mean over B*(S-1)
    assert loss == pytest.approx(_ce(logits[:, :-1], ids[:, 1:]), rel=1e-5)
    assert loss != pytest.approx(_ce(logits, ids), rel=1e-3)  # not the unshifted loss


def test_token_ce_ignores_ignore_index_and_verifies_on_such_labels():
    step = onnxplan.load(LM, loss="ce")
    inputs, labels = read_input_specs(step.folder)
    assert labels == InputSpec("labels", "int64", (2, 16), 0, 100)
    batches = step_batches(step.folder, 2, seed=4)
    rng = np.random.default_rng(4)
    for b in batches:  # padding: a third of the tokens labelled IGNORE_INDEX
        b["labels"][rng.random(b["labels"].shape) < 1 / 3] = IGNORE_INDEX
    loss, logits = _ort_loss_and_logits(step, batches[0])
    assert loss == pytest.approx(_ce(logits, batches[0]["labels"]), rel=1e-5)
    plan = onnxplan.plan(step)
    v = verify_run(Prepared(step.folder, adopt_plan(step.graph, plan), plan), steps=2, batches=batches)
    assert v.ok, v.summary()


def test_a_classifier_still_trains_with_ce():
    step = onnxplan.load("hf-bert", loss="ce")
    assert read_input_specs(step.folder)[1].shape == (2,)
    assert onnxplan.run(step, steps=1, warmup=0, verify=True).verified


def test_an_output_no_loss_fits_names_the_losses_that_do():
    ids = [InputSpec("input_ids", "int64", (2, 16), 0, 100)]
    assert losses_for((2, 16, 100), ids) == ["ce", "causal-lm", "mse"]
    assert losses_for((2, 16, 100), []) == ["ce", "mse"]  # no token ids to predict
    with pytest.raises(UsageError, match=r"got shape \[2, 3, 4, 5\]; losses that fit this output: mse$"):
        labels_for_output((2, 3, 4, 5), "ce", ids)
    with pytest.raises(UsageError, match=r"token ids.*fit this output: ce, mse$"):
        labels_for_output((2, 16, 100), "causal-lm", [InputSpec("x", "float32", (2, 16), 0, 1)])
    with pytest.raises(UsageError, match=r"must be in \[0, 50\)"):
        labels_for_output((2, 16, 50), "causal-lm", ids)  # ids past the vocabulary
    r = CliRunner().invoke(app, ["plan", "hf-bert", "--loss", "causal-lm"])
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [
        "onnxplan: error: loss 'causal-lm' needs a [B, S, vocab] output with S >= 2, got shape [2, 10]; "
        "losses that fit this output: ce, mse"]
