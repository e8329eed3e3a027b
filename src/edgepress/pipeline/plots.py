"""The report's plots, as inline SVG: accuracy with its 95% CI, CPU latency, size, and accuracy against latency (the
Pareto front drawn; benchmarks/compare.py draws the same plot for its candidates)."""

import io

from edgepress.logs import words
from edgepress.tasks import recorded_task


def axes(width: float, height: float):
    """(figure, axes) of a matplotlib Figure made on its own, outside pyplot: no backend is chosen and no figure is
    registered or closed in the caller's process (a library that called pyplot.close("all") closed its user's
    figures), and a figure is freed with its last reference."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    return figure, figure.subplots()


def svg_of(figure) -> str:
    """A matplotlib figure as inline SVG text."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog so it can sit inside HTML


def _measured(report: dict) -> list[tuple[str, dict]]:
    rows = [("baseline", report["baseline"]["metrics"])]
    rows += [(s["name"], s["metrics"]) for s in report["stages"]]
    primary = recorded_task(report["baseline"]["metrics"]).primary
    return [(name, m) for name, m in rows if primary in m]


def stage_plots(report: dict) -> dict[str, str]:
    """{"accuracy": svg, "latency": svg, "size": svg} for the measured stages of `report`."""
    rows = _measured(report)
    names = [name for name, _ in rows]
    x = range(len(rows))
    plots = {}

    fig, ax = axes(6, 3)
    primary = recorded_task(report["baseline"]["metrics"]).primary  # an embedder's neighbour_overlap
    label = f"test {words(primary)} (95% CI)"
    acc = [m[primary] for _, m in rows]
    err = [[m[primary] - m[f"{primary}_ci95"][0] for _, m in rows], [m[f"{primary}_ci95"][1] - m[primary]
                                                                      for _, m in rows]]
    ax.errorbar(x, acc, yerr=err, fmt="o", capsize=4)
    ax.set(xticks=list(x), xticklabels=names, ylabel=label)
    plots["accuracy"] = svg_of(fig)

    fig, ax = axes(6, 3)
    cpu = [m.get("latency", {}).get("cpu") for _, m in rows]
    fixed = [c["p50_ms"] if c else 0 for c in cpu]
    natural = [c["natural"]["p50_ms"] if c else 0 for c in cpu]
    ax.bar([i - 0.2 for i in x], fixed, width=0.4, label="fixed shape")
    ax.bar([i + 0.2 for i in x], natural, width=0.4, label="natural lengths")
    ax.set(xticks=list(x), xticklabels=names, ylabel="CPU p50 latency (ms)")
    ax.legend()
    plots["latency"] = svg_of(fig)

    fig, ax = axes(6, 3)
    ax.bar(list(x), [m["size_bytes"] / 1e6 for _, m in rows], label="file")
    ax.bar(list(x), [m["size_gzip_bytes"] / 1e6 for _, m in rows], width=0.5, label="gzip")
    ax.set(xticks=list(x), xticklabels=names, ylabel="size (MB)")
    ax.legend()
    plots["size"] = svg_of(fig)
    timed = [(name, c["p50_ms"], m[primary], m[f"{primary}_ci95"]) for (name, m), c in zip(rows, cpu, strict=True)
             if c]
    if timed:
        plots["accuracy against latency"] = pareto_svg(timed, "CPU p50 ms at the fixed shape (log scale)", label)
    for stage in report["stages"]:
        if "front" in stage.get("details", {}):
            plots[f"{stage['name']}: the calibration's front"] = front_svg(stage["details"], primary)
    return plots


def front_svg(details: dict, primary: str) -> str:
    """A cascade's calibration front on the validation split: agreement with the baseline and the primary metric
    against the share of texts deferred to the fallback, the chosen threshold marked."""
    rows, picked = details["front"], details["cascade"]["validation"]
    fig, ax = axes(6, 3.2)
    shares = [100 * r["deferred"] for r in rows]
    ax.plot(shares, [r["agreement"] for r in rows], label="agreement with the baseline")
    ax.plot(shares, [r[primary] for r in rows], label=words(primary))
    ax.axvline(100 * picked["deferred"], color="grey", linestyle="--", label="chosen threshold")
    ax.set(xlabel="validation texts deferred to the fallback (%)", ylabel="on validation")
    ax.legend(loc="lower right")
    return svg_of(fig)


def pareto_front(points: list[tuple[str, float, float, list]]) -> list[tuple[str, float, float, list]]:
    """The points no other point beats on both latency and accuracy (faster and at least as accurate), fastest
    first."""
    front, best = [], -1.0
    for point in sorted(points, key=lambda p: (p[1], -p[2])):
        if point[2] > best:
            front.append(point)
            best = point[2]
    return front


def pareto_svg(points: list[tuple[str, float, float, list]], xlabel: str,
               ylabel: str = "test accuracy (95% CI)") -> str:
    """Accuracy (or another score: `ylabel`; 95% CI bars) against latency, one labelled point per (name, latency ms,
    score, [lo, hi]), the Pareto front drawn as a step line."""
    fig, ax = axes(7, 4)
    for name, ms, acc, (lo, hi) in points:
        ax.errorbar([ms], [acc], yerr=[[acc - lo], [hi - acc]], fmt="o", capsize=3)
        ax.annotate(name, (ms, acc), textcoords="offset points", xytext=(5, 4), fontsize=8)
    front = pareto_front(points)
    ax.step([p[1] for p in front], [p[2] for p in front], where="post", color="grey", linestyle="--",
            label="Pareto front")
    ax.set(xscale="log", xlabel=xlabel, ylabel=ylabel)
    ax.legend(loc="lower right")
    return svg_of(fig)
