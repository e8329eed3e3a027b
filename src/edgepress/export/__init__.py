"""torch -> ONNX export, hard parity validation, graph fusion, fp16 conversion."""

from edgepress.callable_package import make_callable

make_callable(__name__)  # edgepress.export(...) is the Python API's function
