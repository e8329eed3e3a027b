"""`edgepress`: thin commands that build a config, call one library function and map errors to exit codes
(0 ok, 1 internal error, 2 bad input, 3 a gate failed). Heavy libraries are imported inside the commands."""

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

app = typer.Typer(
    name="edgepress",
    help="Compress a trained BERT-family text classifier for devices: distill, prune, quantize, export to ONNX, "
    "and gate every stage on accuracy, latency and parity.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
err = Console(stderr=True)
out = Console()


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a library function; an EdgepressError becomes its message on stderr and its exit code."""
    from edgepress.errors import EdgepressError

    try:
        return fn(*args, **kwargs)
    except EdgepressError as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(e.exit_code) from None


@app.command()
def teacher(
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write the fine-tuned teacher to.")],
) -> None:
    """Build the demo teacher (MiniLM-L6 fine-tuned on the movie snippets) into --out."""
    from edgepress.models.teacher import build_teacher

    result = _call(build_teacher, out_dir)
    out.print(f"teacher written to {out_dir}: validation accuracy {result.best_val_accuracy:.4f} "
              f"(epoch {result.best_epoch}, {result.seconds:.0f} s)")


@app.command()
def demo(
    out_dir: Annotated[Path, typer.Option("--out", help="Run directory for the report and stage artifacts.")],
    quick: Annotated[bool, typer.Option("--quick", help="Shorter training for later stages; the teacher and the "
                                                        "test split stay the same.")] = False,
) -> None:
    """Run the embedded default end to end: movie-review snippets, the MiniLM teacher (built and cached on first
    use), the report."""
    from edgepress.pipeline.demo import run_demo

    report = _call(run_demo, out_dir, quick=quick)
    metrics = report["baseline"]["metrics"]
    lo, hi = metrics["accuracy_ci95"]
    out.print(f"baseline accuracy {metrics['accuracy']:.4f} [{lo:.4f}, {hi:.4f}] on {metrics['n_test']} test "
              f"examples; report: {out_dir / 'report.json'}")


@app.command()
def evaluate(
    model: Annotated[str, typer.Argument(help="An HF model dir, or demo:minilm-movie.")],
    data: Annotated[str, typer.Option(help="demo:movie-snippets, a .csv/.jsonl file, or a data directory.")]
    = "demo:movie-snippets",
    text_column: Annotated[str, typer.Option(help="Column holding the text.")] = "text",
    label_column: Annotated[str, typer.Option(help="Column holding the label (name or id).")] = "label",
    max_length: Annotated[int, typer.Option(help="Tokens per example after truncation.")] = 128,
) -> None:
    """Accuracy (with its 95% CI) and macro-F1 of a model on the test split of some data."""
    from edgepress.configs import build
    from edgepress.data import DataConfig
    from edgepress.pipeline.baseline import evaluate_model

    data_cfg = _call(build, DataConfig, where="data options", source=data, text_column=text_column,
                     label_column=label_column, max_length=max_length)
    metrics = _call(evaluate_model, model, data_cfg)
    lo, hi = metrics["accuracy_ci95"]
    out.print(f"accuracy {metrics['accuracy']:.4f} [{lo:.4f}, {hi:.4f}]  macro-F1 {metrics['macro_f1']:.4f}  "
              f"n={metrics['n_test']}")


def main() -> None:
    app()
