"""What a run or a search wrote, as typed objects (the Python API's results): read from the report.json on disk, so
a result is exactly what the CLI's report says and can be read again later (`RunResult.read(run_dir)`)."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgepress.errors import ConfigError
from edgepress.files import read_json


def _report(out: Path, kind: str, holds: str) -> dict:
    """The report.json of the `kind` (run, search) dir `out`, which must hold `holds`; a ConfigError naming the fix
    when it is not there, not whole, or another kind's."""
    try:
        report = read_json(out / "report.json")
    except FileNotFoundError:
        raise ConfigError(f"{out} holds no report.json: it is not a {kind} dir (or the {kind} has not written one "
                          f"yet). Fix: give the dir the {kind} wrote into (its out)") from None
    except ValueError as e:
        raise ConfigError(f"{out}/report.json is not whole JSON ({e}). Fix: run the {kind} again, with "
                          f"resume=True") from None
    if not isinstance(report, dict) or holds not in report:
        other = "search" if kind == "run" else "run"
        raise ConfigError(f"{out} is not a {kind} dir: its report.json has no {holds}. Fix: read a {other}'s with "
                          f"edgepress.{'SearchResult' if other == 'search' else 'RunResult'}.read")
    return report


def _pair(value: Any) -> tuple[float, float] | None:
    return None if value is None else (float(value[0]), float(value[1]))


@dataclass(frozen=True)
class Latency:
    """One provider's timing of a model (milliseconds): at the run's fixed batch x sequence shape, and `natural`,
    one real text per call at its own length (None where it was not timed)."""

    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    runs: int
    natural: "Latency | None" = None

    @classmethod
    def of(cls, record: Mapping) -> "Latency":
        natural = record.get("natural")
        return cls(*(float(record[k]) for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms")), int(record["runs"]),
                   cls.of(natural) if natural else None)


@dataclass(frozen=True)
class Metrics:
    """A model's measured figures on the test split (a search trial's: on validation). `primary` names the task's
    metric (accuracy, f1, neighbour_overlap) and `value` is it; `agreement` is fidelity to the baseline (None for the
    baseline itself); `sets` holds the figures on each further scored set (typos, registers); `raw`, everything the
    report records."""

    primary: str
    value: float | None
    ci95: tuple[float, float] | None
    agreement: float | None
    agreement_ci95: tuple[float, float] | None
    drop_ci95: tuple[float, float] | None
    n_test: int | None
    size_bytes: int | None
    latency: Mapping[str, Latency]
    sets: Mapping[str, Mapping[str, Any]]
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def of(cls, m: Mapping) -> "Metrics":
        primary = m.get("primary_metric", "accuracy")
        return cls(primary, m.get(primary), _pair(m.get(f"{primary}_ci95")), m.get("agreement"),
                   _pair(m.get("agreement_ci95")), _pair(m.get(f"{primary}_drop_ci95")), m.get("n_test"),
                   m.get("size_bytes"), {name: Latency.of(r) for name, r in m.get("latency", {}).items()},
                   m.get("sets", {}), m)


@dataclass(frozen=True)
class Gate:
    """One gate a stage was judged by: `kind` (accuracy, latency, size, parity, fidelity) and `rule` (max_drop,
    min_speedup, ...) as the config names them, the measured `value` (None: it could not be measured), the `limit`
    and the verdict."""

    kind: str
    rule: str
    value: float | None
    limit: float
    passed: bool

    @classmethod
    def of(cls, g: Mapping) -> "Gate":
        return cls(g["kind"], g["rule"], g["value"], g["limit"], bool(g["passed"]))


@dataclass(frozen=True)
class Stage:
    """One stage as the run left it: `status` passed, failed or skipped (not reached); `artifact`, the model it made
    (None where it made none); `method`, the method that made it (a fallback's, where one passed)."""

    name: str
    method: str | None
    status: str
    metrics: Metrics
    gates: tuple[Gate, ...]
    artifact: Path | None
    details: Mapping[str, Any] = field(repr=False)

    @classmethod
    def of(cls, s: Mapping) -> "Stage":
        artifact = s.get("artifact")
        return cls(s["name"], s.get("method"), s["status"], Metrics.of(s.get("metrics") or {}),
                   tuple(Gate.of(g) for g in s.get("gates") or ()), Path(artifact) if artifact else None,
                   s.get("details") or {})

    @property
    def missed(self) -> tuple[Gate, ...]:
        """The gates it missed."""
        return tuple(g for g in self.gates if not g.passed)


@dataclass(frozen=True)
class RunResult:
    """A pipeline run as its report.json records it: `status` (passed, failed, error, running), the baseline and
    every stage of the config in order, and `final` as the report names it: the bundle dir (RUN_DIR/final) when
    every gate passed, else the last model that passed (None: none did); `bundle`, the bundle dir or None."""

    out: Path
    run_id: str
    status: str
    error: str | None
    baseline: Stage
    stages: tuple[Stage, ...]
    final: Path | None
    report: Mapping[str, Any] = field(repr=False)

    @classmethod
    def read(cls, out: str | Path) -> "RunResult":
        """The result of the run in `out`, from its report.json."""
        out = Path(out)
        r = _report(out, "run", "baseline")
        measured = bool((r["baseline"] or {}).get("metrics"))  # a run that failed before measuring its model: not
        baseline = Stage.of({"name": "baseline", "method": None, "status": "passed" if measured else "skipped",
                             **(r["baseline"] or {})})
        final = (r.get("final") or {}).get("artifact")
        return cls(out, r["run_id"], r["status"], r.get("error"), baseline, tuple(Stage.of(s) for s in r["stages"]),
                   Path(final) if final else None, r)

    @property
    def passed(self) -> bool:
        """Whether every gate passed."""
        return self.status == "passed"

    @property
    def bundle(self) -> Path | None:
        """The device bundle (RUN_DIR/final), None unless every gate passed."""
        return self.out / "final" if self.passed and (self.out / "final").is_dir() else None

    def stage(self, name: str) -> Stage:
        """The stage called `name` (KeyError naming the stages there are)."""
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(f"no stage {name!r}: the run's stages are {', '.join(s.name for s in self.stages)}")


@dataclass(frozen=True)
class Trial:
    """One trial of a search: its point (`params`), how it ended (`stop`: passed, beaten, pruned, failed, ...) and
    why, and its figures on the validation split where it ran (`accuracy` is the task's primary metric)."""

    number: int
    params: Mapping[str, Any]
    stop: str
    why: str
    accuracy: float | None
    p50_ms: float | None
    size_mb: float | None
    run_dir: Path | None

    @classmethod
    def of(cls, t: Mapping) -> "Trial":
        return cls(t["number"], t.get("params") or {}, t["stop"], t.get("why") or "", t.get("accuracy"),
                   t.get("p50_ms"), t.get("size_mb"), Path(t["run_dir"]) if t.get("run_dir") else None)


@dataclass(frozen=True)
class SearchResult:
    """A search as its report.json records it: every trial, and the winner — best.yaml (`config`), run again on
    the test split into `run` (its bundle `run.bundle`)."""

    out: Path
    trials: tuple[Trial, ...]
    best_trial: int | None
    config: Path | None
    run: RunResult | None
    report: Mapping[str, Any] = field(repr=False)

    @classmethod
    def read(cls, out: str | Path) -> "SearchResult":
        """The result of the search in `out`, from its report.json."""
        out = Path(out)
        r = _report(out, "search", "trials")
        best = r.get("best") or {}
        run = RunResult.read(out / "best") if (out / "best" / "report.json").is_file() else None
        return cls(out, tuple(Trial.of(t) for t in r.get("trials", ())), best.get("trial"),
                   out / "best.yaml" if (out / "best.yaml").is_file() else None, run, r)
