"""torch -> ONNX export, hard parity validation, graph fusion, fp16 conversion."""
