"""The latency harness: warm-up, N timed runs, p50/p90/p99/mean. One loop for ONNX Runtime and torch runners so
ratios are like for like. Inputs are real tokens: fixed batch x sequence shapes filled from real sentences, and the
real test sentences one at a time at their natural lengths (no padding to the maximum)."""

import platform
import time
from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edgepress.errors import ConfigError
from edgepress.runtime.tokenize import encode

Feeds = dict[str, np.ndarray]


class LatencyConfig(BaseModel):
    """The `runtime.latency` section: the fixed shape, warm-up and timed runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_size: int = Field(1, ge=1, le=4096)
    sequence_length: int = Field(128, ge=2, le=8192)
    warmup: int = Field(20, ge=0, le=100_000)
    runs: int = Field(200, ge=1, le=1_000_000)


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


def summarize(seconds: list[float]) -> dict:
    ms = np.asarray(seconds) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p90_ms": float(np.percentile(ms, 90)),
            "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean()), "runs": int(len(ms))}


def time_runner(run: Callable[[Feeds], object], feeds: list[Feeds], warmup: int, runs: int) -> dict:
    """Time `run` over `feeds` cyclically: `warmup` untimed calls, then `runs` timed ones."""
    for i in range(warmup):
        run(feeds[i % len(feeds)])
    seconds = []
    for i in range(runs):
        batch = feeds[i % len(feeds)]
        start = time.perf_counter()
        run(batch)
        seconds.append(time.perf_counter() - start)
    return summarize(seconds)


def fixed_shape_feeds(tokenizer, texts: tuple[str, ...], cfg: LatencyConfig, input_names: tuple[str, ...],
                      position_limit: int) -> Feeds:
    """(batch_size, sequence_length) of real tokens: consecutive sentences concatenated until each row is full."""
    if cfg.sequence_length > position_limit:
        raise ConfigError(f"sequence_length {cfg.sequence_length} is longer than the model's position limit "
                          f"{position_limit}. Fix: ask for at most {position_limit}")
    need = cfg.batch_size * cfg.sequence_length
    stream: list[int] = []
    for text in texts:
        stream.extend(tokenizer.encode(text).ids)  # [CLS] tokens [SEP] of each sentence, untruncated
        if len(stream) >= need:
            break
    if len(stream) < need:
        raise ConfigError(f"the sentences given hold {len(stream)} tokens; {need} are needed for the fixed shape "
                          f"{cfg.batch_size} x {cfg.sequence_length}. Fix: a smaller batch_size or sequence_length")
    ids = np.asarray(stream[:need], dtype=np.int64).reshape(cfg.batch_size, cfg.sequence_length)
    columns = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    return {name: columns[name] for name in input_names}


def natural_feeds(tokenizer, texts: tuple[str, ...], input_names: tuple[str, ...]) -> list[Feeds]:
    """Each sentence alone at its own length (batch 1)."""
    return [encode(tokenizer, [t], input_names) for t in texts]
