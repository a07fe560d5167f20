"""Everything compared with ONNX Runtime: `run --verify`, each training step compared with ONNX
Runtime from the same state (step_check), ONNX Runtime's stateless side (ort_step), the text of
the result (report), the error measures (compare), and ONNX Runtime's training API run on the
artifacts (reference: the reference runner and the `ort` peer of bench)."""
