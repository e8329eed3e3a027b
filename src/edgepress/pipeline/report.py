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
    bundle = run.root / "final"
    final_artifact = str(bundle) if (bundle / "edgepress.json").is_file() else final["artifact"]
    meta = read_json(run.root / "run.json")
    split = read_json(run.root / "data_split.json")
    return {
        "version": REPORT_VERSION,
        "edgepress": __version__,
        **meta,
        "data": {key: split[key] for key in ("source", "id2label", "sizes", "sha256")},
        "baseline": {"artifact": baseline["artifact"], "metrics": baseline["metrics"]},
        "stages": stages,
        "final": {"artifact": final_artifact, "metrics": final["metrics"]},
    }


def _row(name: str, status: str, metrics: dict) -> str:
    if "accuracy" not in metrics:  # the stage stopped before it could be measured (a parity miss)
        return f"| {name} | {status} | – | – | – | – |"
    lo, hi = metrics["accuracy_ci95"]
    cpu = metrics.get("latency", {}).get("cpu")
    latency = f"{cpu['p50_ms']:.2f} / {cpu['natural']['p50_ms']:.2f}" if cpu else "–"
    return (f"| {name} | {status} | {metrics['accuracy']:.4f} [{lo:.4f}, {hi:.4f}] "
            f"| {metrics['size_bytes'] / 1e6:.1f} | {latency} | {metrics['params']:,} |")


def _gate_lines(stage: dict) -> list[str]:
    attempts = stage.get("details", {}).get("attempts", [])
    lines = [f"- `{stage['name']}` attempt {i}: {a['method']} {a['status']}" for i, a in enumerate(attempts, 1)
             if len(attempts) > 1]
    for g in stage["gates"]:
        value = "not measured" if g["value"] is None else f"{g['value']:.4g}"
        lines.append(f"- {'✓' if g['passed'] else '✗'} `{stage['name']}` {g['kind']}.{g['rule']}: {value} "
                     f"(limit {g['limit']:g})")
    return lines


def render_markdown(report: dict) -> str:
    env, base = report["environment"], report["baseline"]["metrics"]
    rows = [_row("baseline", "–", base)] + [_row(s["name"], s["status"], s["metrics"]) for s in report["stages"]]
    gates = [line for stage in report["stages"] for line in _gate_lines(stage)]
    return "\n".join([
        "# edgepress report",
        "",
        f"Data: `{report['data']['source']}` ({report['data']['sizes']}). "
        f"Machine: {env['cpu']}, {env['cores']} cores; torch {env['torch']}, onnxruntime {env['onnxruntime']}.",
        "",
        f"Accuracy on {base['n_test']} test examples with its 95% CI; CPU latency p50 in ms at the fixed shape / "
        "test sentences at natural length.",
        "",
        "| stage | status | accuracy [95% CI] | size (MB) | CPU p50 ms | params |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        "## Gates",
        "",
        *(gates or ["(no gates)"]),
        "",
        f"Final: `{report['final']['artifact']}`",
        "",
    ])


def render_html(report: dict) -> str:
    """A self-contained page: the stage table, the gates, and the plots as inline SVG."""
    from jinja2 import Environment, PackageLoader, select_autoescape

    from edgepress.pipeline.plots import stage_plots

    env = Environment(loader=PackageLoader("edgepress.pipeline", "."), autoescape=select_autoescape(["html", "j2"]))
    rows = [{"name": "baseline", "method": "baseline", "status": "passed", "m": report["baseline"]["metrics"]}]
    rows += [{"name": s["name"], "method": s["method"], "status": s["status"], "m": s["metrics"]}
             for s in report["stages"]]
    return env.get_template("report.html.j2").render(report=report, env=report["environment"], rows=rows,
                                                     plots=stage_plots(report))


def write_report(run: RunDir) -> dict:
    """Build the report from the run's files and write report.json, report.md and report.html."""
    report = build_report(run)
    write_json(run.root / "report.json", report)
    write_text(run.root / "report.md", render_markdown(report))
    write_text(run.root / "report.html", render_html(report))
    return report
