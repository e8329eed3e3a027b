"""The machine a run measured on: recorded in every report so numbers can be compared like for like."""

import os
import platform
from importlib import metadata

from edgepress.device.timing import cpu_model


def _version(*packages: str) -> str | None:
    for package in packages:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return None


def environment(threads: int | None = None) -> dict:
    """cpu, cores, the `threads` every timing ran on (None: nothing was timed), the threads torch trains on, python,
    torch, onnxruntime, providers_available."""
    import onnxruntime
    import torch

    return {
        "cpu": cpu_model(),
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "threads": threads,
        "training_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime_package": "onnxruntime-gpu" if _version("onnxruntime-gpu") else "onnxruntime",
        "providers_available": onnxruntime.get_available_providers(),
    }
