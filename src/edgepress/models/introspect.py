"""What a model is made of: parameter counts, sparsity, bytes on disk."""

import gzip
from pathlib import Path


def param_counts(model) -> dict:
    """params, nonzero_params and sparsity (fraction of zeros) over every parameter tensor."""
    total = sum(p.numel() for p in model.parameters())
    nonzero = sum(int(p.count_nonzero()) for p in model.parameters())
    return {"params": total, "nonzero_params": nonzero, "sparsity": 1 - nonzero / total}


def weight_files(path: Path) -> list[Path]:
    """The files holding a model's weights: an .onnx file (+ external data) or a model dir's weight files."""
    if path.is_file():
        return [path, *sorted(path.parent.glob(path.name + ".data"))]
    patterns = ("*.safetensors", "pytorch_model*.bin", "*.onnx", "*.onnx.data")
    return sorted({f for pattern in patterns for f in path.glob(pattern)})


def size_metrics(path: Path) -> dict:
    """size_bytes and size_gzip_bytes (what a download costs) of the weight files."""
    files = weight_files(Path(path))
    raw = sum(f.stat().st_size for f in files)
    packed = sum(len(gzip.compress(f.read_bytes(), compresslevel=6)) for f in files)
    return {"size_bytes": raw, "size_gzip_bytes": packed}
