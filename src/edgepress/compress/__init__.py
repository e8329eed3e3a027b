"""Compression methods, torch-side and ONNX-side: one frozen config and one function per method."""
