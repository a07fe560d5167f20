"""`run --verify`: each training step compared with ONNX Runtime from the same state
(step_check), ONNX Runtime's stateless side (ort_step), the text of the result (report)."""
