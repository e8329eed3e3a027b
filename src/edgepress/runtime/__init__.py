"""The device side: ONNX Runtime sessions with verified providers, the latency harness, the torch-free predictor.
Nothing here imports torch or transformers."""
