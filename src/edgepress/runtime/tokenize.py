"""Tokenization with the `tokenizers` library alone (what a device has): tokenizer.json + special tokens."""

import json
from pathlib import Path

import numpy as np

from edgepress.errors import ModelError

PAD_CANDIDATES = ("[PAD]", "<pad>")
# RoBERTa-style models number positions from pad_token_id + 1: that many rows of the position table are never used
OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert")


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


def encode(tokenizer, texts: list[str] | tuple[str, ...], input_names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Model feeds (batch, seq) int64 for `texts`, only the inputs the model takes."""
    encodings = tokenizer.encode_batch(list(texts))
    columns = {
        "input_ids": [e.ids for e in encodings],
        "attention_mask": [e.attention_mask for e in encodings],
        "token_type_ids": [e.type_ids for e in encodings],
    }
    return {name: np.asarray(columns[name], dtype=np.int64) for name in input_names}
