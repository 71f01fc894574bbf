"""Serving checkpoints, ONNX with parity, TensorRT engines."""
