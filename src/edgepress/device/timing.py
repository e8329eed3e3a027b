"""The timing loop: one for every runner (torch, ONNX Runtime, a bundle), so that ratios are like for like; and
what the CPU is."""

import platform
import time
from collections.abc import Callable, Hashable
from typing import TypeVar

import numpy as np

from .feeds import Feeds

ROUNDS = 3  # rounds of a side-by-side timing (`interleaved`)
Key, Result = TypeVar("Key", bound=Hashable), TypeVar("Result")


def _cpuinfo(field: str) -> str | None:
    """The first `field` line of /proc/cpuinfo (Linux), None elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """The CPU's marketing name (Linux), else what the platform module knows."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    """The CPU's feature flags (avx2, avx512_vnni, amx_int8, ...) on Linux; empty elsewhere."""
    return set((_cpuinfo("flags") or "").split())


def isa_flags() -> list[str]:
    """The flags that say what a benchmark's figures were computed with: the vector, matrix (AMX) and dot-product
    (VNNI) instruction sets, bf16's among them."""
    return sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma")) or "vnni" in f)


def summarize(seconds: list[float]) -> dict:
    ms = np.asarray(seconds) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p90_ms": float(np.percentile(ms, 90)),
            "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean()), "runs": int(len(ms))}


def seconds_of(run: Callable[[Feeds], object], feeds: list[Feeds], warmup: int, runs: int) -> list[float]:
    """Seconds of each of `runs` timed calls of `run` over `feeds` cyclically, after `warmup` untimed ones."""
    for i in range(warmup):
        run(feeds[i % len(feeds)])
    seconds = []
    for i in range(runs):
        batch = feeds[i % len(feeds)]
        start = time.perf_counter()
        run(batch)
        seconds.append(time.perf_counter() - start)
    return seconds


def time_runner(run: Callable[[Feeds], object], feeds: list[Feeds], warmup: int, runs: int) -> dict:
    """p50/p90/p99/mean of `seconds_of`."""
    return summarize(seconds_of(run, feeds, warmup, runs))


def time_natural(run: Callable[[Feeds], object], feeds: list[Feeds], warmup: int, runs: int) -> dict:
    """time_runner over natural-length feeds (one sentence each): every sentence timed at least once."""
    return time_runner(run, feeds, min(warmup, len(feeds)), max(runs, len(feeds)))


def interleaved(measures: dict[Key, Callable[[int], Result]], rounds: int = ROUNDS,
                pause_s: float | dict[Key, float] = 0.0) -> dict[Key, list[Result]]:
    """Candidates timed side by side: `rounds` rounds, each calling every measure once in turn with the round's index
    (the machine drifts; interleaving spreads the drift over all of them), then sleeping `pause_s` (one for all, or
    per key: a runner whose threads spin on after it returns idles before the next one's turn); per key, its results
    in round order."""
    pauses = pause_s if isinstance(pause_s, dict) else dict.fromkeys(measures, pause_s)
    results = {key: [] for key in measures}
    for index in range(rounds):
        for key, measure in measures.items():
            results[key].append(measure(index))
            time.sleep(pauses.get(key, 0.0))
    return results
