import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from edgepress.cli.app import app
from tests.test_data import write_csv

runner = CliRunner()
EDGEPRESS = Path(sys.executable).parent / "edgepress"


def test_help_lists_every_command_documented_without_importing_torch():
    probe = "import sys, edgepress.cli.app; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "[]"
    done = subprocess.run([str(EDGEPRESS), "--help"], capture_output=True, text=True)
    assert done.returncode == 0
    for command, words in (("teacher", "Build the demo teacher"), ("demo", "Run the embedded default"),
                           ("evaluate", "Accuracy (with its 95% CI)")):
        assert command in done.stdout and words in done.stdout


def test_a_command_started_under_a_launcher_is_refused_with_the_fix(tmp_path):
    """`accelerate launch` / torchrun set WORLD_SIZE: each process would run the whole command into the same dir."""
    import os

    done = subprocess.run([str(EDGEPRESS), "demo", "--quick", "--out", str(tmp_path / "run")], capture_output=True,
                          text=True, env={**os.environ, "WORLD_SIZE": "2", "RANK": "1"})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "started as one of 2" in done.stderr and "set runtime.launch in the config" in done.stderr
    assert not (tmp_path / "run").exists()


def test_csv_without_label_column_exits_2_naming_the_columns(tmp_path, tiny_model_dir, movie_data):
    rows = [{"review": t, "stars": int(y)} for t, y in zip(movie_data.test.texts[:40], movie_data.test.labels[:40],
                                                          strict=True)]
    source = write_csv(tmp_path / "reviews.csv", rows)
    done = subprocess.run([str(EDGEPRESS), "evaluate", str(tiny_model_dir), "--data", str(source),
                           "--text-column", "review"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "has no label column 'label'; its columns are: review, stars" in done.stderr
    assert "Traceback" not in done.stderr


def test_evaluate_reports_accuracy_on_the_test_split(tmp_path, tiny_model_dir, movie_data):
    rows = [{"text": t, "label": ["negative", "positive"][y]}
            for t, y in zip(movie_data.train.texts[:200], movie_data.train.labels[:200], strict=True)]
    result = runner.invoke(app, ["evaluate", str(tiny_model_dir), "--data", str(write_csv(tmp_path / "d.csv", rows))])
    assert result.exit_code == 0, result.output
    assert "accuracy" in result.output and "n=20" in result.output


def test_bad_option_value_exits_2_with_the_field(tiny_model_dir):
    result = runner.invoke(app, ["evaluate", str(tiny_model_dir), "--max-length", "2"])
    assert result.exit_code == 2
    assert "max_length: Input should be greater than or equal to 8: got 2" in result.output


def test_bad_model_dir_exits_2(tmp_path):
    result = runner.invoke(app, ["evaluate", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "missing does not exist. Fix: check the path" in result.output
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["evaluate", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "is not a Hugging Face model directory" in result.output
