"""The loss each (loss, output) trains with: what generate_artifacts adds on top of the forward model.

Which losses fit which output, and the labels each takes, is decided in one place
(onnxplan.forward.spec.labels_for_output / losses_for); this module builds the graph:
- mse, and ce on an [N, classes] output: onnxruntime-training's own MSELoss and
  CrossEntropyLoss (SoftmaxCrossEntropyLoss over dim 1, mean; ORT ignores label -1);
- ce on a [B, S, classes] output, labels [B, S]: the logits viewed as [B*S, classes] and the
  labels as [B*S] (two Reshapes: views, no copy), SoftmaxCrossEntropyLoss with reduction mean
  and ignore_index IGNORE_INDEX: the mean over the tokens whose label is not IGNORE_INDEX
  (ONNX Runtime's SoftmaxCrossEntropyLoss semantics; the [B, S, C] output cannot go to it
  directly, which reads the classes from dim 1);
- causal-lm on a [B, S, vocab] output: the same loss on labels made in the graph from the token
  ids the model reads, shifted by one (labels[:, t] = ids[:, t+1]) and the last position
  IGNORE_INDEX: the mean cross-entropy over the B*(S-1) predicted tokens, what a Hugging Face
  causal LM computes from `labels=input_ids` (shift_logits = logits[:, :-1], shift_labels =
  labels[:, 1:]). Ignoring the last position rather than slicing the logits keeps the [B, S, V]
  logits and their gradient one buffer each (a slice would copy them, and its gradient pad them).
"""

from __future__ import annotations

import numpy as np
import onnx

__all__ = ["IGNORE_INDEX", "loss_block"]

# a label equal to this adds nothing to a token-level loss (PyTorch's and Hugging Face's value)
IGNORE_INDEX = -100


def _output_shape(model: onnx.ModelProto, name: str) -> tuple[int, ...]:
    out = next(o for o in model.graph.output if o.name == name)
    return tuple(int(d.dim_value) for d in out.type.tensor_type.shape.dim)


def _token_cross_entropy(ids: str | None):
    """The onnxblock Block of the token-level loss: labels from a new graph input `labels` [B, S]
    (ids None: ce) or from the token ids input `ids` shifted by one (causal-lm)."""
    from onnx import helper
    from onnxruntime.training import onnxblock
    from onnxruntime.training.onnxblock import _graph_utils

    class TokenCrossEntropy(onnxblock.Block):
        def build(self, scores: str, labels_name: str = "labels") -> str:
            g = self.base.graph
            b, s, v = _output_shape(self.base, scores)

            def name(token: str) -> str:
                return _graph_utils.generate_graph_name(token)

            def const(token: str, value: np.ndarray) -> str:
                out = name(token)
                g.node.append(helper.make_node("Constant", [], [out], name=name(token + ".const"),
                                               value=onnx.numpy_helper.from_array(value, out)))
                return out

            if ids is None:
                g.input.append(helper.make_tensor_value_info(labels_name, onnx.TensorProto.INT64, [b, s]))
                labels = labels_name
            else:  # labels[:, t] = ids[:, t + 1]; the last position predicts nothing
                nxt, labels = name("causal.next_ids"), name("causal.labels")
                g.node.append(helper.make_node(
                    "Slice", [ids, const("causal.starts", np.array([1], np.int64)),
                              const("causal.ends", np.array([s], np.int64)),
                              const("causal.axes", np.array([1], np.int64))], [nxt], name=name("causal.Slice")))
                last = const("causal.last", np.full((b, 1), IGNORE_INDEX, np.int64))
                g.node.append(helper.make_node("Concat", [nxt, last], [labels], axis=1, name=name("causal.Concat")))
            flat_scores, flat_labels = name("loss.scores"), name("loss.labels")
            g.node.append(helper.make_node("Reshape", [scores, const("loss.scores_shape", np.array([b * s, v], np.int64))],
                                           [flat_scores], name=name("loss.Reshape")))
            g.node.append(helper.make_node("Reshape", [labels, const("loss.labels_shape", np.array([b * s], np.int64))],
                                           [flat_labels], name=name("loss.Reshape")))
            loss, log_prob = name("loss"), name("log_prob")
            g.node.append(helper.make_node("SoftmaxCrossEntropyLoss", [flat_scores, flat_labels], [loss, log_prob],
                                           reduction="mean", ignore_index=IGNORE_INDEX,
                                           name=name("SoftmaxCrossEntropyLoss")))
            return loss

    return TokenCrossEntropy()


def loss_block(fm):
    """What generate_artifacts' `loss` gets for ForwardModel `fm`: an onnxruntime-training
    LossType, or the token-level Block (ce on [B, S, C], causal-lm)."""
    from onnxruntime.training import artifacts

    from onnxplan.forward.spec import chosen_token_ids

    if fm.loss == "mse":
        return artifacts.LossType.MSELoss
    if fm.loss == "ce":
        if fm.labels is None:
            raise RuntimeError("loss 'ce' without its labels input")
        return artifacts.LossType.CrossEntropyLoss if len(fm.labels.shape) == 1 else _token_cross_entropy(None)
    shape = _output_shape(fm.model, fm.model.graph.output[0].name)
    return _token_cross_entropy(chosen_token_ids(fm.inputs, shape).name)
