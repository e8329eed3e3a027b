"""report.json and report.md, built only from the files of the run directory."""

import functools
import json
from itertools import pairwise

from edgepress.data.dataset import missing_classes
from edgepress.files import read_json, write_json, write_text
from edgepress.logs import words
from edgepress.pipeline.gates import gate_name, speedup_of
from edgepress.pipeline.rundir import RunDir
from edgepress.tasks import recorded_task
from edgepress.version import __version__

REPORT_VERSION = 1


def _skipped(stage: dict) -> dict:
    """A stage of the config that this run did not reach."""
    return {"name": stage["name"], "method": stage["method"], "status": "skipped", "artifact": None, "metrics": {},
            "gates": [], "details": {}}


def _final(run: RunDir, meta: dict, baseline: dict | None, stages: list[dict]) -> dict | None:
    """The bundle when this run wrote one (every gate passed), else the last model of this run that passed."""
    manifest = run.root / "final" / "edgepress.json"
    if meta["status"] == "passed" and manifest.is_file() and read_json(manifest).get("run_id") == meta["run_id"]:
        return {"artifact": str(run.root / "final"), "metrics": stages[-1]["metrics"]}
    passed = [s for s in [baseline, *stages] if s and s["status"] == "passed"]
    return {"artifact": passed[-1]["artifact"], "metrics": passed[-1]["metrics"]} if passed else None


def build_report(run: RunDir) -> dict:
    """The contract's report, from the run's files: exactly the stages of the run's config, each as this run left
    it (`skipped` when it was not reached), the run's status (running, passed, failed, error) and the final model."""
    meta = read_json(run.root / "run.json")
    run_id = meta["run_id"]
    baseline = run.stage_of_run(0, "baseline", run_id)
    stages = [run.stage_of_run(i, s["name"], run_id) or _skipped(s)
              for i, s in enumerate(meta["config"]["stages"], start=1)]
    split_file = run.root / "data_split.json"
    split = read_json(split_file) if split_file.is_file() else {}
    return {
        "version": REPORT_VERSION,
        "edgepress": __version__,
        **meta,
        "data": {key: split.get(key) for key in ("source", "id2label", "sizes", "sha256", "note", "class_counts")},
        "baseline": {"artifact": baseline["artifact"], "metrics": baseline["metrics"]} if baseline
        else {"artifact": None, "metrics": {}},
        "stages": stages,
        "final": _final(run, meta, baseline, stages),
    }


def speedup(metrics: dict, baseline: dict) -> str:
    """Baseline CPU p50 / this p50 at the fixed shape, as '3.4x' ('–' where either was not timed); '3.4x*' where the
    two were timed side by side for a speedup gate."""
    now, base = (m.get("latency", {}).get("cpu") for m in (metrics, baseline))
    value = speedup_of(now, base)
    return "–" if value is None else f"{value:.1f}x" + ("*" if "side_by_side" in now else "")


# What a report says of each task's primary metric: its stage table's second column, what the table's scores are
# ({n}: test examples), what its fidelity is, what a fidelity cell measures, what the data line calls the examples
# and their labels
WORDING = {
    "accuracy": {
        "examples": "examples", "labels": "labels",
        "second": "agreement", "scores": "Accuracy on {n} test examples with its 95% CI",
        "fidelity": "agreement: the share of test examples a stage labels as the baseline does (fidelity), with its "
                    "95% CI.",
        "cell": "Agreement with the baseline's labels"},
    "neighbour_overlap": {
        "examples": "examples", "labels": "labels",
        "second": "cosine",
        "scores": "Neighbour overlap on {n} test texts with its 95% CI: the share of each text's 10 nearest test texts "
                  "(by cosine) that the baseline's vectors place there too (the baseline's own: 1); cosine: each "
                  "text's vector against the baseline's",
        "fidelity": "fidelity gates judge the neighbour overlap.",
        "cell": "Neighbour overlap with the baseline's vectors"},
    "f1": {
        "examples": "sentences", "labels": "tags",
        "second": "agreement",
        "scores": "Entity-level micro F1 on {n} test sentences with its 95% CI (seqeval's strict spans: an entity "
                  "counts where its type and its every word's tag are right)",
        "fidelity": "agreement: the F1 of a stage's entities with the baseline's taken as the truth (fidelity), "
                    "with its 95% CI.",
        "cell": "Entity agreement with the baseline's tags (F1, the baseline's entities as the truth)"},
}


def columns(baseline: dict) -> tuple[str, str]:
    """The two score columns of a stage table: (the primary metric, the second): accuracy and agreement with the
    baseline's labels for a classifier; neighbour overlap and cosine to the baseline's vectors for an embedder;
    entity F1 and agreement with the baseline's entities for a token classifier."""
    primary = recorded_task(baseline).primary
    return primary, WORDING[primary]["second"]


def _score(metrics: dict, name: str) -> str:
    lo, hi = metrics[f"{name}_ci95"]
    return f"{metrics[name]:.4f} [{lo:.4f}, {hi:.4f}]"


def _row(name: str, status: str, metrics: dict, baseline: dict) -> str:
    primary, second = columns(baseline)
    if primary not in metrics:  # the stage stopped before it could be measured (a parity miss)
        return f"| {name} | {status} | – | – | – | – | – | – | – |"
    cpu = metrics.get("latency", {}).get("cpu")
    latency = f"{cpu['p50_ms']:.2f} / {cpu['natural']['p50_ms']:.2f}" if cpu else "–"
    agreement = _score(metrics, second) if second in metrics else "–"
    return (f"| {name} | {status} | {_score(metrics, primary)} | {agreement} "
            f"| {metrics['size_bytes'] / 1e6:.1f} | {metrics['size_gzip_bytes'] / 1e6:.1f} | {latency} "
            f"| {speedup(metrics, baseline)} | {metrics['params']:,} |")


def _p50(metrics: dict) -> str:
    cpu = metrics.get("latency", {}).get("cpu")
    return f"{cpu['p50_ms']:.2f} ms" if cpu else "not measured"


def _sparse_line(stage: dict, before: dict) -> str:
    """What an unstructured stage's zeros cost and buy, beside its (dense) input: the same latency, a smaller gzip."""
    zeros, after = stage["details"]["sparsity"], stage["metrics"]
    line = (f"- `{stage['name']}` ({stage['method']}): {zeros['pruned_weights_sparsity']:.1%} of the "
            f"{zeros['pruned_weights']:,} pruned weights are zero ({zeros['all_params_sparsity']:.1%} of all "
            f"parameters). Neither torch nor ONNX Runtime skips zeros, so they take the time dense weights take "
            f"(CPU p50 {_p50(after)} against {_p50(before)} for its input, timed at different moments: compare "
            f"side by side with `edgepress bench`). What they buy is the compressed download: gzip "
            f"{after['size_gzip_bytes'] / 1e6:.1f} MB against {before['size_gzip_bytes'] / 1e6:.1f} MB.")
    control = stage["details"].get("control_test")
    if control:
        lo, hi = control["ticket_minus_control_ci95"]
        score = stage["details"].get("score", "accuracy")  # a token classifier's tickets are kept by entity F1
        rounds = "; ".join(f"{r['sparsity']:.1%}: {r[f'val_{score}']:.4f} vs {r[f'control_val_{score}']:.4f}"
                           for r in stage["details"]["rounds"])
        line += (f" Ticket against its random control, validation {score} per round ({rounds}); test "
                 f"{after[score]:.4f} vs {control[score]:.4f}, ticket − control 95% CI [{lo:+.4f}, {hi:+.4f}].")
    return line


def _sparse_lines(report: dict) -> list[str]:
    """One line per measured stage that made unstructured zeros, against the model it took."""
    chain, primary = [report["baseline"], *report["stages"]], recorded_task(report["baseline"]["metrics"]).primary
    return [_sparse_line(stage, before["metrics"]) for before, stage in pairwise(chain)
            if "sparsity" in stage.get("details", {}) and primary in stage["metrics"]
            and "size_gzip_bytes" in before["metrics"]]


MEASURED_WORDS = {"size_bytes": lambda v: f"{v / 1e6:.2f} MB", "p50_ms": lambda v: f"CPU p50 {v:.2f} ms"}


def _measured_word(key: str, value: float) -> str:
    """An attempt's figure in words: its size, its CPU p50, or its task's primary metric ("accuracy 0.8392")."""
    return MEASURED_WORDS[key](value) if key in MEASURED_WORDS else f"{words(key)} {value:.4f}"


def _attempt_line(name: str, i: int, attempt: dict) -> str:
    """One attempt of a stage with fallbacks: its method and the params it was given, what it measured, and why it
    failed (the gates it missed, or its error)."""
    given = json.dumps(attempt.get("params") or {}, separators=(", ", ": "))
    measured = attempt.get("measured") or {}
    numbers = ", ".join(_measured_word(k, v) for k, v in measured.items())
    why = "; ".join(f"{gate_text(g)}" for g in attempt["gates"] if not g["passed"]) or attempt.get("error", "")
    return (f"- `{name}` attempt {i}: {attempt['method']} {given} {attempt['status']}"
            f"{f' ({numbers})' if numbers else ''}{f': {why}' if why and attempt['status'] != 'passed' else ''}")


def _gate_lines(stage: dict) -> list[str]:
    attempts = stage.get("details", {}).get("attempts", [])
    lines = [_attempt_line(stage["name"], i, a) for i, a in enumerate(attempts, 1) if len(attempts) > 1]
    calibration = stage.get("details", {}).get("calibration")
    if calibration and calibration["used"] < calibration["asked"]:
        lines.append(f"- `{stage['name']}` calibrated on {calibration['used']} sentences, all the validation split "
                     f"has (calibration_size {calibration['asked']})")
    if "error" in stage.get("details", {}):
        lines.append(f"- ✗ `{stage['name']}` error: {stage['details']['error']}")
    for g in stage["gates"]:
        lines.append(f"- {'✓' if g['passed'] else '✗'} `{stage['name']}` {gate_text(g)}")
    return lines


def gate_text(gate: dict) -> str:
    """'accuracy.max_drop: 0.0038 (limit 0.01)'; a strict gate says which end of the CI its value is."""
    value = "not measured" if gate["value"] is None else f"{gate['value']:.4g}"
    if gate.get("strict"):
        end = "upper end of the paired" if gate["kind"] == "accuracy" else "lower end of the"
        estimate = "not measured" if gate["point_estimate"] is None else f"{gate['point_estimate']:.4g}"
        value += f", {end} 95% CI (point estimate {estimate})"
    if paired := gate.get("side_by_side"):
        where = " at natural lengths" if paired.get("natural") else ""
        statistic = paired.get("statistic", "p50")  # a cascade's: the mean
        how = (f"{statistic} of {paired['turns']} interleaved turns" if "turns" in paired  # before 2026-11-28:
               else f"median of {paired['rounds']} rounds")  # sessions opened anew each round, their p50s' median
        value += (f", timed side by side{where}: baseline {paired[f'baseline_{statistic}_ms']:.2f} ms, stage "
                  f"{paired[f'{statistic}_ms']:.2f} ms, {how}")
    return f"{gate_name(gate)}: {value} (limit {gate['limit']:g})"


STATUS_WORDS = {
    "running": "Running (this report is rewritten after every stage)",
    "passed": "Passed: every stage met its gates",
    "failed": "Failed",
    "error": "Stopped by an error",
}


def _status_line(report: dict) -> str:
    line = STATUS_WORDS[report["status"]]
    return f"{line}: {report['error']}" if report.get("error") else f"{line}."


def _sizes(report: dict) -> str:
    sizes = report["data"]["sizes"] or {}
    return ", ".join(f"{name} {n:,}" for name, n in sizes.items()) or "not recorded"


def data_line(report: dict) -> str:
    """The data, for a person: source, split sizes, label names (a token classifier's: sentences and tags)."""
    primary = columns(report["baseline"]["metrics"])[0]
    examples, named = WORDING[primary]["examples"], WORDING[primary]["labels"]
    labels = ", ".join((report["data"].get("id2label") or {}).values()) or "not recorded"
    note = f" Splits: {report['data']['note']}." if report["data"].get("note") else ""
    missing = "".join(f" ⚠ {line.capitalize()}: {words(primary)} there says nothing about it."
                      for line in missing_classes(report["data"].get("class_counts") or {}))
    return f"Data: {report['data']['source']} ({_sizes(report)} {examples}; {named}: {labels}).{note}{missing}"


def _providers_used(report: dict) -> list[str]:
    stages = [report["baseline"], *report["stages"]]
    return sorted({p for s in stages for timing in s["metrics"].get("latency", {}).values()
                   for p in timing.get("providers_used", [])})


def machine_line(report: dict) -> str:
    """The machine and what ran on it, for a person: the execution providers this run's timings verified, not the
    ones the installed onnxruntime merely lists (onnxruntime-gpu lists CUDA on machines without a GPU)."""
    env, threads = report["environment"], report["config"]["runtime"].get("threads")
    names = {"torch-cpu": "torch on CPU"}
    used = ", ".join(names.get(p, f"ONNX Runtime {p.removesuffix('ExecutionProvider')}")
                     for p in _providers_used(report)) or "nothing yet"
    return (f"Machine: {env['cpu']}, {env['cores']} cores, {threads or 'all its'} threads; torch {env['torch']}, "
            f"onnxruntime {env['onnxruntime']}. Timed on: {used}.")


def _fidelity_what(report: dict) -> str:
    """What a fidelity cell measures: agreement with the baseline's labels, or an embedder's neighbour overlap."""
    return WORDING[columns(report["baseline"]["metrics"])[0]]["cell"]


def fidelity_table(report: dict) -> tuple[list[str], list[list[str]]]:
    """(set names, a row of cells per stage): each stage's agreement with the baseline's labels [95% CI] on every set
    beyond the test split (typos, the user's fidelity sets, scored pairs), and its accuracy there where the set has
    labels, its Spearman correlation [95% CI] on scored pairs."""
    base = report["baseline"]["metrics"].get("sets", {})
    names, rows = list(base), []
    for stage in [{"name": "baseline", "metrics": report["baseline"]["metrics"]}, *report["stages"]]:
        sets = stage["metrics"].get("sets", {})
        cells = []
        for name in names:
            figures = sets.get(name, {})
            agreement = f"{figures['agreement']:.4f} [{figures['agreement_ci95'][0]:.4f}, " \
                f"{figures['agreement_ci95'][1]:.4f}]" if "agreement" in figures else "–"
            cells.append(agreement + (f" (accuracy {figures['accuracy']:.4f})" if "accuracy" in figures else "")
                         + (f" (F1 {figures['f1']:.4f})" if "f1" in figures else "")
                         + (f" (Spearman {_score(figures, 'spearman')})" if "spearman" in figures else ""))
        rows.append([stage["name"], *cells])
    return names, rows


def _fidelity_lines(report: dict) -> list[str]:
    names, rows = fidelity_table(report)
    if not names:
        return []
    sizes = ", ".join(f"{name} {report['baseline']['metrics']['sets'][name]['n']:,}" for name in names)
    pairs = (" pairs: the sentences of data.pairs, with the Spearman correlation of each pair's cosine with the "
             "score people gave it [95% CI]." if "pairs" in names else "")
    return ["## Fidelity", "",
            f"{_fidelity_what(report)} [95% CI] beyond the test split ({sizes} texts; typos: the test split with a "
            f"seeded typo in about one word of six), and accuracy (a token classifier's: F1) where the set has "
            f"labels.{pairs}", "",
            f"| stage | {' | '.join(names)} |", "|---|" + "---|" * len(names),
            *(f"| {' | '.join(row)} |" for row in rows), ""]


def entity_table(report: dict) -> tuple[list[str], list[list[str]]]:
    """(entity types, a row of cells per stage): a token classifier's F1 per entity type on the test split; the
    types' support (true entities) is the first row. Empty for other tasks."""
    base = report["baseline"]["metrics"].get("per_type")
    if not base:
        return [], []
    types = list(base)
    rows = [["support", *(f"{base[t]['support']:,}" for t in types)]]
    for stage in [{"name": "baseline", "metrics": report["baseline"]["metrics"]}, *report["stages"]]:
        per_type = stage["metrics"].get("per_type", {})
        rows.append([stage["name"], *(f"{per_type[t]['f1']:.4f}" if t in per_type else "–" for t in types)])
    return types, rows


def _entity_lines(report: dict) -> list[str]:
    types, rows = entity_table(report)
    if not types:
        return []
    return ["## Entities", "", "F1 per entity type on the test split (strict spans); support: its true entities.", "",
            f"| stage | {' | '.join(types)} |", "|---|" + "---|" * len(types),
            *(f"| {' | '.join(row)} |" for row in rows), ""]


FRONT_ROWS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)  # the calibration front's deferred shares a report shows


def cascade_sections(report: dict) -> list[dict]:
    """Per cascade stage, {"name", "text", "header", "rows"}: what it defers and why (threshold, confidence rule,
    target, fallback recipe), the deferred share and latency measured on the test split and the other sets, and its
    calibration front on validation at `FRONT_ROWS`, the chosen point marked."""
    primary = recorded_task(report["baseline"]["metrics"]).primary
    sections = []
    for stage in report["stages"]:
        details, metrics = stage.get("details", {}), stage.get("metrics", {})
        if "front" not in details or primary not in metrics:
            continue
        spec, picked = details["cascade"], details["cascade"]["validation"]
        (rule, limit), = spec["target"].items()
        natural = metrics.get("latency", {}).get("cpu", {}).get("natural", {})
        sets = ", ".join(f"{name} {figures['deferred']:.1%}" for name, figures in metrics.get("sets", {}).items()
                         if "deferred" in figures)
        timing = (f" At natural lengths (one text a call, both models where it defers): mean "
                  f"{natural['mean_ms']:.2f} ms, p50 {natural['p50_ms']:.2f}, p90 {natural['p90_ms']:.2f}, p99 "
                  f"{natural['p99_ms']:.2f} ms." if "mean_ms" in natural else "")
        nearest = [min(details["front"], key=lambda r, share=share: abs(r["deferred"] - share)) for share in FRONT_ROWS]
        rows = sorted({r["threshold"]: r for r in [*nearest, picked]}.values(), key=lambda r: r["deferred"])
        text = (f"The student answers a text when its confidence ({spec['rule']}) is at least {spec['threshold']:.4g}, "
                f"else the fallback does ({spec['fallback']['recipe']}, from {spec['fallback']['source']}). The "
                f"threshold is the one that defers the fewest validation texts while meeting {rule} {limit:g} there; "
                f"the test split never chose it. Deferred: test {metrics.get('deferred', 0):.1%}"
                + (f", {sets}" if sets else "") + f".{timing}")
        sections.append({"name": stage["name"], "text": text,
                         "header": ["deferred on validation", "threshold", "agreement with the baseline",
                                    words(primary)],
                         "rows": [[f"{r['deferred']:.1%}" + (" (chosen)" if r["threshold"] == picked["threshold"]
                                                             else ""), f"{r['threshold']:.4g}",
                                   f"{r['agreement']:.4f}", f"{r[primary]:.4f}"] for r in rows]})
    return sections


def _cascade_lines(report: dict) -> list[str]:
    lines = []
    for section in cascade_sections(report):
        lines += [f"### `{section['name']}`", "", section["text"], "", f"| {' | '.join(section['header'])} |",
                  "|---" * len(section["header"]) + "|", *(f"| {' | '.join(row)} |" for row in section["rows"]), ""]
    return ["## Cascade", "", *lines] if lines else []


def _table_intro(report: dict, primary: str) -> str:
    n = (report["data"]["sizes"] or {}).get("test", "?")
    scores, fidelity = WORDING[primary]["scores"].format(n=n), WORDING[primary]["fidelity"]
    return (f"{scores}; CPU latency p50 in ms at the fixed shape / test sentences at natural length; speedup = "
            "baseline p50 / stage p50 at the fixed shape, each timed when its stage ran (* : a stage with a speedup "
            "gate, timed side by side with the baseline, in turns; all side by side: benchmarks/compare.py); "
            f"{fidelity}")


def render_markdown(report: dict) -> str:
    base = report["baseline"]["metrics"]
    primary, second = columns(base)
    final = report["final"]["artifact"] if report["final"] else "none"
    rows = [_row("baseline", "–", base, base)]
    rows += [_row(s["name"], s["status"], s["metrics"], base) for s in report["stages"]]
    gates = [line for stage in report["stages"] for line in _gate_lines(stage)]
    sparse = _sparse_lines(report)
    return "\n".join([
        "# edgepress report",
        "",
        _status_line(report),
        "",
        data_line(report),
        machine_line(report),
        "",
        _table_intro(report, primary),
        "",
        f"| stage | status | {words(primary)} [95% CI] | {second} [95% CI] | size (MB) | gzip (MB) | "
        f"CPU p50 ms | speedup | params |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        *(["## Sparsity", "", *sparse, ""] if sparse else []),
        *_entity_lines(report),
        *_fidelity_lines(report),
        *_cascade_lines(report),
        "## Gates",
        "",
        *(gates or ["(no gates)"]),
        "",
        f"Final: `{final}`",
        "",
    ])


@functools.cache
def html_template(package: str):
    """`package`'s report.html.j2, compiled once a process: compiled anew for every page, it took 17 ms, most of the
    time a running run spends rewriting its page after each stage."""
    from jinja2 import Environment, PackageLoader, select_autoescape

    env = Environment(loader=PackageLoader(package, "."), autoescape=select_autoescape(["html", "j2"]))
    return env.get_template("report.html.j2")


def render_html(report: dict) -> str:
    """A self-contained page: the stage table, the gates, and the plots as inline SVG. The plots are drawn once the
    run has ended: a running run's page, rewritten after every stage, holds the table alone (drawing them took most
    of a small run's reporting time)."""
    from edgepress.pipeline.plots import stage_plots

    base = report["baseline"]
    rows = [{"name": "baseline", "method": "baseline", "status": "passed" if base["metrics"] else "skipped",
             "m": base["metrics"]}]
    rows += [{"name": s["name"], "method": s["method"], "status": s["status"], "m": s["metrics"]}
             for s in report["stages"]]
    for row in rows:
        row["speedup"] = speedup(row["m"], base["metrics"])
    sparse = [line.removeprefix("- ").replace("`", "") for line in _sparse_lines(report)]
    primary, second = columns(base["metrics"])
    return html_template("edgepress.pipeline").render(report=report, rows=rows,
                                                     plots=stage_plots(report) if report["status"] != "running"
                                                     else {},
                                                     primary=primary, second=second,
                                                     status=_status_line(report), data=data_line(report),
                                                     machine=machine_line(report), sparse=sparse, gate_text=gate_text,
                                                     fidelity=fidelity_table(report),
                                                     entities=entity_table(report),
                                                     cascades=cascade_sections(report),
                                                     fidelity_what=_fidelity_what(report))


def write_report(run: RunDir) -> dict:
    """Build the report from the run's files and write report.json, report.md and report.html."""
    report = build_report(run)
    write_json(run.root / "report.json", report)
    write_text(run.root / "report.md", render_markdown(report))
    write_text(run.root / "report.html", render_html(report))
    return report
