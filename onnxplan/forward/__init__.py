"""The forward-model path: a user's .onnx (either PyTorch exporter) made trainable by
onnxruntime-training 1.19.2 the way the zoo builders make theirs."""

from onnxplan.forward.prepare import FORWARD_PREP_VERSION, prepare_forward

__all__ = ["FORWARD_PREP_VERSION", "prepare_forward"]
