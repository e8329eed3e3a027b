"""report.json and report.md, built only from the files of the run directory."""

from edgepress import __version__
from edgepress.files import read_json, write_json, write_text
from edgepress.pipeline.rundir import RunDir

REPORT_VERSION = 1


def build_report(run: RunDir) -> dict:
    """The contract's report: environment, baseline, stages, final (the last stage that passed)."""
    records = [run.read_stage(folder) for folder in run.stage_dirs()]
    if not records:
        raise ValueError(f"{run.root} has no finished stage to report")
    baseline, stages = records[0], records[1:]
    passed = [s for s in stages if s["status"] == "passed"]
    final = passed[-1] if passed else baseline
    meta = read_json(run.root / "run.json")
    split = read_json(run.root / "data_split.json")
    return {
        "version": REPORT_VERSION,
        "edgepress": __version__,
        **meta,
        "data": {key: split[key] for key in ("source", "id2label", "sizes", "sha256")},
        "baseline": {"artifact": baseline["artifact"], "metrics": baseline["metrics"]},
        "stages": stages,
        "final": {"artifact": final["artifact"], "metrics": final["metrics"]},
    }


def _row(name: str, metrics: dict) -> str:
    lo, hi = metrics["accuracy_ci95"]
    size = metrics["size_bytes"] / 1e6
    cpu = metrics.get("latency", {}).get("cpu")
    latency = f"{cpu['p50_ms']:.2f} / {cpu['natural']['p50_ms']:.2f}" if cpu else "–"
    return (f"| {name} | {metrics['accuracy']:.4f} | [{lo:.4f}, {hi:.4f}] | {metrics['n_test']} | {size:.1f} "
            f"| {latency} |")


def render_markdown(report: dict) -> str:
    env = report["environment"]
    rows = [_row("baseline", report["baseline"]["metrics"])]
    rows += [_row(f"{s['name']} ({s['status']})", s["metrics"]) for s in report["stages"]]
    return "\n".join([
        "# edgepress report",
        "",
        f"Data: `{report['data']['source']}` ({report['data']['sizes']}). "
        f"Machine: {env['cpu']}, {env['cores']} cores, {env['threads']} threads; torch {env['torch']}, "
        f"onnxruntime {env['onnxruntime']}.",
        "",
        "| stage | accuracy | 95% CI | n | size (MB) | CPU p50 ms: fixed shape / natural lengths |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"Final: `{report['final']['artifact']}`",
        "",
    ])


def write_report(run: RunDir) -> dict:
    """Build the report from the run's files and write report.json and report.md."""
    report = build_report(run)
    write_json(run.root / "report.json", report)
    write_text(run.root / "report.md", render_markdown(report))
    return report
