"""Gates: every limit a stage's config sets, checked against its measured metrics. Each check becomes a record
{kind, rule, limit, value, passed, excess}; a stage passes when all of them pass. `excess` is how far the value lies
beyond its limit, in the limit's direction (<= 0: within; None: not measured), what a search ranks missed
constraints by."""


from edgepress.pipeline.config import Gates
from edgepress.tasks import recorded_task, resolvable_drop


def drop_noise(max_drop: float, n: int, split: str, fix: str = "") -> str | None:
    """Why an `accuracy.max_drop` (not strict) judged on `n` texts of `split` cannot be resolved there, None when it
    can: its verdict is as much the split's luck as the model's. `fix`: what else to say beside the floor."""
    floor = resolvable_drop(n)
    if max_drop >= floor:
        return None
    return (f"accuracy.max_drop {max_drop:g} is inside the noise of {n:,} {split} texts (there the paired 95% CI of a "
            f"drop spans about ±{floor:g}: a smaller drop cannot be told from chance): its verdict can flip with "
            f"another split. Fix: max_drop {floor:g} or more{fix}, more {split} texts, or strict: true to judge the "
            f"drop's CI")


def noisy_gates(cfg, n_test: int) -> list[str]:
    """A line for every `accuracy.max_drop` (not strict) tighter than `n_test` test texts can resolve."""
    return [f"stage '{stage.name}': {line}" for stage in cfg.stages
            if (gate := stage.gates.accuracy) is not None and gate.max_drop is not None and not gate.strict
            and gate.metric != "spearman"  # spearman: on the pairs
            and (line := drop_noise(gate.max_drop, n_test, "test", " (what `edgepress init` sets for this split)"))]


def _check(kind: str, rule: str, limit: float, value: float | None, ok_when_below: bool) -> dict:
    excess = None if value is None else (value - limit if ok_when_below else limit - value)
    return {"kind": kind, "rule": rule, "limit": limit, "value": value, "passed": excess is not None and excess <= 0,
            "excess": excess}


def _latency(metrics: dict, provider: str) -> dict | None:
    return metrics.get("latency", {}).get(provider)


def figures_of(metrics: dict, metric: str) -> dict:
    """Where `metric` is recorded: with the test split's figures, or in the scored set that holds it (spearman: the
    pairs'); {} where it was not measured."""
    return metrics if metric in metrics else next(
        (figures for figures in metrics.get("sets", {}).values() if metric in figures), {})


def _value(metrics: dict, metric: str) -> float | None:
    return figures_of(metrics, metric).get(metric)


def _accuracy(rule: str, limit: float, value: float | None, ok_when_below: bool, primary: str) -> dict:
    return {**_check("accuracy", rule, limit, value, ok_when_below),
            **({"metric": primary} if primary != "accuracy" else {})}


def _max_drop(limit: float, strict: bool, baseline: dict, metrics: dict, primary: str) -> dict:
    """The drop of the gated metric vs the baseline; strict: the upper end of its paired 95% CI
    (`accuracy_drop_ci95`, an embedder's `neighbour_overlap_drop_ci95` or `spearman_drop_ci95`), the point estimate
    recorded beside it."""
    base, now = _value(baseline, primary), _value(metrics, primary)
    drop = None if base is None or now is None else base - now
    if not strict:
        return _accuracy("max_drop", limit, drop, True, primary)
    upper = figures_of(metrics, primary).get(f"{primary}_drop_ci95", [None, None])[1]
    return {**_accuracy("max_drop", limit, upper, True, primary), "strict": True, "point_estimate": drop}


def _min_agreement(limit: float, strict: bool, metrics: dict, on: str) -> dict:
    """Agreement with the baseline's labels on the set `on`; strict: the lower end of its 95% CI, the point estimate
    beside it. Not measured (None) when the stage stopped before it was measured."""
    figures = metrics if on == "test" else metrics.get("sets", {}).get(on, {})
    if not strict:
        return {**_check("fidelity", "min_agreement", limit, figures.get("agreement"), False), "on": on}
    lower = figures.get("agreement_ci95", [None, None])[0]
    return {**_check("fidelity", "min_agreement", limit, lower, False), "on": on, "strict": True,
            "point_estimate": figures.get("agreement")}


def speedup_of(now: dict | None, base: dict | None) -> float | None:
    """Baseline p50 / stage p50 of two cpu latency entries: as the two were timed side by side for a speedup gate
    (`side_by_side`), else each p50 as its stage timed it; None where either was not timed."""
    if now and "side_by_side" in now:
        return now["side_by_side"]["speedup"]
    return base["p50_ms"] / now["p50_ms"] if now and base else None


def natural_speedup_of(now: dict | None, base: dict | None) -> float | None:
    """Baseline p50 / stage p50 at natural lengths: as timed side by side for a natural speedup gate
    (`side_by_side_natural`), else each as its stage timed it; None where either was not timed."""
    if now and "side_by_side_natural" in now:
        return now["side_by_side_natural"]["speedup"]
    timed = now and base and "natural" in now and "natural" in base
    return base["natural"]["p50_ms"] / now["natural"]["p50_ms"] if timed else None


def _min_speedup(rule: str, limit: float, now: dict | None, base: dict | None) -> dict:
    """A speedup gate (`speedup_of`; min_natural_speedup: `natural_speedup_of`), with the side-by-side timings
    beside the value when there are any."""
    natural = rule == "min_natural_speedup"
    key = "side_by_side_natural" if natural else "side_by_side"
    paired = {"side_by_side": now[key]} if now and key in now else {}
    value = natural_speedup_of(now, base) if natural else speedup_of(now, base)
    return {**_check("latency", rule, limit, value, False), **paired}


def gate_name(gate: dict) -> str:
    """'accuracy.max_drop'; a fidelity gate on a set other than the test split names it: 'fidelity.min_agreement on
    typos'; an accuracy gate on another task's metric names that: 'accuracy.max_drop (neighbour_overlap)'."""
    on = gate.get("on", "test")
    return f"{gate['kind']}.{gate['rule']}" + ("" if on == "test" else f" on {on}") + (
        f" ({gate['metric']})" if "metric" in gate else "")


def evaluate_gates(gates: Gates, metrics: dict, baseline: dict, previous: dict, parity: dict | None) -> list[dict]:
    """The gate records of one stage: `metrics` of the stage, `baseline` and `previous` stage metrics, and the
    parity numbers the method measured (None for methods that change no graph)."""
    results = []
    if (a := gates.accuracy) is not None:
        primary = a.metric or recorded_task(baseline).primary
        if a.max_drop is not None:
            results.append(_max_drop(a.max_drop, a.strict, baseline, metrics, primary))
        if a.max_stage_drop is not None:
            before, now = _value(previous, primary), _value(metrics, primary)
            drop = None if before is None or now is None else before - now
            results.append(_accuracy("max_stage_drop", a.max_stage_drop, drop, True, primary))
        if a.min is not None:
            results.append(_accuracy("min", a.min, _value(metrics, primary), False, primary))
    if (g := gates.latency) is not None:
        now, base = _latency(metrics, g.provider), _latency(baseline, g.provider)
        if g.max_p50_ms is not None:
            results.append(_check("latency", "max_p50_ms", g.max_p50_ms, now and now["p50_ms"], True))
        for rule, percentile in (("max_p90_ms", "p90_ms"), ("max_p99_ms", "p99_ms")):
            if getattr(g, rule) is not None:
                results.append(_check("latency", rule, getattr(g, rule), now and now[percentile], True))
        if g.min_speedup is not None:
            results.append(_min_speedup("min_speedup", g.min_speedup, now, base))
        if g.min_natural_speedup is not None:
            results.append(_min_speedup("min_natural_speedup", g.min_natural_speedup, now, base))
    if (s := gates.size) is not None:
        if s.max_mb is not None:
            results.append(_check("size", "max_mb", s.max_mb, metrics["size_bytes"] / 1e6, True))
        if s.min_ratio is not None:
            results.append(_check("size", "min_ratio", s.min_ratio, baseline["size_bytes"] / metrics["size_bytes"],
                                  False))
    if (f := gates.fidelity) is not None and f.min_agreement is not None:
        results += [_min_agreement(f.min_agreement, f.strict, metrics, on) for on in f.on]
    if (p := gates.parity) is not None:
        if p.max_abs_diff is not None:
            results.append(_check("parity", "max_abs_diff", p.max_abs_diff, parity and parity["max_abs_diff"], True))
        if p.min_agreement is not None:
            results.append(_check("parity", "min_agreement", p.min_agreement, parity and parity["agreement"], False))
    return results
