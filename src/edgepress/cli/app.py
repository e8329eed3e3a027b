"""`edgepress`: thin commands that build a config, call one library function and map errors to exit codes
(0 ok, 1 internal error, 2 bad input, 3 a gate failed). Heavy libraries are imported inside the commands."""

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from edgepress.cli.params import Aggregation, Commands, DemoTask, Kind, Provider, Split, Target, path
from edgepress.logs import words

app = typer.Typer(
    cls=Commands, name="edgepress", no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
    help="Compress a trained BERT-family text classifier for devices: distill, prune, quantize, export to ONNX, "
    "and gate every stage on accuracy, latency and parity.",
)


def _version(shown: bool) -> None:
    if shown:
        from edgepress import __version__

        print(f"edgepress {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                   help="Print edgepress's version and exit.")] = False) -> None:
    """Options before any command (the app's help text is its own)."""


err, out = Console(stderr=True), Console()


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a library function; an EdgepressError, or the machine refusing a step (errors.refused_by_system),
    becomes its message on stderr and its exit code. Ctrl-C within it is not lost (edgepress/interrupt.py)."""
    from rich.markup import escape

    from edgepress.errors import EdgepressError, access_denied, refused_by_system
    from edgepress.interrupt import latched

    try:
        try:
            with latched():
                return fn(*args, **kwargs)
        except PermissionError as e:  # a path it was given that the system will not let it read (or write)
            raise access_denied(e) from None
        except Exception as e:  # the machine refused a step (a full disk, no memory): a message, not a traceback
            if refused_by_system(e) is None:
                raise
            raise refused_by_system(e) from None
    except EdgepressError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(e.exit_code) from None


@app.command()
def teacher(
    out_dir: Annotated[Path, typer.Option("--out", parser=path, help="Directory to write the fine-tuned teacher to.")],
) -> None:
    """Build the demo teacher (MiniLM-L6 fine-tuned on the movie snippets) into --out."""
    from edgepress import api

    result = _call(api.demo_teacher, out_dir)
    out.print(f"teacher written to {out_dir}: validation accuracy {result.best_val_accuracy:.4f} "
              f"(epoch {result.best_epoch}, {result.seconds:.0f} s)")


@app.command()
def demo(
    out_dir: Annotated[Path, typer.Option("--out", parser=path,
                                                   help="Run directory for the report and stage artifacts.")],
    quick: Annotated[bool, typer.Option("--quick", help="Shorter training for later stages; the teacher and the "
                                                        "test split stay the same.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Reuse the stages of an earlier demo in --out that ran "
                                                          "with exactly the same inputs and config.")] = False,
    task: Annotated[DemoTask, typer.Option(help="classification: the MiniLM teacher fine-tuned on the snippets; "
                                                "embedding: the MiniLM sentence encoder (all-MiniLM-L6-v2), gated "
                                                "on its neighbours among the test texts.")] = "classification",
) -> None:
    """Run the embedded default end to end on movie-review snippets, with gates, the report and the final bundle.
    classification: the MiniLM teacher (built and cached on first use), distill -> heads -> ffn -> vocab -> export
    -> fuse -> int8. embedding: all-MiniLM-L6-v2, export -> fuse -> smoothed int8."""
    from edgepress import api

    _summary(_call(api.demo, out_dir, quick=quick, resume=resume, task=DemoTask(task).value))


def _summary(result) -> None:
    """One line per stage of a RunResult: status, its primary metric (accuracy; an embedder's neighbour overlap),
    size, CPU p50."""
    primary = result.baseline.metrics.primary
    for stage in (result.baseline, *result.stages):
        m, nan = stage.metrics, float("nan")
        cpu = m.latency.get("cpu")
        out.print(f"{stage.name:<12} {stage.status:<7} {words(primary)} {m.value if m.value is not None else nan:.4f}  "
                  f"size {(m.size_bytes or 0) / 1e6:6.1f} MB  cpu p50 {cpu.p50_ms if cpu else nan:7.2f} ms",
                  highlight=False)
    out.print(f"report: {result.out / 'report.md'}", highlight=False)


@app.command()
def run(
    config: Annotated[Path, typer.Argument(parser=path, help="Pipeline YAML (see README).")],
    out_dir: Annotated[Path, typer.Option("--out", parser=path,
                                                   help="Run directory for the report and stage artifacts.")],
    device: Annotated[Provider | None, typer.Option(help="Measure on this provider instead of "
                                                         "runtime.providers.")] = None,
    resume: Annotated[bool, typer.Option(help="Reuse the baseline and leading stages an earlier run in RUN_DIR "
                                              "passed with the same config and data.")] = False,
    target: Annotated[Target | None, typer.Option(help="Where the bundle will run (instead of runtime.target; "
                                                       "default: this machine).")] = None,
    cache: Annotated[Path | None, typer.Option(parser=path,
                                               help="A stage cache shared with other runs: a stage attempt whose "
                                                    "method, params, input, data, runtime and machine match an "
                                                    "earlier one's takes its result.")] = None,
) -> None:
    """Run a pipeline: baseline, then every stage with its gates. Exit 0 all gates passed, 3 a gate failed,
    2 bad input, 1 internal error."""
    from edgepress import api

    _summary(_call(api.run, config, out_dir, resume=resume, cache=cache, device=device.value if device else None,
                   target=target.value if target else None))


@app.command()
def search(
    config: Annotated[Path, typer.Argument(parser=path,
                                           help="Search YAML: model, data, runtime, constraints, objective, space "
                                                "(see examples/search-demo.yaml).")],
    out_dir: Annotated[Path, typer.Option("--out", parser=path,
                                                   help="Search directory: the study, every trial's run, the "
                                                        "report, best.yaml and the winner's run.")],
    budget: Annotated[str | None, typer.Option(help="Wall-clock time for trials, e.g. 2h or 45m: no trial starts "
                                                    "that would not end in it (by the median trial).")] = None,
    trials: Annotated[int | None, typer.Option(min=1, help="Trials in the study in all (every worker's; one killed "
                                                          "with its search is tried again).")] = None,
    resume: Annotated[bool, typer.Option(help="Continue the search in --out (or join it as a second worker).")]
    = False,
    storage: Annotated[str | None, typer.Option(help="A database URL for the study (e.g. postgresql://...) shared "
                                                     "by workers on several machines; default: --out/study.db.")]
    = None,
) -> None:
    """Find the fastest (or smallest) pipeline that passes the constraints: shapes timed first, trials selected on
    the validation split, finalists scored on test, the winner written as best.yaml and run. Exit 0 a winner, 3 no
    trial passed in the budget, 2 bad input (or a space the constraints leave empty)."""
    import logging
    import time

    from rich.markup import escape

    from edgepress import api

    cfg = _call(api.search_config, config)
    seconds = _call(api.seconds, budget) if budget is not None else None
    for handler in logging.getLogger("edgepress").handlers:  # each trial's run.log keeps every stage's lines
        handler.addFilter(lambda record: record.name.startswith("edgepress.search") and
                          record.levelno >= logging.WARNING)
    started = time.monotonic()

    def progress(number: int, result: dict, best) -> None:
        metric = words(result.get("metric", "accuracy"))
        measured = f"{metric} {result['accuracy']:.4f}, {result['p50_ms']:.2f} ms, {result['size_mb']:.1f} MB" \
            if "accuracy" in result else ""
        leader = f"best: trial {best.number} ({best.values[1]:.4g} {cfg.objective})" if best else "none passed yet"
        left = f" · {max(0.0, seconds - (time.monotonic() - started)) / 60:.0f} min left" if seconds else ""
        why = f" {escape(result['why'])}" if result.get("why") else ""
        err.print(f"trial {number}: {result['stop']}{why} {measured} "
                  f"({result['seconds']:.0f} s) · {leader}{left}", highlight=False, soft_wrap=True)

    result = _call(api.search, config, out_dir, seconds, trials=trials, resume=resume, storage=storage,
                   progress=progress)
    from edgepress.search.report import status_line

    out.print(status_line(result.report), highlight=False, soft_wrap=True)
    out.print(f"report: {out_dir / 'report.md'}", highlight=False)


@app.command()
def validate(config: Annotated[Path, typer.Argument(parser=path, help="Pipeline or search YAML to check.")]) -> None:
    """Check a pipeline without running it: the config (every problem listed), then that the model loads, the data
    loads and fits the model's labels, and each provider asked for runs here. A search config: the same, for every
    point of its space. Exit 2 at the first problem."""
    from edgepress import api

    found = _call(api.validate, config)
    sizes = ", ".join(f"{name} {n}" for name, n in found.sizes.items())
    cfg = found.config
    if found.is_search:
        points, shapes = found.points, found.shapes
        out.print(f"{config}: valid search ({points} point{'s' * (points != 1)}, {shapes} shape{'s' * (shapes != 1)}"
                  f", of a {found.depth}-layer {found.task} teacher; model {cfg.model}; data {sizes}; objective "
                  f"{cfg.objective}; providers {', '.join(cfg.runtime.providers)})", highlight=False, soft_wrap=True)
    else:
        n = len(cfg.stages)
        out.print(f"{config}: valid ({n} stage{'s' * (n != 1)}: {', '.join(s.name for s in cfg.stages) or 'none'}; "
                  f"model {cfg.model}; data {sizes}; providers {', '.join(cfg.runtime.providers)}"
                  f"{f'; training stages launched with: {cfg.runtime.launch}' if cfg.runtime.launch else ''})",
                  highlight=False, soft_wrap=True)
    for line in found.notes:
        out.print(f"note: {line}", highlight=False, soft_wrap=True)


@app.command()
def init(
    model: Annotated[str, typer.Argument(help="Your model: a Hugging Face sequence-classification, token-"
                                              "classification (NER) or sentence-transformers dir.")],
    data: Annotated[str, typer.Argument(help="Your data: a .csv/.jsonl file, a dir with train/test files, or a saved "
                                             "HF dataset.")],
    text_column: Annotated[str, typer.Option(help="Column holding the text.")] = "text",
    label_column: Annotated[str, typer.Option(help="Column holding the label (name or id).")] = "label",
    out_file: Annotated[Path | None, typer.Option("--out", parser=path,
                                                           help="Write the pipeline to this new file instead of "
                                                                "printing it.")] = None,
) -> None:
    """Write a commented starting pipeline that fits MODEL and DATA: the methods this model takes, a max_length
    that covers the texts, a final gate the test split can resolve; validated before it is written."""
    from edgepress import api

    text = _call(api.init, model, data, text_column=text_column, label_column=label_column, out=out_file)
    if out_file is None:
        print(text, end="")
    else:
        out.print(f"starting pipeline written to {out_file}: edgepress validate {out_file}, then edgepress run "
                  f"{out_file} --out runs/NAME", highlight=False, soft_wrap=True)


@app.command()
def schema(
    kind: Annotated[Kind, typer.Argument(help="Which YAML: a pipeline (`edgepress run`) or a search.")]
    = Kind.pipeline,
    out_file: Annotated[Path | None, typer.Option("--out", parser=path,
                                                           help="Write the schema to this file instead of "
                                                                "printing it.")] = None,
) -> None:
    """The JSON Schema of a pipeline or search YAML, for editors: put `# yaml-language-server: $schema=FILE` on a
    config's first line (the repository's own are in schema/)."""
    from edgepress.schema import write_schema

    text = _call(write_schema, kind.value, out_file)
    if out_file is None:
        print(text, end="")
    else:
        out.print(f"{kind.value} schema written to {out_file}", highlight=False)


@app.command()
def evaluate(
    model: Annotated[str, typer.Argument(help="An HF model dir, or demo:minilm-movie.")],
    data: Annotated[str, typer.Option(help="demo:movie-snippets, a .csv/.jsonl file, or a data directory.")]
    = "demo:movie-snippets",
    text_column: Annotated[str, typer.Option(help="Column holding the text.")] = "text",
    label_column: Annotated[str, typer.Option(help="Column holding the label (name or id).")] = "label",
    max_length: Annotated[int | None, typer.Option(help="Tokens per example after truncation (8 to 8192); default: "
                                                        "a bundle's own (what its run measured), else 128.")] = None,
    split: Annotated[Split, typer.Option(help="Which examples: the test split (as a run reports), another split, or "
                                              "all of them.")] = Split.test,
) -> None:
    """Accuracy (with its 95% CI) and macro-F1 of a model (torch model dir, ONNX model dir or bundle) on some
    data; of a token classifier, entity-level F1 (with its 95% CI), precision and recall on tagged data."""
    from edgepress import api
    from edgepress.tasks import recorded_task

    metrics = _call(api.evaluate, model, data, split=split.value, max_length=max_length, text_column=text_column,
                    label_column=label_column).raw
    if recorded_task(metrics).name == "token-classification":  # entity-level figures over sentences
        lo, hi = metrics["f1_ci95"]
        out.print(f"entity F1 {metrics['f1']:.4f} [{lo:.4f}, {hi:.4f}]  precision {metrics['precision']:.4f}  "
                  f"recall {metrics['recall']:.4f}  sentences={metrics['n_test']} ({split.value})")
    else:
        lo, hi = metrics["accuracy_ci95"]
        out.print(f"accuracy {metrics['accuracy']:.4f} [{lo:.4f}, {hi:.4f}]  macro-F1 {metrics['macro_f1']:.4f}  "
                  f"n={metrics['n_test']} ({split.value})")
    if "deferred" in metrics:  # a cascade's
        out.print(f"cascade: {metrics['deferred']:.1%} of them answered by its fallback", highlight=False)
    if metrics.get("splits_note") and split != Split.all:
        out.print(f"splits: {metrics['splits_note']}", highlight=False)


@app.command("export")
def export_command(
    model: Annotated[str, typer.Argument(help="An HF model dir, or demo:minilm-movie.")],
    out_dir: Annotated[Path, typer.Option("--out", parser=path,
                                                   help="Directory for model.onnx, config.json and tokenizer.")],
    optimize: Annotated[bool, typer.Option(help="Apply ONNX Runtime's transformer fusions.")] = True,
    disable_fusion: Annotated[list[str] | None, typer.Option(help="A fusion to leave out (repeatable), e.g. "
                                                                  "skip_layer_norm.")] = None,
    data: Annotated[str, typer.Option(help="Texts to check parity on: a .csv/.jsonl file or a data directory "
                                           "(labels are not read); default: built-in English sentences.")]
    = "demo:movie-snippets",
    text_column: Annotated[str, typer.Option(help="Column holding the text.")] = "text",
    max_length: Annotated[int, typer.Option(help="Tokens per text after truncation (8 to 8192).")] = 128,
) -> None:
    """Export a model to ONNX, checked against torch on real sentences (and fused, checked again)."""
    from edgepress import api
    from edgepress.logs import readable

    done = _call(api.export, model, out_dir, optimize=optimize, disable_fusion=tuple(disable_fusion or ()), data=data,
                 text_column=text_column, max_length=max_length)
    out.print(f"exported to {out_dir / 'model.onnx'}: torch vs ONNX max |Δlogit| {done.max_abs_diff:.2e}, "
              f"agreement {done.agreement:.4f} on {done.n_examples} examples")
    if done.fused is not None:
        out.print(f"fused: {readable(done.fused)}; max |Δlogit| {done.steps['optimize']['parity']['max_abs_diff']:.2e}")


@app.command()
def bench(
    model: Annotated[Path, typer.Argument(parser=path,
                                          help="A .onnx file, a dir with model.onnx, or an HF (torch) model dir.")],
    provider: Annotated[Provider, typer.Option(help="Execution provider.")] = Provider.cpu,
    batch_size: Annotated[int, typer.Option(min=1, help="Batch size of the fixed shape.")] = 1,
    seq_len: Annotated[int, typer.Option(min=2, help="Sequence length of the fixed shape.")] = 128,
    threads: Annotated[int | None, typer.Option(min=1, max=1024, help="Intra-op threads (default: the "
                                                                      "runtime's choice).")] = None,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed runs first.")] = 20,
    runs: Annotated[int, typer.Option(min=1, help="Timed runs.")] = 200,
    data: Annotated[str, typer.Option(help="Texts to time with: a .csv/.jsonl file or a data directory (labels are "
                                           "not read); default: built-in English sentences.")] = "demo:movie-snippets",
    text_column: Annotated[str, typer.Option(help="Column holding the text.")] = "text",
) -> None:
    """Latency of one model: a fixed batch x sequence shape of real tokens, and real sentences at their natural
    lengths (batch 1), tokenized with the model's own tokenizer (a bundle's cut at its max_length, as it reads them)."""
    from rich.table import Table

    from edgepress.configs import build
    from edgepress.data.load import load_texts
    from edgepress.deploy.bundle import final_of_run
    from edgepress.pipeline.latency import measure_latency
    from edgepress.runtime.latency import LatencyConfig

    cfg = _call(build, LatencyConfig, where="bench options", batch_size=batch_size, sequence_length=seq_len,
                warmup=warmup, runs=runs)
    texts = _call(load_texts, data, text_column)
    model = _call(final_of_run, model, "bench") or model
    result = _call(measure_latency, model, texts, provider.value, threads, cfg)
    table = Table(title=f"{model} on {', '.join(result['providers_used'])} ({threads or 'default'} threads)")
    for column in ("inputs", "p50 ms", "p90 ms", "p99 ms", "mean ms", "runs"):
        table.add_column(column, justify="right")
    for name in ("fixed", "natural"):
        r = result[name]
        label = f"{batch_size} x {seq_len}" if name == "fixed" else f"1 x natural ({r['mean_tokens']:.0f} tok)"
        table.add_row(label, *(f"{r[k]:.3f}" for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms")), str(r["runs"]))
    out.print(table)
    if "deferred" in result:  # a cascade's: each text through the student, and the fallback where it is unsure
        out.print(f"cascade: {result['deferred']:.1%} of the natural-length texts deferred to its fallback (their "
                  f"time counts both models)", highlight=False)
    out.print(f"{result['cpu']}, onnxruntime {result['onnxruntime']}", highlight=False)


@app.command()
def bundle(
    source: Annotated[Path, typer.Argument(parser=path,
                                           help="A run dir (its final/ model), or an ONNX model dir (model.onnx, "
                                                "tokenizer.json, config.json).")],
    out_dir: Annotated[Path, typer.Option("--out", parser=path, help="The bundle dir to write.")],
    target: Annotated[Target | None, typer.Option(help="Where it will run (default: this machine).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace a non-empty --out.")] = False,
    no_cascade: Annotated[bool, typer.Option("--no-cascade", help="A cascade's student alone, without its "
                                                                  "fallback.")] = False,
) -> None:
    """Write the device bundle: model, tokenizer, config.json, edgepress.json and predict.py, which runs with
    onnxruntime, tokenizers and numpy alone (`python predict.py "text"`); a cascade's carries its fallback in
    fallback/."""
    from edgepress import api

    written = _call(api.bundle, source, out_dir, target.value if target else None, overwrite=overwrite,
                    cascade=not no_cascade)
    out.print(f"bundle for {_target_of(written)}: {written} (run it: python {written / 'predict.py'} \"text\")",
              highlight=False, soft_wrap=True)


def _target_of(bundle_dir: Path) -> str:
    from edgepress.device.bundle import MANIFEST, json_object

    return json_object(bundle_dir / MANIFEST)["target"]["name"]


@app.command()
def predict(
    bundle: Annotated[Path, typer.Argument(parser=path,
                                           help="A bundle or exported model dir (model.onnx, tokenizer.json, "
                                                "config.json).")],
    texts: Annotated[list[str], typer.Argument(help="Texts to classify (or embed).")],
    provider: Annotated[Provider, typer.Option(help="Execution provider.")] = Provider.cpu,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    corpus: Annotated[Path | None, typer.Option(parser=path,
                                                help="An embedding model's bundle: list the texts of this file (one "
                                                     "a line) nearest each text given, by cosine.")] = None,
    top: Annotated[int, typer.Option(min=1, help="With --corpus: how many to list per text.")] = 10,
    aggregation: Annotated[Aggregation, typer.Option(help="A token classifier's entities: each token's tag (simple) "
                                                          "or each word's (first, max, average), as transformers' "
                                                          "pipeline reads them.")] = Aggregation.simple,
) -> None:
    """Classify texts with a bundle, torch-free (onnxruntime, tokenizers and numpy only); an embedding model's
    bundle gives each text's vector, one JSON object a line, or with --corpus the corpus's nearest texts; a token
    classifier's, the entities in each text."""
    from edgepress import api
    from edgepress.device.cli import answer_lines, read_corpus, similar, similar_line

    predictor = _call(api.load, bundle, provider=provider.value)
    if corpus is not None:
        found = _call(similar, predictor, texts, _call(read_corpus, str(corpus)), top)
        for query, hits in zip(texts, found, strict=True):
            for rank, (score, text) in enumerate(hits, start=1):
                out.print(similar_line(query, rank, score, text, as_json), highlight=False, soft_wrap=True)
        return
    for line in _call(lambda: list(answer_lines(predictor, texts, aggregation.value, as_json))):  # as predict.py
        out.print(line, highlight=False, soft_wrap=True, markup=False)


def main() -> None:
    import os

    from edgepress.logs import log_to, summarise_library_messages

    log_to(err)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # every process would run the whole command into the same files
        err.print("[bold red]error:[/] edgepress commands run as one process; this one was started as one of "
                  f"{os.environ['WORLD_SIZE']} (accelerate launch, torchrun). Fix: run `edgepress run` plainly and "
                  "set runtime.launch in the config: its training stages then run on several processes",
                  highlight=False, soft_wrap=True)
        raise SystemExit(2)
    try:
        app()
    finally:
        summarise_library_messages("edgepress")
