"""SEARCH_DIR/report.{md,html}: how the budget was spent, the shape table, every trial, the validation front, the
finalists on test and the winner's run; built from report.json's dict alone."""

from edgepress.logs import words
from edgepress.pipeline.plots import axes, svg_of
from edgepress.pipeline.report import html_template


def _f(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _ci(ci, sign: str = "+") -> str:
    return "–" if not ci else f"[{ci[0]:{sign}.4f}, {ci[1]:{sign}.4f}]"


def metric_words(report: dict) -> str:
    """What the search's `accuracy` figures are, in words: the task's primary metric (a report from before the
    field: accuracy)."""
    return words(report.get("metric", "accuracy"))


def constraints_text(constraints: dict) -> str:
    """`accuracy.max_drop 0.01, size.max_mb 9`: the constraints set."""
    return ", ".join(f"{kind}.{rule} {value}" for kind, limits in constraints.items() if limits
                     for rule, value in limits.items() if value not in (None, False))


def status_line(report: dict) -> str:
    best, winner, metric = report.get("best"), report["winner"], metric_words(report)
    if best and not best.get("passed", True):
        return (f"Trial {best['trial']} won on the validation split, but its run of `best.yaml` missed the "
                f"constraints on the test split (test {metric} {best['accuracy']:.4f}, drop vs the teacher "
                f"{_ci(best['drop_ci95'])}): see `best/report.md`")
    if best:
        return (f"Winner: trial {best['trial']}, test {metric} {best['accuracy']:.4f} (drop vs the teacher "
                f"{_ci(best['drop_ci95'])}), {best['p50_ms']:.2f} ms p50"
                + (f", {best['natural_mean_ms']:.2f} ms mean at natural lengths" if "natural_mean_ms" in best else "")
                + (f", {best['deferred']:.1%} of the test texts deferred" if "deferred" in best else "")
                + f", {best['size_mb']:.1f} MB: `best.yaml`, "
                f"bundle `{best['bundle']}`" + ("" if best["reproduced"] is not False else
                                                f" ⚠ its run's test {metric} differs from the trial's "
                                                f"model on test"))
    if winner is not None:
        return f"Best so far: trial {winner} (validation); the search is not finished"
    return "No trial has passed the constraints yet"


def first_draws(rows: list[dict]) -> list[dict]:
    """Each point's first trial, with `draws`: how many trials drew that point (the later ones took its result)."""
    firsts: dict[str, dict] = {}
    for row in rows:
        key = repr(sorted(row["params"].items())) if row["state"] in ("complete", "pruned") else f"#{row['number']}"
        firsts.setdefault(key, {**row, "draws": 0})["draws"] += 1
    return list(firsts.values())


def spent_lines(report: dict) -> list[str]:
    rows = report["trials"]
    firsts = first_draws(rows)
    stops = {}
    for row in firsts:
        stops[row["stop"]] = stops.get(row["stop"], 0) + 1
    trained = [r for r in rows if r["seconds"]]
    epochs = sorted({r["params"].get("epochs") for r in trained if r["params"]})
    exhausted = " The search ended before its limit: every point had been tried or pruned." \
        if report["spent"].get("exhausted") else ""
    return [f"{len(rows)} trial(s) over {len(firsts)} point(s): " + ", ".join(f"{n} {stop}" for stop, n in
                                                                               sorted(stops.items())) +
            f"; {len(rows) - len(firsts)} trial(s) drew a point already tried and took its result.{exhausted}",
            f"{sum(r['seconds'] for r in trained):.0f} s in trials (this process's loop: "
            f"{report['spent'].get('seconds', 0):.0f} s); training epochs per stage drawn from "
            f"{', '.join(map(str, epochs)) or '–'}. A prefix one trial trained (a student, a pruned model) is taken "
            f"from the stage cache by every later trial that starts with it.",
            pruning_line(report)]


def pruning_line(report: dict) -> str:
    rows, pruning = report["trials"], report["config"].get("pruning")
    epochs = sum(r.get("epochs_trained") or 0 for r in rows)
    trained = f"{epochs} training epoch(s) run in all (a stage taken from the cache trains none)."
    if not pruning:
        return f"Pruning off: every trial trains all its epochs. {trained}"
    pruned = [r for r in first_draws(rows) if r["stop"] == "pruned"]
    early = [r for r in pruned if r.get("epochs_trained")]
    return (f"Pruning: from a training stage's second epoch on, a trial stops when the stage's best validation "
            f"{metric_words(report)} plus its pace (its last or its mean gain per epoch, the larger) for every "
            f"epoch left falls more than {pruning['margin']:g} short of "
            f"the {report['required_accuracy']:.4f} the constraint requires, and a trial that starts with a pruned "
            f"trial's stages does not start; {len(pruned)} point(s) pruned"
            + (f" ({len(early)} while training: trials {', '.join(str(r['number']) for r in early)})" if pruned
               else "") + f". {trained}")


def shape_rows(report: dict) -> list[list[str]]:
    return [[name, f"{row['fixed_p50_ms']:.2f}", f"{row['size_mb']:.1f}",
             row.get("excluded") or shape_status(report, name)] for name, row in report["shapes"].items()]


def shape_status(report: dict, name: str) -> str:
    """What the search did with an allowed shape: the trials that drew it, and how many of its points are left to
    try (the others were tried, start with a pruned trial's stages, or are beaten by a passing trial)."""
    tried = [str(r["number"]) for r in first_draws(report["trials"]) if r["params"].get("shape") == name]
    counts = report["shape_points"][name]
    drawn = f"trial{'s' if len(tried) > 1 else ''} {', '.join(tried)}" if tried else "not drawn"
    if not counts["left"]:
        return f"{drawn}; settled: none of its {counts['points']} point(s) is left to try (tried, starting with a " \
               f"pruned trial's stages, or beaten by a passing trial)"
    return f"{drawn}; {counts['left']} of its {counts['points']} point(s) left to try"


def trial_table(report: dict) -> list[list[str]]:
    """One row per point: its first trial (report.json lists every trial)."""
    front = set(report["front"])
    return [[f"{r['number']}{' ★' if r['number'] in front else ''}" + (f" (×{r['draws']})" if r["draws"] > 1 else ""),
             ", ".join(f"{k} {v}" for k, v in r["params"].items()), _f(r["accuracy"], ".4f"), _f(r["p50_ms"], ".2f"),
             *([_f(r.get("natural_mean_ms"), ".2f"), _f(r.get("natural_p99_ms"), ".2f"), _f(r.get("deferred"), ".1%")]
               if cascades(report) else []),
             _f(r["size_mb"], ".1f"), _f(r["agreement"], ".4f"), r["stop"] + (f": {r['why']}" if r["why"] else ""),
             _f(r.get("epochs_trained"), "d"), _f(r["seconds"], ".0f")] for r in first_draws(report["trials"])]


def cascades(report: dict) -> bool:
    """The space chose cascades: the latency objective is the mean at natural lengths."""
    return bool(report["config"]["space"].get("cascade"))


def finalist_rows(report: dict) -> list[list[str]]:
    scored = report.get("finalists") or {}
    rows = [["teacher", f"{scored['teacher']['accuracy']:.4f}", _ci(scored["teacher"]["accuracy_ci95"], ""), "–"]] \
        if scored else []
    return rows + [[f"trial {n}", f"{s['accuracy']:.4f}", _ci(s["accuracy_ci95"], ""), _ci(s["drop_ci95"])]
                   if "accuracy" in s else [f"trial {n}", f"not scored here (its model is on {s['elsewhere']})", "–",
                                            "–"] for n, s in scored.items() if n != "teacher"]


def trial_header(report: dict) -> list[str]:
    natural = ["mean ms natural (the objective)", "p99 ms natural", "deferred"] if cascades(report) else []
    return ["trial", "point", f"validation {metric_words(report)}", "p50 ms", *natural, "size MB", "agreement",
            "outcome", "epochs", "s"]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]


def render_markdown(report: dict) -> str:
    c = report["config"]
    lines = ["# edgepress search", "", status_line(report), "",
             f"Model `{c['model']}`, data `{c['data']['source']}`; objective: {report['objective']}; constraints: "
             f"{constraints_text(c['constraints'])}. Trials are measured and selected on the validation split; the "
             f"test split scores the finalists once.", "", "## How the budget was spent", "",
             *[f"- {line}" for line in spent_lines(report)], "", "## Shapes (timed before any training, int8)", "",
             *_table(["shape", "p50 ms", "size MB", "status"], shape_rows(report)), "",
             "## Points tried (★: validation front; ×N: drawn by N trials, each listed in report.json)", "",
             *_table(trial_header(report), trial_table(report)), ""]
    if report.get("finalists"):
        lines += ["## Finalists on the test split", "",
                  *_table(["model", f"test {metric_words(report)}", "95% CI", "drop vs teacher, 95% CI"],
                          finalist_rows(report)), ""]
    return "\n".join(lines)


def front_plot(report: dict) -> str | None:
    """The validation score (`metric_words`) against the objective for every trial measured, size as the marker,
    the front joined."""
    key = ("natural_mean_ms" if cascades(report) else "p50_ms") if report["objective"] == "latency" else "size_mb"
    rows = [r for r in report["trials"] if r["accuracy"] is not None]
    if not rows:
        return None
    fig, ax = axes(6, 3.5)
    ax.scatter([r[key] for r in rows], [r["accuracy"] for r in rows], s=[10 + 4 * r["size_mb"] for r in rows],
               c=["#17803d" if r["stop"] == "passed" else "#999" for r in rows], alpha=0.7)
    front = sorted((r for r in rows if r["number"] in report["front"]), key=lambda r: r[key])
    ax.plot([r[key] for r in front], [r["accuracy"] for r in front], "-", color="#17803d")
    ax.set(xlabel={"p50_ms": "CPU p50 ms", "natural_mean_ms": "CPU mean ms at natural lengths"}.get(key, "size MB"),
           ylabel=f"validation {metric_words(report)}")
    return svg_of(fig)


def render_html(report: dict) -> str:
    return html_template("edgepress.search").render(
        report=report, status=status_line(report), constraints=constraints_text(report["config"]["constraints"]),
        spent=spent_lines(report), shapes=shape_rows(report),
        trials=trial_table(report), trial_header=trial_header(report), finalists=finalist_rows(report),
        plot=front_plot(report), metric=metric_words(report))
