"""`pip install edgepress` into an environment that already has transformers 5.x and a CPU torch keeps both (an open
or capped range would pull a CUDA torch of several GB, or downgrade transformers)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # asks the package index
def test_installing_edgepress_keeps_the_users_transformers_and_torch(tmp_path):
    import torch
    import transformers

    assert int(transformers.__version__.split(".")[0]) >= 5 and "+cpu" in torch.__version__  # the env described
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
                           str(ROOT)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    would_install = {item["metadata"]["name"]: item["metadata"]["version"]
                     for item in json.loads(report.read_text())["install"]}
    assert list(would_install) == ["edgepress"], would_install  # nothing else installed, upgraded or downgraded
