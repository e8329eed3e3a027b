"""Faults of the environment, not of the files: two writers into one directory, a reader of a directory being
written, a lock left by a killed process, a disk that fills, a config.json that promises more than its weights."""

import json
import os
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from edgepress.device.locks import SUFFIX, lock_path, writing
from edgepress.errors import InUse, ModelError
from edgepress.models.loading import load_classifier
from tests import test_trust
from tests.test_trust import invoke, snapshot, write_config

good_run, earlier = test_trust.good_run, test_trust.earlier  # a finished tiny run, and a copy of it per test

EDGEPRESS = str(Path(sys.executable).parent / "edgepress")
HOLD = ("import sys, time\nfrom pathlib import Path\nfrom edgepress.device.locks import writing\n"
        "with writing(Path(sys.argv[1]), '--out'):\n    print('held', flush=True)\n    time.sleep(600)\n")


@contextmanager
def held(folder: Path):
    """Another process holding `folder`'s writer lock (as a run writing it would) until the block ends."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "held"
        yield process
    finally:
        process.kill()
        process.wait()


# --- 1. one writer per directory ---------------------------------------------------------------------------------

def test_a_second_writer_is_refused_naming_the_first_and_a_killed_ones_lock_never_blocks(tmp_path):
    out = tmp_path / "out"
    with held(out) as first:
        with pytest.raises(InUse, match=rf"--out {out} is being written by process {first.pid} \(`-c .*`, since "
                                        rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\)\. Fix: wait for it to finish"), \
                writing(out, "--out"):
            raise AssertionError("a second writer took the lock the first holds")
        first.send_signal(signal.SIGKILL)
        first.wait()
        with writing(out, "--out"):  # the kernel let the dead process's lock go
            holder = json.loads(lock_path(out).read_text())
    assert holder["pid"] == os.getpid() and lock_path(out).parent == tmp_path


def test_a_run_bundle_or_export_into_a_dir_in_use_exits_2_and_leaves_it_as_it_was(earlier, tmp_path,
                                                                                 tiny_model_dir, tiny_onnx_dir):
    config = write_config(tmp_path / "p.yaml", tiny_model_dir)
    before = snapshot(earlier)
    with held(earlier) as writer:
        result = invoke("run", config, "--out", earlier)
        assert result.exit_code == 2 and f"is being written by process {writer.pid}" in result.output, result.output
        assert snapshot(earlier) == before
    (tmp_path / "b").mkdir()
    with held(tmp_path / "b") as writer:
        result = invoke("bundle", earlier, "--out", tmp_path / "b")
        assert result.exit_code == 2 and f"{tmp_path / 'b'} is being written by process {writer.pid}" \
            in result.output, result.output
    with held(tmp_path / "e") as writer:
        result = invoke("export", tiny_model_dir, "--out", tmp_path / "e")
        assert result.exit_code == 2 and f"is being written by process {writer.pid}" in result.output, result.output
    assert not (tmp_path / "e").exists() and list((tmp_path / "b").iterdir()) == []


def test_readers_of_a_run_being_written_say_so_instead_of_reading_half_of_it(earlier, tmp_path):
    with held(earlier) as writer:
        for args in (("bundle", earlier, "--out", tmp_path / "b"), ("bench", earlier, "--runs", 2),
                     ("evaluate", earlier / "final"), ("predict", earlier / "final", "a fine film")):
            result = invoke(*args)
            assert result.exit_code == 2 and f"{earlier} is being written by process {writer.pid} (" in result.output \
                and "what it holds is not finished" in result.output, (args, result.output)
        predict = subprocess.run([sys.executable, earlier / "final" / "predict.py", "a fine film"],
                                 capture_output=True, text=True)
        assert predict.returncode == 2 and "is being written by process" in predict.stderr, predict.stderr
        assert "Traceback" not in predict.stderr
    assert invoke("predict", earlier / "final", "a fine film").exit_code == 0  # the writer gone, it reads


def test_two_runs_started_at_once_into_one_dir_one_runs_the_other_is_refused(tmp_path, tiny_model_dir):
    config = write_config(tmp_path / "p.yaml", tiny_model_dir, stages=[{"name": "export", "method": "export"}])
    command = [EDGEPRESS, "run", str(config), "--out", str(tmp_path / "run")]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(), p.stderr.read()) for p in runs]
    assert sorted(code for code, _ in results) == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    winner = next(p for p, (code, _) in zip(runs, results, strict=True) if code == 0)
    assert f"is being written by process {winner.pid}" in refused and "Traceback" not in refused
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["status"] == "passed" and report["baseline"]["metrics"]["size_bytes"] > 0
    assert {s["run_id"] for s in report["stages"]} == {report["run_id"]}


def test_a_lock_file_is_no_file_of_the_artifact_it_guards(earlier, tmp_path):
    """A lock beside a bundle (or a trial's beside its folder) is not one of the files a marker lists."""
    assert invoke("bundle", earlier, "--out", tmp_path / "b").exit_code == 0
    assert (tmp_path / f".b{SUFFIX}").is_file()
    (tmp_path / "b" / f".x{SUFFIX}").write_text("")
    assert invoke("bundle", earlier, "--out", tmp_path / "b", "--overwrite").exit_code == 0


# --- 2. the machine refusing a step is a message ---------------------------------------------------------------

def _small_disk_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _small_disk_works(), reason="this machine lets no process mount a small tmpfs (unshare)")
def test_a_disk_that_fills_mid_run_is_a_message_and_resume_continues_once_space_is_freed(tmp_path, tiny_model_dir):
    """A real full disk: a 3 MB tmpfs under --out, in a private mount namespace, then remounted at 200 MB."""
    config = write_config(tmp_path / "p.yaml", tiny_model_dir)
    disk = tmp_path / "disk"
    disk.mkdir()
    run = [EDGEPRESS, "run", str(config), "--out", str(disk / "run")]
    script = (f"mount -t tmpfs -o size=3m tmpfs {disk} && {{ {' '.join(run)}; echo rc=$? >&2; }} && "
              f"ls -aR {disk} > {tmp_path / 'full.txt'} && mount -o remount,size=200m {disk} && "
              f"{' '.join(run)} --resume && cat {disk}/run/report.json")
    result = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True)
    first = result.stderr.partition("rc=")[0]
    assert "rc=2" in result.stderr and "no space left on the device" in first, result.stderr
    assert "MB free there" in first and "--resume" in first and "Traceback" not in first, first
    assert ".tmp" not in (tmp_path / "full.txt").read_text()  # nothing half-written where a reader would look
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout[result.stdout.index("{"):])
    assert report["status"] == "passed"


def test_a_full_disk_in_a_write_names_the_path_the_size_and_the_fix(monkeypatch, tmp_path):
    from edgepress import files
    from edgepress.errors import SystemRefused

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", full)
    with pytest.raises(SystemRefused, match=rf"{tmp_path / 'a.json'}: no space left on the device \(\d+\.\d MB "
                                            r"free there; the file was 0\.0 MB\)\. Fix: free space there"):
        files.write_json(tmp_path / "a.json", {"a": 1})
    assert list(tmp_path.iterdir()) == []


# --- 3. a config.json that disagrees with its weights -----------------------------------------------------------

def _lying(tiny_model_dir: Path, tmp_path: Path, **fields) -> Path:
    shutil.copytree(tiny_model_dir, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, **fields}))
    return tmp_path / "m"


@pytest.mark.parametrize(("fields", "message"), [
    ({"num_hidden_layers": 100000}, "config.json: num_hidden_layers is 100000, but the weights hold 2 layers"),
    ({"vocab_size": 1000000}, "weights that do not fit its config.json: vocab_size is 1000000, but the weights hold "
                              "bert.embeddings.word_embeddings.weight of shape [30522, 32] (config.json builds "
                              "[1000000, 32])"),
    ({"max_position_embeddings": 4096}, "its config.json: max_position_embeddings is 4096, but the weights hold "
                                        "bert.embeddings.position_embeddings.weight of shape [128, 32]"),
    ({"intermediate_size": 96}, "its config.json: intermediate_size is 96, but the weights hold "
                                "bert.encoder.layer.0.intermediate.dense.weight of shape [64, 32]"),
])
def test_a_config_that_lies_about_its_weights_is_refused_before_a_model_is_built(fields, message, tmp_path,
                                                                                tiny_model_dir):
    with pytest.raises(ModelError, match="restore the config.json saved with these weights") as refused:
        load_classifier(_lying(tiny_model_dir, tmp_path, **fields))
    assert message in str(refused.value)


def test_a_model_larger_than_the_free_memory_is_refused_with_the_estimate(monkeypatch, tmp_path, tiny_model_dir):
    from edgepress.models import loading

    monkeypatch.setattr(loading, "available_memory", lambda: 2**20)
    with pytest.raises(ModelError, match=r"config.json builds a model of 4 MB, more than the 1 MB this machine "
                                         r"has free"):
        load_classifier(tiny_model_dir)


def test_evaluate_of_a_lying_config_exits_2_naming_the_field(tmp_path, tiny_model_dir):
    result = invoke("evaluate", _lying(tiny_model_dir, tmp_path, hidden_size=64, num_attention_heads=2))
    assert result.exit_code == 2 and "hidden_size is 64" in result.output, result.output


# --- 4. no step writes into what it reads (tests/test_injection.py makes every write a case) ---------------------

@contextmanager
def writes_under(folder: Path):
    """The writes this process makes under `folder` while the block runs (an audit hook, inert after it)."""
    from tests.inject import EVENTS, _written

    seen, active, root = [], [True], f"{os.path.abspath(folder)}{os.sep}"

    def hook(event: str, args: tuple) -> None:
        if active[0] and event in EVENTS and (path := _written(event, args)) and path.startswith(root):
            seen.append((event, path))

    sys.addaudithook(hook)
    try:
        yield seen
    finally:
        active[0] = False


def test_a_quantizer_never_writes_into_the_artifact_it_reads(tmp_path, tiny_onnx_dir, movie_data):
    """onnxruntime.quantization writes a shape-inferred copy beside the graph it is given: given a stage's artifact,
    an int8 stage wrote into the stage before it (found by the injection harness: killed there, the earlier stage's
    sha256 no longer held)."""
    from edgepress.compress.quantize import Int8StaticConfig, int8_dynamic, int8_static

    source = tmp_path / "stages" / "02-fuse" / "model"
    shutil.copytree(tiny_onnx_dir, source)
    texts = movie_data.validation.texts[:16]
    with writes_under(source) as seen:
        int8_dynamic(source, tmp_path / "a", texts)
        int8_static(source, tmp_path / "b", texts, Int8StaticConfig(calibration_size=8))
    assert seen == []
    assert sorted(p.name for p in source.parent.iterdir()) == ["model"]  # its own temp dir gone with it
