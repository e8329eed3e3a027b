"""Tokenization with the `tokenizers` library alone (what a device has: tokenizer.json and its special tokens), and
the model feeds made from it: a call's texts, a fixed timing shape of real tokens, each text at its natural length."""

from pathlib import Path

import numpy as np

from .bundle import json_object, whole_field
from .errors import ConfigError, ModelError, access_denied

PAD_CANDIDATES = ("[PAD]", "<pad>")
# RoBERTa-style models number positions from pad_token_id + 1 (MPNet from 2: its padding_idx is 1 whatever its
# config says), counting the tokens that are not that id: that many rows of the position table are never used
OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert")
FIXED_POSITION_PAD = {"mpnet": 1}
Feeds = dict[str, np.ndarray]


def position_pad(config: dict) -> int | None:
    """The token id a model's positions count from (RoBERTa-style: they start at it + 1 and skip it), or None where
    positions are simply 0, 1, 2, ..."""
    kind = config.get("model_type")
    if not isinstance(kind, str | None):
        raise ModelError(f"config.json: model_type must be text, e.g. \"bert\"; got {kind!r}. Fix: restore the "
                         f"config.json saved with the model")
    if kind in OFFSET_POSITIONS:
        return whole_field(config, "pad_token_id", 1, 0)
    return FIXED_POSITION_PAD.get(kind)


def position_limit(config: dict) -> int:
    """The longest token sequence a model's config.json allows (at least one token: a config.json that allows none
    is a ModelError)."""
    pad = position_pad(config)
    offset = 0 if pad is None else pad + 1
    return whole_field(config, "max_position_embeddings", 512, offset + 1) - offset


def _pad_token(directory: Path, tokenizer) -> str:
    special = directory / "special_tokens_map.json"
    if special.is_file():
        pad = json_object(special, "Fix: bundle the model again").get("pad_token")
        if isinstance(pad, dict):
            pad = pad.get("content")
        if pad and isinstance(pad, str):
            return pad
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
    try:  # read here, not by tokenizers: the system's refusal keeps its name
        tokenizer = Tokenizer.from_str(path.read_bytes().decode("utf-8"))
    except PermissionError as e:
        raise access_denied(e) from None
    except Exception as e:  # tokenizers raises a bare Exception for a file it cannot parse
        raise ModelError(f"{path} is not a readable tokenizer ({e}). Fix: save the tokenizer again "
                         f"(AutoTokenizer.from_pretrained(MODEL).save_pretrained(DIR))") from None
    pad = _pad_token(directory, tokenizer)
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id(pad), pad_token=pad)
    return tokenizer


def bundle_tokenizer(directory: str | Path, limit: int, max_length: int | None):
    """The tokenizer in `directory` cut where a bundle reads texts: at `max_length` (a run's data.max_length, a
    bundle's manifest), never past the model's position `limit` (all of it when `max_length` is None)."""
    cut = min(limit, max_length) if isinstance(max_length, int) and max_length > 0 else limit
    return load_tokenizer(directory, cut)


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
