"""The faults of the environment as a class: every write a tiny pipeline, a rerun over an earlier run and a bundle
make is, in turn, failed with ENOSPC and killed with SIGKILL (tests/inject.py); after each, what is on disk must hold
docs/run-directory.md's invariants, and the command run again (`--resume`) must end as the undisturbed run did.

Each workload's writes are counted once; a case is one write N and one fault. By default a seeded sample of the
writes is run, one per site (an event on one path, temp names aside), `SAMPLE` per workload and fault;
`EDGEPRESS_INJECT=all` runs every write (about 20 minutes on 2 cores), `EDGEPRESS_INJECT_SEED` picks another
sample."""

import json
import os
import random
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.inject import CREATES
from tests.test_stagecache import _config, _csv

SAMPLE = os.environ.get("EDGEPRESS_INJECT", "4")
SEED = int(os.environ.get("EDGEPRESS_INJECT_SEED", "0"))
STAGE_NAMES = ["export", "fuse", "int8"]
TEMP = re.compile(r"\.[a-z0-9_]{8}\.(tmp|old)|[0-9a-f]{64}")  # tempfile's random part, a cache entry's digest
REPO = Path(__file__).resolve().parent.parent


class Injector:
    """The fork server of tests/inject.py: cases in, answers out."""

    def __init__(self, scratch: Path):
        self.scratch, self.count = scratch, 0
        self.process = subprocess.Popen([sys.executable, "-m", "tests.inject", str(scratch)], cwd=REPO, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=(scratch / "server.log").open("w"))
        assert self.process.stdout.readline().strip() == "ready", (scratch / "server.log").read_text()

    def __call__(self, *cases: dict) -> list[dict]:
        ids = []
        for case in cases:
            self.count += 1
            ids.append(self.count)
            self.process.stdin.write(json.dumps({**case, "id": self.count}) + "\n")
        self.process.stdin.flush()
        answers = {}
        for _ in cases:
            answer = json.loads(self.process.stdout.readline())
            assert "error" not in answer, answer["error"]
            answers[answer["id"]] = answer
        return [answers[i] for i in ids]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(60)


@pytest.fixture(scope="module")
def inject(tmp_path_factory):
    injector = Injector(tmp_path_factory.mktemp("inject"))
    yield injector
    injector.close()


def sample(writes: list, events: tuple[str, ...], sites_n: int) -> list[int]:
    """The writes (1-based) to fault: every one with EDGEPRESS_INJECT=all, else one per site, `sites_n` sites."""
    sites = defaultdict(list)
    for n, (event, path) in enumerate(writes, start=1):
        if event in events:
            sites[(event, TEMP.sub("*", path))].append(n)
    if SAMPLE == "all":
        return sorted(n for ns in sites.values() for n in ns)
    rng = random.Random(SEED)
    chosen = sorted(sites)
    rng.shuffle(chosen)
    return sorted(rng.choice(sites[site]) for site in chosen[:sites_n])


def faulted(inject, workload: dict, reference: dict, share: float = 1) -> list[str]:
    """Run `workload` with each sampled write (`share` of SAMPLE sites) failed and killed; what went wrong, case by
    case."""
    writes, cases = reference["writes"], []
    for fault, events in (("enospc", CREATES), ("kill", tuple({e for e, _ in writes}))):
        for n in sample(writes, events, max(1, round(int(SAMPLE) * share)) if SAMPLE != "all" else 0):
            root = workload["root"] / f"{fault}-{n}"
            first = {"argv": workload["argv"](root), "fault": [fault, n]}
            cases.append({"root": str(root), "clean": True, "steps": [first, {"argv": workload["again"](root)}],
                          "copy": [[str(a), str(root / b)] for a, b in workload.get("copy", [])],
                          "check": {**workload["check"](root), "dir": str(root / workload["dir"])},
                          "digest": workload["digest"], "fault": [fault, n, *writes[n - 1]]})
    found = []
    for case, answer in zip(cases, inject(*cases), strict=True):
        fault, n, event, path = case["fault"]
        what = f"{fault} at write {n} ({event} {path})"
        first, again = answer["codes"]
        if fault == "kill" and first != -9:
            found.append(f"{what}: the command ended ({first}) before that write")
        if fault == "enospc" and (first != 2 or "no space left on the device" not in answer["outputs"][0]
                                  or "Traceback" in answer["outputs"][0]):
            found.append(f"{what}: exit {first}, not 2 with the message:\n{answer['outputs'][0][-1500:]}")
        found += [f"{what}: {problem}" for problem in answer["problems"]]
        if again != 0:
            found.append(f"{what}: the command run again exited {again}:\n{answer['outputs'][1][-1500:]}")
        elif answer["digest"] != reference["digest"]:
            found.append(f"{what}: the command run again ended with other files than an undisturbed run: "
                         f"{answer['digest']} vs {reference['digest']}")
    return found


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, tiny_model_dir, movie_data) -> dict:
    """The tiny pipeline (export, fuse, int8 on 200 real sentences) with a stage cache: its argv and checks."""
    root = tmp_path_factory.mktemp("pipeline")
    config = _config(root / "p.yaml", tiny_model_dir, _csv(root / "d.csv", movie_data))

    def argv(case: Path) -> list[str]:
        return ["run", str(config), "--out", str(case / "run"), "--cache", str(case / "cache")]

    return {"root": root, "argv": argv, "again": lambda case: [*argv(case), "--resume"], "dir": "run",
            "check": lambda case: {"kind": "run", "stages": STAGE_NAMES},
            "digest": ["run/final/model.onnx",
                       *(f"run/stages/{i:02d}-{n}/predictions.json" for i, n in enumerate(["baseline", *STAGE_NAMES]))]}


def _reference(inject, workload: dict) -> dict:
    case = workload["root"] / "undisturbed"
    [answer] = inject({"root": str(case), "steps": [{"argv": workload["argv"](case)}], "digest": workload["digest"],
                       "copy": [[str(a), str(case / b)] for a, b in workload.get("copy", [])],
                       "check": {**workload["check"](case), "dir": str(case / workload["dir"])}})
    assert answer["codes"] == [0] and answer["problems"] == [], answer
    assert all(answer["digest"].values()), answer["digest"]
    return {**answer, "root": case}


@pytest.fixture(scope="module")
def undisturbed(inject, pipeline) -> dict:
    return _reference(inject, pipeline)


def test_every_write_of_a_run_failed_or_killed_leaves_a_run_dir_that_resumes_to_the_undisturbed_result(
        inject, pipeline, undisturbed):
    assert len(undisturbed["writes"]) > 100  # the run's own files, its stage cache's, final/'s
    found = faulted(inject, pipeline, undisturbed)
    assert not found, "\n".join(found)


def test_every_write_of_a_rerun_over_an_earlier_run_failed_or_killed_never_mixes_the_two(inject, pipeline,
                                                                                       undisturbed):
    earlier = undisturbed["root"] / "run"
    rerun = {**pipeline, "root": pipeline["root"] / "rerun", "copy": [(earlier, "run")],
             "argv": lambda case: ["run", *pipeline["argv"](case)[1:4]],
             "again": lambda case: ["run", *pipeline["argv"](case)[1:4], "--resume"]}
    found = faulted(inject, rerun, _reference(inject, rerun), share=0.5)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("over", ["new", "earlier"])
def test_every_write_of_a_bundle_failed_or_killed_leaves_the_out_absent_as_it_was_or_whole(inject, undisturbed,
                                                                                           tmp_path, over):
    run = undisturbed["root"] / "run"
    overwrite = ["--overwrite"] if over == "earlier" else []
    bundle = {"root": tmp_path, "dir": "b", "digest": ["b/model.onnx", "b/tokenizer.json", "b/config.json"],
              "argv": lambda case: ["bundle", str(run), "--out", str(case / "b"), *overwrite],
              "again": lambda case: ["bundle", str(run), "--out", str(case / "b"), *overwrite],
              "copy": [(run / "final", "b")] if overwrite else [],
              "check": lambda case: {"kind": "out", "before": _digest(run / "final") if overwrite else None}}
    found = faulted(inject, bundle, _reference(inject, bundle))
    assert not found, "\n".join(found)


def _digest(folder: Path) -> dict:
    from tests.inject import digest

    return digest(folder)


def test_every_write_of_a_one_trial_search_failed_or_killed_leaves_a_search_that_resumes(inject, tmp_path,
                                                                                         tiny_model_dir, movie_data):
    from tests.test_search import SPACE, search_config

    config = search_config(tmp_path / "s.yaml", tiny_model_dir, _csv(tmp_path / "d.csv", movie_data),
                           space={**SPACE, "heads_keep": [1.0], "quantization": ["int8-dynamic"]})

    def argv(case: Path) -> list[str]:
        return ["search", str(config), "--out", str(case / "out"), "--trials", "1"]

    search = {"root": tmp_path, "argv": argv, "again": lambda case: [*argv(case), "--resume"], "dir": "out",
              "check": lambda case: {"kind": "search"}, "digest": []}  # which point it tries is the timing's say
    found = faulted(inject, search, _reference(inject, search), share=0.25)
    assert not found, "\n".join(found)
