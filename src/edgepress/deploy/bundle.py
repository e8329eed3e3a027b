"""The bundle: the last model of a run that passed every gate, with its tokenizer, config.json and an
`edgepress.json` manifest (what it is, where it came from, what it measured, a sha256 per file)."""

import shutil
from pathlib import Path

from edgepress import __version__
from edgepress.errors import ModelError
from edgepress.files import atomic_dir, file_sha256, write_json
from edgepress.runtime.predictor import BUNDLE_FILES, MANIFEST


def write_bundle(model_dir: Path, out: Path, manifest: dict) -> Path:
    """Copy an ONNX model dir (model.onnx + tokenizer + config.json) to `out` with `edgepress.json`."""
    missing = [name for name in BUNDLE_FILES if not (model_dir / name).is_file()]
    if missing:
        raise ModelError(f"{model_dir} cannot be bundled: missing {', '.join(missing)}. "
                         f"Fix: bundle an ONNX artifact (a run with an export stage)")
    with atomic_dir(Path(out)) as tmp:
        for f in sorted(model_dir.iterdir()):
            if f.is_file():
                shutil.copy2(f, tmp / f.name)
        files = {f.name: file_sha256(f) for f in sorted(tmp.iterdir())}
        write_json(tmp / MANIFEST, {"edgepress": __version__, **manifest, "files": files})
    return Path(out)
