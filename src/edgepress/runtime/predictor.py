"""The torch-free predictor: a bundle dir (model.onnx, tokenizer.json, config.json with id2label) classified with
onnxruntime, tokenizers and numpy alone.

This module imports nothing but those three and the standard library: `edgepress bundle` copies it into every bundle
as `predict.py`, so the code a device runs is the code edgepress tests. It holds what a device needs and edgepress
shares: the error tree's base, sessions on checked providers, tokenization, the timing loop.

    python predict.py "a gripping, funny film" "two hours I will not get back"
    python predict.py --file texts.txt --json
    python predict.py --file texts.txt --bench
    python predict.py similar "a film about grief" --corpus texts.txt --top 5   # an embedding model's bundle
    python predict.py "Peter Blackburn flew to Zwolle" --aggregation first --json  # a token classifier's entities
"""

import argparse
import contextlib
import json
import os
import platform
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BUNDLE_FILES = ("model.onnx", "tokenizer.json", "config.json")
MANIFEST = "edgepress.json"
# Beside a graph: the ONNX Runtime optimizers its sessions are opened without. edgepress's optimize stage writes it
# when it left a fusion out because it measured the graph faster without it; ORT would otherwise fuse the same
# pattern again when the session starts (SkipLayerNormFusion does, on int8 graphs), and the choice would be lost.
SESSION_FILE = "ort_session.json"
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# A graph's output names the task it serves: a classifier's logits (batch, labels), a token classifier's (batch,
# sequence, labels), or a sentence embedder's vector (pooled, and normalized where the model normalizes, inside the
# graph)
OUTPUTS = ("logits", "sentence_embedding")
LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
          "all": "ORT_ENABLE_ALL"}
PAD_CANDIDATES = ("[PAD]", "<pad>")
# RoBERTa-style models number positions from pad_token_id + 1: that many rows of the position table are never used
OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert")
Feeds = dict[str, np.ndarray]


class EdgepressError(Exception):
    """Base of every error edgepress raises on purpose. Its message names the fix."""

    exit_code = 1


class ConfigError(EdgepressError):
    """A config or a command-line value is wrong."""

    exit_code = 2


class DataError(EdgepressError):
    """The data cannot be read or does not fit the model."""

    exit_code = 2


class ModelError(EdgepressError):
    """A model directory cannot be loaded."""

    exit_code = 2


class ProviderUnavailable(EdgepressError):
    """An ONNX Runtime execution provider was asked for but is not the one running."""

    exit_code = 2


# --- sessions: a provider asked for and not running is an error, never a silent CPU run (onnxruntime-gpu on a
# machine without a GPU lists CUDA as available, logs an error and falls back to CPU; only
# `session.get_providers()` tells the truth)

def provider_names(names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """ORT provider names for edgepress' short names; an unknown name is a ConfigError naming the choices."""
    unknown = [n for n in names if n not in PROVIDERS]
    if unknown:
        raise ConfigError(f"unknown provider {', '.join(map(repr, unknown))}: choose from {', '.join(PROVIDERS)}")
    return tuple(PROVIDERS[n] for n in names)


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Collect what native code writes to fd 2 (ONNX Runtime logs provider failures there)."""
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", errors="replace")
            lines.extend(line for line in text.splitlines() if line.strip())


def _clean(line: str) -> str:
    """An ORT log line without colour codes, timestamps and source locations."""
    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    line = re.sub(r"^.*\] ", "", line)  # "2026-.. [E:onnxruntime:Default, file.cc:123 Func] message"
    return re.sub(r"^.*FAIL : ", "", line).strip()


def _cuda_reason(logged: list[str]) -> str:
    """Why CUDA is not running: the driver check, then what ONNX Runtime logged."""
    import ctypes

    reasons = []
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        reasons.append("no NVIDIA driver on this machine (libcuda.so.1 cannot be loaded)")
    reasons += [_clean(line) for line in logged if "CUDA" in line or "cuda" in line][:2]
    return " / ".join(reasons) or "ONNX Runtime did not say why (check the CUDA and cuDNN versions it needs)"


def require_providers(asked: tuple[str, ...], in_use: list[str], logged: list[str]) -> None:
    """ProviderUnavailable, with ONNX Runtime's reason, when CUDA was asked for and is not running."""
    if "cuda" in asked and PROVIDERS["cuda"] not in in_use:
        raise ProviderUnavailable(
            f"the CUDA execution provider is not usable: {_cuda_reason(logged)}. ONNX Runtime is running on "
            f"{', '.join(in_use)} instead. Fix: run on a machine with an NVIDIA GPU and onnxruntime-gpu, or measure on "
            f"the CPU (runtime.providers: [cpu] in a config, --provider cpu, or no --device cuda)"
        )


# How worker threads wait, part of what a cached latency was measured with (stagecache.machine_key)
SPINNING = "within a run"


def session_options(threads: int | None, optimization: str = "all", spinning: bool = False):
    """ORT session options: `threads` intra-op threads (one inter-op), the graph optimization level, and whether idle
    worker threads go on spinning after a run returns (faster alone, unfair to whatever runs beside them).

    Within a run the workers always spin between operators, as torch's OpenMP threads do: parked, every operator of
    a short text pays a thread wake-up (all-MiniLM-L6-v2 int8 at natural lengths, 2 threads: 3.20 -> 2.87 ms,
    `benchmarks/spinning.py`). Unless `spinning`, `session.force_spinning_stop` parks them as the run returns: no core
    is taken between calls, from a device's other work or from the next candidate timed side by side."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[optimization])
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    options.add_session_config_entry("session.force_spinning_stop", "0" if spinning else "1")
    return options


def check_io(session, path: Path) -> None:
    """The session must take the encoder inputs edgepress feeds and return `logits` or `sentence_embedding`."""
    inputs = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    problems = []
    if not {"input_ids", "attention_mask"} <= set(inputs) or not set(inputs) <= set(MODEL_INPUTS):
        problems.append(f"inputs are {', '.join(inputs)}; expected input_ids, attention_mask[, token_type_ids]")
    if not set(OUTPUTS) & set(outputs):
        problems.append(f"outputs are {', '.join(outputs)}; expected {' or '.join(OUTPUTS)}")
    if problems:
        raise ModelError(f"{path} is not a text-classifier, token-classifier or sentence-embedding graph: "
                         f"{'; '.join(problems)}. Fix: export a sequence- or token-classification model or a "
                         f"sentence-transformers model with edgepress")


def gives_token_logits(session) -> bool:
    """The graph is a token classifier's: its logits have a row per token, (batch, sequence, labels)."""
    return any(o.name == "logits" and len(o.shape) == 3 for o in session.get_outputs())


def output_name(session) -> str:
    """The graph's task output (`OUTPUTS`): logits, or sentence_embedding (`check_io` made sure it has one)."""
    names = {o.name for o in session.get_outputs()}
    return next(name for name in OUTPUTS if name in names)


def disabled_optimizers(path: Path) -> list[str]:
    """The optimizers `SESSION_FILE` beside the graph at `path` names ([] without one)."""
    side = Path(path).parent / SESSION_FILE
    if not side.is_file():
        return []
    names = json_object(side).get("disabled_optimizers")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ModelError(f"{side}: disabled_optimizers must be a list of ONNX Runtime optimizer names, got "
                         f"{names!r}. Fix: optimize the model again with edgepress, or delete the file")
    return names


def load_session(path: str | Path, providers: tuple[str, ...] = ("cpu",), options=None):
    """An `onnxruntime.InferenceSession` of a classifier graph running on exactly the providers asked for (CPU may be
    added after CUDA by ONNX Runtime for the ops CUDA lacks)."""
    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_pybind11_state import (
        Fail,
        InvalidArgument,
        InvalidGraph,
        InvalidProtobuf,
        NoSuchFile,
    )

    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{path} does not exist. Fix: export the model first (edgepress export stage)")
    with captured_stderr() as logged:
        try:
            session = ort.InferenceSession(str(path), options or session_options(None),
                                           providers=list(provider_names(providers)),
                                           disabled_optimizers=disabled_optimizers(path))
        except (InvalidProtobuf, InvalidGraph, InvalidArgument, NoSuchFile, Fail) as e:  # e.g. an empty file
            raise ModelError(f"{path} is not a loadable ONNX model (truncated or corrupt?): {str(e).strip()[:300]}. "
                             f"Fix: export it again") from e
    require_providers(providers, session.get_providers(), logged)
    check_io(session, path)
    return session


# --- tokenization with the `tokenizers` library alone (what a device has): tokenizer.json + special tokens

def position_limit(config: dict) -> int:
    """The longest token sequence a model's config.json allows."""
    limit = int(config.get("max_position_embeddings", 512))
    if config.get("model_type") in OFFSET_POSITIONS:
        limit -= int(config.get("pad_token_id", 1)) + 1
    return limit


def _pad_token(directory: Path, tokenizer) -> str:
    special = directory / "special_tokens_map.json"
    if special.is_file():
        pad = json.loads(special.read_text(encoding="utf-8")).get("pad_token")
        if pad:
            return pad["content"] if isinstance(pad, dict) else pad
    for candidate in PAD_CANDIDATES:
        if tokenizer.token_to_id(candidate) is not None:
            return candidate
    raise ModelError(f"{directory}: the tokenizer has no padding token. Fix: set pad_token and save it again")


def load_tokenizer(directory: str | Path, max_length: int):
    """A `tokenizers.Tokenizer` from DIR/tokenizer.json, truncating to `max_length`, padding to the longest."""
    from tokenizers import Tokenizer

    directory = Path(directory)
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise ModelError(
            f"{directory} has no tokenizer.json. Fix: save a fast tokenizer into it "
            f"(AutoTokenizer.from_pretrained(MODEL).save_pretrained(DIR))"
        )
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for a file it cannot parse
        raise ModelError(f"{path} is not a readable tokenizer ({e}). Fix: save the tokenizer again "
                         f"(AutoTokenizer.from_pretrained(MODEL).save_pretrained(DIR))") from None
    pad = _pad_token(directory, tokenizer)
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id(pad), pad_token=pad)
    return tokenizer


def encode(tokenizer, texts: list[str] | tuple[str, ...], input_names: tuple[str, ...]) -> Feeds:
    """Model feeds (batch, seq) int64 for `texts`, only the inputs the model takes."""
    return encoding_feeds(tokenizer.encode_batch(list(texts)), input_names)


def encoding_feeds(encodings: list, input_names: tuple[str, ...]) -> Feeds:
    """Model feeds (batch, seq) int64 of tokenizers' `encodings` (of one length), only the inputs the model takes."""
    columns = {
        "input_ids": [e.ids for e in encodings],
        "attention_mask": [e.attention_mask for e in encodings],
        "token_type_ids": [e.type_ids for e in encodings],
    }
    return {name: np.asarray(columns[name], dtype=np.int64) for name in input_names}


# --- timing: one loop for every runner, so that ratios are like for like

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


def fixed_shape_feeds(tokenizer, texts: tuple[str, ...], batch_size: int, sequence_length: int,
                      input_names: tuple[str, ...], limit: int, what: str = "the sentences given") -> Feeds:
    """(batch_size, sequence_length) of real tokens: consecutive sentences concatenated until each row is full;
    `what` names the texts in the error when they hold too few."""
    if sequence_length > limit:
        raise ConfigError(f"sequence_length {sequence_length} is longer than the model's position limit {limit}. "
                          f"Fix: ask for at most {limit}")
    need = batch_size * sequence_length
    stream: list[int] = []
    for text in texts:
        stream.extend(tokenizer.encode(text).ids)  # [CLS] tokens [SEP] of each sentence, untruncated
        if len(stream) >= need:
            break
    if len(stream) < need:
        raise ConfigError(f"{what} hold {len(stream)} tokens; {need} are needed for the fixed shape "
                          f"{batch_size} x {sequence_length}. Fix: a smaller batch_size or sequence_length, or more "
                          f"sentences")
    ids = np.asarray(stream[:need], dtype=np.int64).reshape(batch_size, sequence_length)
    columns = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    return {name: columns[name] for name in input_names}


NATURAL_SENTENCES = 200  # natural-length timing: this many sentences, one a call


def natural_feeds(tokenizer, texts: tuple[str, ...], input_names: tuple[str, ...]) -> list[Feeds]:
    """Each sentence alone at its own length (batch 1)."""
    return [encode(tokenizer, [t], input_names) for t in texts]


def first_subword_rows(word_ids: list[int | None], rows: np.ndarray, n_words: int, fill) -> np.ndarray:
    """Per word, the row of `rows` (one per sub-word position) at the word's first sub-word: where a token
    classifier's tag for the word is read, as transformers' recipes label it; `fill` for a word truncated away (no
    sub-word left)."""
    out = np.full((n_words, *rows.shape[1:]), fill, dtype=rows.dtype)
    seen = set()
    for position, word in enumerate(word_ids):
        if word is not None and word not in seen:
            out[word] = rows[position]
            seen.add(word)
    return out


# --- entities in raw text: transformers' token-classification pipeline (its `aggregation_strategy`), with the
# tokenizers library alone

AGGREGATIONS = ("simple", "first", "max", "average", "none")  # as transformers' pipeline names them


def _sub_tokens(tokenizer, encoding, text: str, scores: np.ndarray) -> list[dict]:
    """The text's tokens (special ones left out): the token, its tag probabilities, its characters, and whether it
    continues the word before it (a WordPiece tokenizer knows: its token is longer than the text it covers, "##ing";
    another guesses from the text: no space before it)."""
    prefix = getattr(tokenizer.model, "continuing_subword_prefix", None)
    unknown = getattr(tokenizer.model, "unk_token", None)
    pieces = []
    for index, (token, (start, end), special) in enumerate(zip(encoding.tokens, encoding.offsets,
                                                               encoding.special_tokens_mask, strict=True)):
        if special:
            continue
        covered = text[start:end]
        subword = len(token) != len(covered) if prefix else start > 0 and " " not in text[start - 1:start + 1]
        if token == unknown:
            token, subword = covered, False
        pieces.append({"word": token, "scores": scores[index], "start": start, "end": end, "subword": subword,
                       "index": index})
    return pieces


def _tagged(pieces: list[dict], id2label: dict[int, str]) -> dict:
    """One tag for `pieces` read with the scores of one of them (`aggregate_word`)."""
    best = int(pieces[0]["scores"].argmax())
    return {"entity": id2label[best], "score": float(pieces[0]["scores"][best]), "words": [p["word"] for p in pieces],
            "start": pieces[0]["start"], "end": pieces[-1]["end"]}


def _words(pieces: list[dict], aggregation: str, id2label: dict[int, str], decode) -> list[dict]:
    """A tag per word (`first`: its first token's, `max`: the most confident token's, `average`: the mean of its
    tokens' probabilities; the word its tokens decoded), or per token (`simple`)."""
    if aggregation == "simple":
        return [_tagged([p], id2label) for p in pieces]
    words: list[list[dict]] = []
    for piece in pieces:
        if words and piece["subword"]:
            words[-1].append(piece)
        else:
            words.append([piece])
    tagged = []
    for word in words:
        if aggregation == "max":
            chosen = [max(word, key=lambda p: p["scores"].max())]
        elif aggregation == "average":
            chosen = [{**word[0], "scores": np.nanmean(np.stack([p["scores"] for p in word]), axis=0)}]
        else:
            chosen = word[:1]
        tagged.append({**_tagged(chosen, id2label), "words": [decode([p["word"] for p in word])],
                       "start": word[0]["start"], "end": word[-1]["end"]})
    return tagged


def _split_tag(tag: str) -> tuple[str, str]:
    """("B" or "I", the entity type) of a tag: B-/I-PER, or a tag without a prefix read as a continuation."""
    return (tag[0], tag[2:]) if tag[:2] in ("B-", "I-") else ("I", tag)


def group_entities(tagged: list[dict], decode) -> list[dict]:
    """Adjacent tags of one type joined into an entity (a B- tag starts a new one), with the mean of their scores and
    their tokens decoded into text (`decode`); O left out."""
    groups: list[list[dict]] = []
    for item in tagged:
        prefix, kind = _split_tag(item["entity"])
        if groups and prefix != "B" and _split_tag(groups[-1][-1]["entity"])[1] == kind:
            groups[-1].append(item)
        else:
            groups.append([item])
    entities = []
    for group in groups:
        kind = group[0]["entity"].split("-", 1)[-1]
        if kind != "O":
            entities.append({"entity_group": kind, "score": float(np.nanmean([g["score"] for g in group])),
                             "word": decode([w for g in group for w in g["words"]]), "start": group[0]["start"],
                             "end": group[-1]["end"]})
    return entities


# --- the predictor

@dataclass(frozen=True)
class Prediction:
    """One text's label, its probability, and the probability of every label."""

    text: str
    label: str
    score: float
    scores: dict[str, float]


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def json_object(path: Path) -> dict:
    """A JSON file that must hold an object; anything else is a ModelError naming the fix."""
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path} is not valid JSON ({e}). Fix: export or bundle the model again") from None
    if not isinstance(value, dict):
        raise ModelError(f"{path} holds a JSON {type(value).__name__}, not an object. Fix: export the model again")
    return value


def _check_texts(texts: list[str] | tuple[str, ...]) -> None:
    """Empty text is refused, as the data loader refuses it: a label for nothing would be a guess dressed as a
    prediction. Text that is not valid Unicode (bytes a shell could not decode) is refused too."""
    empty = [i + 1 for i, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
    if empty:
        raise DataError(f"text {', '.join(map(str, empty[:5]))} of {len(texts)} is empty. Fix: give non-empty "
                        f"text to classify")
    for i, text in enumerate(texts, start=1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise DataError(f"text {i} of {len(texts)} is not valid UTF-8. Fix: pass text in the UTF-8 "
                            f"encoding") from None


def model_file(manifest: dict) -> str:
    """The graph's path in a bundle: model.onnx, or where the manifest says (a web bundle keeps it in onnx/)."""
    return manifest.get("model_file", BUNDLE_FILES[0])


def read_bundle(bundle: Path) -> tuple[dict, dict]:
    """(config.json, edgepress.json or {}) of a bundle or exported model dir."""
    manifest_path = bundle / MANIFEST
    manifest = json_object(manifest_path) if manifest_path.is_file() else {}
    missing = [name for name in (model_file(manifest), *BUNDLE_FILES[1:]) if not (bundle / name).is_file()]
    if missing:
        raise ModelError(f"{bundle} is not a model bundle: missing {', '.join(missing)}. Fix: point at the final/ "
                         f"dir of a run, a dir written by `edgepress bundle`, or one written by `edgepress export`")
    return json_object(bundle / "config.json"), manifest


class Predictor:
    """Classify texts with a bundle. Texts longer than `max_length` tokens are truncated to it. The texts of one
    call are padded to the longest: with an int8 graph, whose activations are quantized with ranges taken over the
    whole batch, a text's result then depends on its neighbours; classify one text per call where it must not
    (edgepress's evaluation and `predict.py` do)."""

    def __init__(self, bundle_dir: str | Path, providers: tuple[str, ...] = ("cpu",), threads: int | None = None,
                 max_length: int | None = None):
        self.bundle = Path(bundle_dir)
        config, manifest = read_bundle(self.bundle)
        self.limit = position_limit(config)
        self.max_length = max_length or int(manifest.get("max_length", self.limit))
        if self.max_length > self.limit:
            raise ConfigError(f"max_length {self.max_length} is longer than the model's position limit "
                              f"{self.limit}. Fix: use at most {self.limit}")
        self.session = load_session(self.bundle / model_file(manifest), providers, session_options(threads))
        self.output = output_name(self.session)
        self.tokens = gives_token_logits(self.session)
        if self.output == "logits" and "id2label" not in config:
            raise ModelError(f"{self.bundle}/config.json has no id2label. Fix: export it again with `edgepress "
                             f"export` (which writes the names), or add id2label to config.json")
        self.id2label = {int(k): v for k, v in config.get("id2label", {}).items()}
        self.tokenizer = load_tokenizer(self.bundle, self.max_length)
        self.input_names = tuple(i.name for i in self.session.get_inputs())

    def outputs(self, texts: list[str] | tuple[str, ...]) -> np.ndarray:
        """(len(texts), width) float32: the graph's output (logits, or sentence embeddings) for `texts` padded to
        the longest text of the call; empty text is refused."""
        if not texts:
            width = next(o.shape[-1] for o in self.session.get_outputs() if o.name == self.output)
            return np.zeros((0, width if isinstance(width, int) else 0), dtype=np.float32)
        _check_texts(texts)
        return self.session.run([self.output], encode(self.tokenizer, texts, self.input_names))[0]

    def logits(self, texts: list[str] | tuple[str, ...]) -> np.ndarray:
        """(len(texts), num_labels) float32 logits of a classifier bundle (`outputs`)."""
        if self.output != "logits":
            raise ModelError(f"{self.bundle} is a sentence-embedding model: it gives vectors, not labels. Fix: "
                             f"ask it for embeddings (Predictor.embed)")
        if self.tokens:
            raise ModelError(f"{self.bundle} is a token classifier: it tags each word, it gives no label for a "
                             f"text. Fix: ask it for each word's tag (Predictor.word_logits)")
        return self.outputs(texts)

    def entities(self, text: str, aggregation: str = "simple") -> list[dict]:
        """The entities a token classifier finds in raw `text`, as transformers' token-classification pipeline gives
        them: {"entity_group", "score", "word", "start", "end"} (the text's characters start:end), its tags read per
        token (`simple`) or per word (`first`, `max`, `average`), adjacent tags of one type joined; `none`: each
        token's own tag but O, {"entity", "score", "index", "word", "start", "end"}."""
        if not self.tokens:
            raise ModelError(f"{self.bundle} gives one result per text, not entities. Fix: find entities with a "
                             f"token-classification model's bundle")
        if aggregation not in AGGREGATIONS:
            raise ConfigError(f"unknown aggregation {aggregation!r}. Fix: one of {', '.join(AGGREGATIONS)}")
        _check_texts([text])
        encoding = self.tokenizer.encode(text)
        logits = self.session.run([self.output], encoding_feeds([encoding], self.input_names))[0][0]
        pieces = _sub_tokens(self.tokenizer, encoding, text, _softmax(logits.astype(np.float64)))
        if aggregation == "none":  # each token's tag: {entity, score, index (its position), word, start, end}
            tagged = [{**_tagged([p], self.id2label), "index": p["index"], "word": p["word"]} for p in pieces]
            return [{k: t[k] for k in ("entity", "score", "index", "word", "start", "end")} for t in tagged
                    if t["entity"] != "O"]
        decoder = self.tokenizer.decoder
        decode = decoder.decode if decoder is not None else " ".join
        return group_entities(_words(pieces, aggregation, self.id2label, decode), decode)

    def word_logits(self, words: list[str] | tuple[str, ...]) -> np.ndarray:
        """(len(words), num_labels) float32 logits of a token classifier for one sentence of pre-split `words`, each
        read at the word's first sub-word (`first_subword_rows`); a word cut off by max_length gets NaN."""
        if not self.tokens:
            raise ModelError(f"{self.bundle} gives one result per text, not a tag per word. Fix: tag words with a "
                             f"token-classification model's bundle")
        _check_texts(words)
        encoding = self.tokenizer.encode(list(words), is_pretokenized=True)
        logits = self.session.run([self.output], encoding_feeds([encoding], self.input_names))[0][0]  # (seq, labels)
        return first_subword_rows(encoding.word_ids, logits, len(words), np.nan)

    def embed(self, texts: list[str] | tuple[str, ...]) -> np.ndarray:
        """(len(texts), dim) float32 sentence embeddings of an embedding bundle, one text per call: each vector
        independent of the other texts (an int8 graph's activation ranges would otherwise span the batch)."""
        if self.output != "sentence_embedding":
            raise ModelError(f"{self.bundle} is a classifier: it gives labels, not sentence embeddings. Fix: bundle "
                             f"a sentence-transformers model to get embeddings")
        _check_texts(texts)
        return np.concatenate([self.outputs([text]) for text in texts]) if texts else self.outputs(texts)

    def predict(self, texts: list[str] | tuple[str, ...]) -> list[Prediction]:
        """The most probable label of each text, with the softmax probabilities."""
        probs = _softmax(self.logits(texts).astype(np.float64))
        return [
            Prediction(text, self.id2label[int(p.argmax())], float(p.max()),
                       {self.id2label[i]: float(v) for i, v in enumerate(p)})
            for text, p in zip(texts, probs, strict=True)
        ]

    def predict_each(self, texts: list[str] | tuple[str, ...]) -> list[Prediction]:
        """`predict`, one text per call: each result independent of the other texts (every text is checked first)."""
        _check_texts(texts)
        return [self.predict([text])[0] for text in texts]

    def bench(self, texts: tuple[str, ...], runs: int = 100, warmup: int = 10, sequence_length: int = 128) -> dict:
        """Latency here: batch 1 × `sequence_length` real tokens (the texts' tokens end to end), and each text alone
        at its natural length; p50/p90/p99 in ms."""
        _check_texts(texts)
        length = min(sequence_length, self.max_length)
        stream = texts * (1 + length // max(1, sum(len(self.tokenizer.encode(t).ids) for t in texts)))
        fixed = fixed_shape_feeds(self.tokenizer, stream, 1, length, self.input_names, self.limit)
        natural = natural_feeds(self.tokenizer, texts, self.input_names)

        def run(feeds: Feeds) -> object:
            return self.session.run([self.output], feeds)

        return {"fixed": {**time_runner(run, [fixed], warmup, runs), "batch_size": 1, "sequence_length": length},
                "natural": {**time_runner(run, natural, warmup, max(runs, len(natural))),
                            "mean_tokens": float(np.mean([f["input_ids"].shape[1] for f in natural]))},
                "providers_used": self.session.get_providers(), "cpu": cpu_model(), "machine": platform.machine()}


# --- `python predict.py`: the bundle's own command line

def _lines(file: str) -> list[str]:
    """The non-blank lines of a UTF-8 text file (blank lines, a trailing newline, are not texts)."""
    try:
        lines = Path(file).read_bytes().decode("utf-8").splitlines()
    except OSError as e:
        raise DataError(f"cannot read {file}: {e.strerror}. Fix: pass a readable text file, one text a line") from None
    except UnicodeDecodeError:
        raise DataError(f"{file} is not UTF-8 text. Fix: save it in the UTF-8 encoding") from None
    return [line for line in lines if line.strip()]


def _texts(args: argparse.Namespace) -> tuple[str, ...]:
    texts = list(args.texts) + (_lines(args.file) if args.file is not None else [])
    if not texts:
        raise DataError("no text to classify. Fix: pass texts as arguments or --file FILE (one text a line)")
    return tuple(texts)


def _parser() -> argparse.ArgumentParser:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(prog="predict.py", description="Classify texts with an edgepress bundle, or "
                                     "embed them with an embedding model's bundle (one JSON object a text); "
                                     "onnxruntime, tokenizers and numpy only.")
    parser.add_argument("texts", nargs="*", help="texts to classify (or embed)")
    parser.add_argument("--file", help="a UTF-8 file of texts, one a line (blank lines skipped); each classified "
                        "alone")
    parser.add_argument("--bundle", type=Path, default=here, help="the bundle dir (default: this file's dir)")
    parser.add_argument("--json", action="store_true", help="one JSON object per text (per result with --bench)")
    parser.add_argument("--bench", action="store_true", help="time the model on the texts: p50/p90/p99 ms at "
                        "batch 1 x 128 tokens and at each text's natural length")
    parser.add_argument("--runs", type=int, default=100, help="timed runs per shape with --bench (default 100)")
    parser.add_argument("--aggregation", choices=AGGREGATIONS, default="simple", help="a token classifier's "
                        "entities: each token's tag (simple) or each word's, read at its first token, its most "
                        "confident one, or their average (first, max, average), as transformers' pipeline does; "
                        "none: every token's tag")
    parser.add_argument("--provider", choices=tuple(PROVIDERS), default="cpu", help="execution provider")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: ONNX Runtime's)")
    return parser


def _print_bench(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
        return
    for shape in ("fixed", "natural"):
        r = result[shape]
        what = f"batch 1 x {r['sequence_length']} tokens" if shape == "fixed" else \
            f"natural lengths ({r['mean_tokens']:.1f} tokens mean)"
        print(f"{what}: p50 {r['p50_ms']:.2f} ms, p90 {r['p90_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms "
              f"({r['runs']} runs)")
    print(f"{result['cpu']} ({result['machine']}), {', '.join(result['providers_used'])}")


def similar(predictor: Predictor, queries: list[str] | tuple[str, ...], corpus: tuple[str, ...], top: int
            ) -> list[list[tuple[float, str]]]:
    """For each query, the `top` texts of `corpus` nearest it by the cosine of their vectors, nearest first (every
    text embedded alone, as everywhere; the corpus once)."""
    if predictor.output != "sentence_embedding":
        raise ModelError(f"{predictor.bundle} is a classifier: `similar` needs an embedding model's bundle. Fix: "
                         f"classify with `predict.py TEXT`, or bundle a sentence-transformers model")
    vectors = predictor.embed(corpus)
    found = []
    for wanted in predictor.embed(queries):
        norms = np.linalg.norm(vectors, axis=1) * np.linalg.norm(wanted)
        scores = np.divide(vectors @ wanted, norms, out=np.zeros(len(corpus)), where=norms > 0)
        found.append([(float(scores[i]), corpus[i]) for i in np.argsort(-scores, kind="stable")[:top]])
    return found


def read_corpus(file: str) -> tuple[str, ...]:
    """The texts of a corpus file, one a line; an empty one is a DataError."""
    corpus = tuple(_lines(file))
    if not corpus:
        raise DataError(f"{file} holds no text. Fix: one text a line")
    return corpus


def similar_line(query: str, rank: int, score: float, text: str, as_json: bool) -> str:
    return json.dumps({"query": query, "rank": rank, "score": score, "text": text}) if as_json else \
        f"{score:.4f}\t{text}"


def _similar_parser() -> argparse.ArgumentParser:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(prog="predict.py similar", description="The texts of a corpus nearest a query, "
                                     "by the cosine of an embedding model's vectors.")
    parser.add_argument("query", help="the text to search for")
    parser.add_argument("--corpus", required=True, help="a UTF-8 file of texts, one a line (blank lines skipped)")
    parser.add_argument("--top", type=int, default=10, help="how many to show (default 10)")
    parser.add_argument("--json", action="store_true", help="one JSON object per result")
    parser.add_argument("--bundle", type=Path, default=here, help="the bundle dir (default: this file's dir)")
    parser.add_argument("--aggregation", choices=AGGREGATIONS, default="simple", help="a token classifier's "
                        "entities: each token's tag (simple) or each word's, read at its first token, its most "
                        "confident one, or their average (first, max, average), as transformers' pipeline does; "
                        "none: every token's tag")
    parser.add_argument("--provider", choices=tuple(PROVIDERS), default="cpu", help="execution provider")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: ONNX Runtime's)")
    return parser


def _main_similar(argv: list[str]) -> int:
    args = _similar_parser().parse_args(argv)
    try:
        if args.top < 1 or (args.threads is not None and args.threads < 1):
            raise ConfigError("--top and --threads must be at least 1. Fix: pass a positive number")
        corpus = read_corpus(args.corpus)
        predictor = Predictor(args.bundle, providers=(args.provider,), threads=args.threads)
        for rank, (score, text) in enumerate(similar(predictor, [args.query], corpus, args.top)[0], start=1):
            print(similar_line(args.query, rank, score, text, args.json))
    except EdgepressError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


def main(argv: list[str] | None = None) -> int:
    """Classify or embed (or time) texts, or (`similar`) search a corpus; exit 2 with the error's fix on bad
    input."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["similar"]:
        return _main_similar(argv[1:])
    args = _parser().parse_args(argv)
    try:
        if args.runs < 1 or (args.threads is not None and args.threads < 1):
            raise ConfigError("--runs and --threads must be at least 1. Fix: pass a positive number")
        texts = _texts(args)
        predictor = Predictor(args.bundle, providers=(args.provider,), threads=args.threads)
        if args.bench:
            _print_bench(predictor.bench(texts, runs=args.runs), args.json)
            return 0
        if predictor.output == "sentence_embedding":
            _print_embeddings(texts, predictor.embed(texts))
        elif predictor.tokens:
            for text in texts:
                print("\n".join(entity_lines(text, predictor.entities(text, args.aggregation), args.json)))
        else:
            _print_predictions(predictor.predict_each(texts), args.json)
    except EdgepressError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


def embedding_json(text: str, vector: np.ndarray) -> str:
    """A text's vector as one JSON object (with or without --json: a vector is for programs to read)."""
    return json.dumps({"text": text, "embedding": [round(float(v), 7) for v in vector]})


def _print_embeddings(texts: tuple[str, ...], vectors: np.ndarray) -> None:
    for text, vector in zip(texts, vectors, strict=True):
        print(embedding_json(text, vector))


def entity_lines(text: str, entities: list[dict], as_json: bool) -> list[str]:
    """How a token classifier's entities in `text` are printed: one JSON object (`as_json`), else the text and a line
    an entity (type, score, characters, the text they cover)."""
    if as_json:
        return [json.dumps({"text": text, "entities": entities})]
    return [text, *(f"  {e.get('entity_group', e.get('entity'))}\t{e['score']:.3f}\t{e['start']}-{e['end']}\t"
                    f"{text[e['start']:e['end']]}" for e in entities)]


def _print_predictions(predictions: list[Prediction], as_json: bool) -> None:
    for p in predictions:
        print(json.dumps({"text": p.text, "label": p.label, "score": p.score, "scores": p.scores})
              if as_json else f"{p.label}\t{p.score:.3f}\t{p.text}")


if __name__ == "__main__":
    sys.exit(main())
