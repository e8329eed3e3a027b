"""Vocabulary pruning (`vocab`): drop the word-embedding rows of tokens the train split never produces. A BERT-base
vocabulary has 30,522 rows; a small encoder spends most of its parameters there (MiniLM-L6: 11.7M of 22.7M), and a
narrow domain uses a few thousand of them.

Kept: every token the train split tokenizes to (at least `min_count` times, untruncated), every special and added
token, every token the config or the tokenizer names by id (pad, post-processor), every id up to the pad id
(RoBERTa-style models number positions from pad_token_id + 1), and every single-character piece with its `##` form.
Kept tokens keep their relative order; their ids are renumbered 0..n-1, in the model and in tokenizer.json alike.

Why it is exact for a text whose pieces were all kept: WordPiece is greedy longest-match-first, and a pruned
vocabulary is a subset of the original; at every position the original's longest match is still there and nothing
longer appeared, so the same pieces come out and each gets its old embedding row. A word with a dropped piece is
split into smaller kept pieces instead: with every single character kept in both forms (BERT's vocabularies have
both for all 997 of theirs) some piece always matches, so no word becomes [UNK] that was not one before; this is
checked on the validation sentences before anything is written.

The cost: such words are split into pieces the model saw less often in that context, so their meaning may shift;
`test_token_coverage` and `test_sentence_coverage` in the details say how many test texts that touches (the rest
give exactly the unpruned logits). No training is done.
"""

import copy
import json
import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from edgepress.data import DataSplits
from edgepress.errors import ConfigError, ModelError

log = logging.getLogger(__name__)


class VocabConfig(BaseModel):
    """The `vocab` method: keep the tokens seen at least `min_count` times in the train split (plus the special
    tokens and every single character), drop every other word-embedding row."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    min_count: int = Field(1, ge=1, description="times a token must occur in the train split to keep its row")


def wordpiece_spec(tokenizer, src: Path) -> dict:
    """The tokenizer's tokenizer.json as a dict; anything but a WordPiece fast tokenizer is a ConfigError (BPE and
    Unigram build words by merging pieces, so dropping one changes how words that never used it split)."""
    kind = "a slow tokenizer (no tokenizer.json)"
    if getattr(tokenizer, "is_fast", False):
        spec = json.loads(tokenizer.backend_tokenizer.to_str())
        if spec["model"]["type"] == "WordPiece":
            return spec
        kind = f"a {spec['model']['type']} tokenizer"
    raise ConfigError(f"vocab pruning supports WordPiece fast tokenizers (BERT, MiniLM, DistilBERT: a tokenizer.json "
                      f"whose model is WordPiece); {src} has {kind}. Fix: remove the vocab stage for this model (BPE "
                      f"and SentencePiece vocabularies are not pruned yet)")


def check_vocab(model, tokenizer, cfg: VocabConfig) -> None:
    """The pre-run check of `vocab`: the model's tokenizer is one it can prune."""
    wordpiece_spec(tokenizer, Path(model.name_or_path))


def plain_tokenizer(spec: dict, limit: int | None = None):
    """A `tokenizers.Tokenizer` from the tokenizer.json `spec`: unpadded, truncated to `limit` tokens if given."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.no_padding()
    if limit is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(limit)
    return tokenizer


def encode_ids(spec: dict, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text under the tokenizer `spec`: untruncated, no special tokens around it."""
    return [e.ids for e in plain_tokenizer(spec).encode_batch(list(texts), add_special_tokens=False)]


def _processor_tokens(processor: dict | None) -> list[str]:
    """The special tokens a post-processor inserts (it names them by token and by id)."""
    if not processor:
        return []
    if processor["type"] == "TemplateProcessing":
        return [t for special in processor["special_tokens"].values() for t in special["tokens"]]
    if processor["type"] in ("BertProcessing", "RobertaProcessing"):
        return [processor["sep"][0], processor["cls"][0]]
    if processor["type"] == "Sequence":
        return [t for inner in processor["processors"] for t in _processor_tokens(inner)]
    return []  # ByteLevel and the others carry no ids


def _remap_processor(processor: dict | None, ids: dict[str, int]) -> None:
    """Point the post-processor's special tokens at their new `ids`, in place."""
    if not processor:
        return
    if processor["type"] == "TemplateProcessing":
        for special in processor["special_tokens"].values():
            special["ids"] = [ids[t] for t in special["tokens"]]
    elif processor["type"] in ("BertProcessing", "RobertaProcessing"):
        for key in ("sep", "cls"):
            processor[key] = [processor[key][0], ids[processor[key][0]]]
    elif processor["type"] == "Sequence":
        for inner in processor["processors"]:
            _remap_processor(inner, ids)


def tokens_by_id(spec: dict) -> dict[int, str]:
    """Every id the tokenizer can give -> its token: the WordPiece vocabulary and the added tokens."""
    return {i: t for t, i in spec["model"]["vocab"].items()} | {a["id"]: a["content"] for a in spec["added_tokens"]}


def _named_tokens(spec: dict, tokenizer) -> set[str]:
    """Tokens the tokenizer refers to by name: special and added tokens, [UNK], the post-processor's, padding's."""
    padding = [spec["padding"]["pad_token"]] if spec.get("padding") else []
    return ({a["content"] for a in spec["added_tokens"]} | set(tokenizer.all_special_tokens)
            | {spec["model"]["unk_token"], *_processor_tokens(spec.get("post_processor")), *padding})


def config_token_ids(config) -> dict[str, int]:
    """The model config's `*_token_id` fields that hold a vocabulary id (pad, bos, eos, ...)."""
    return {k: v for k, v in config.to_dict().items() if k.endswith("_token_id") and isinstance(v, int)}


def kept_ids(spec: dict, tokenizer, config, counts: Counter, cfg: VocabConfig) -> list[int]:
    """The ids kept, ascending (so [PAD] = 0 and the other low special ids stay where they were)."""
    tokens = tokens_by_id(spec)
    prefix = spec["model"]["continuing_subword_prefix"]
    named = _named_tokens(spec, tokenizer)
    pinned = set(config_token_ids(config).values())
    pad = config.to_dict().get("pad_token_id")
    return sorted(
        i for i, t in tokens.items()
        if counts[i] >= cfg.min_count or t in named or i in pinned or (pad is not None and i <= pad)
        or len(t) == 1 or (t.startswith(prefix) and len(t) == len(prefix) + 1)
    )


def remap_tokenizer_json(spec: dict, kept: list[str]) -> dict:
    """`spec` (a tokenizer.json) over the vocabulary `kept` (tokens in new-id order): the WordPiece vocabulary, the
    added tokens, the post-processor's special-token ids and the padding id all renumbered."""
    spec = copy.deepcopy(spec)
    ids = {token: i for i, token in enumerate(kept)}
    spec["model"]["vocab"] = {t: ids[t] for t in kept if t in spec["model"]["vocab"]}
    for added in spec["added_tokens"]:
        added["id"] = ids[added["content"]]
    _remap_processor(spec.get("post_processor"), ids)
    if spec.get("padding"):
        spec["padding"]["pad_id"] = ids[spec["padding"]["pad_token"]]
    return spec


def shrink_embeddings(model, kept: list[int]) -> None:
    """Keep the word-embedding rows `kept` (in that order), in place: (vocab, hidden) -> (len(kept), hidden);
    config.vocab_size and every `*_token_id` in the config follow."""
    import torch

    new_id = {old: new for new, old in enumerate(kept)}
    old = model.get_input_embeddings()
    padding = new_id[old.padding_idx] if old.padding_idx is not None else None
    weight = old.weight.detach()[torch.tensor(kept)].clone()
    model.set_input_embeddings(torch.nn.Embedding.from_pretrained(weight, freeze=False, padding_idx=padding))
    model.config.vocab_size = len(kept)
    for key, value in config_token_ids(model.config).items():
        setattr(model.config, key, new_id[value])


def coverage(test_ids: list[list[int]], kept: set[int]) -> dict:
    """Shares of the test split's tokens (under the original tokenizer) and of its sentences that were kept whole."""
    total = sum(len(ids) for ids in test_ids)
    tokens = sum(i in kept for ids in test_ids for i in ids) / total if total else None
    sentences = sum(all(i in kept for i in ids) for ids in test_ids) / len(test_ids) if test_ids else None
    return {"test_token_coverage": tokens, "test_sentence_coverage": sentences}


def write_tokenizer(tokenizer, directory: Path, kept: list[str]) -> None:
    """Save `tokenizer` into `directory` (tokenizer_config.json ...), then its tokenizer.json remapped to `kept` and
    the matching vocab.txt (one token a line, line number = id)."""
    tokenizer.save_pretrained(directory)
    path = directory / "tokenizer.json"
    spec = remap_tokenizer_json(json.loads(path.read_text(encoding="utf-8")), kept)
    path.write_text(json.dumps(spec, ensure_ascii=False, indent=2), encoding="utf-8")
    (directory / "vocab.txt").write_text("".join(f"{t}\n" for t in kept), encoding="utf-8")


def check_tokenizers(directory: Path, spec: dict, texts: Sequence[str], limit: int) -> None:
    """The pruned dir's tokenizer, read by transformers and by the torch-free runtime, gives the same ids for
    `texts`; a text whose original pieces (under `spec`) were all kept gets those same pieces, special tokens
    included; no text gets [UNK] that had none. A ModelError lists the texts that fail."""
    from transformers import AutoTokenizer

    from edgepress.runtime.predictor import load_tokenizer

    runtime = load_tokenizer(directory, limit)
    runtime.no_padding()
    ours = runtime.encode_batch(list(texts))
    theirs = AutoTokenizer.from_pretrained(directory)(list(texts), truncation=True, max_length=limit)["input_ids"]
    originals = plain_tokenizer(spec, limit).encode_batch(list(texts))
    vocab, unk = runtime.get_vocab(with_added_tokens=True), spec["model"]["unk_token"]
    problems = []
    for k, (before, after, ids) in enumerate(zip(originals, ours, theirs, strict=True)):
        pieces = [runtime.id_to_token(i) for i in after.ids]
        if after.ids != ids:
            problems.append(f"text {k + 1}: transformers and the runtime tokenize it differently")
        elif all(t in vocab for t in before.tokens) and pieces != before.tokens:
            problems.append(f"text {k + 1}: its pieces were all kept, but it is tokenized differently")
        elif unk in pieces and unk not in before.tokens:
            problems.append(f"text {k + 1}: [UNK] after pruning, none before ({texts[k][:60]!r})")
    if problems:
        lines = "\n".join(f"  ✗ {p}" for p in problems[:5])
        raise ModelError(f"the pruned tokenizer does not reproduce the original on {len(problems)} of {len(texts)} "
                         f"validation texts:\n{lines}\nFix: remove the vocab stage for this model (its vocabulary "
                         f"lacks single-character pieces, or its tokenizer files disagree)")


def check_ids(model, tokens: dict[int, str], src: Path) -> None:
    """Every id the tokenizer gives is an embedding row, and every `*_token_id` of the config is a token."""
    rows = model.get_input_embeddings().num_embeddings
    if max(tokens) >= rows:
        raise ModelError(f"{src}: the tokenizer gives ids up to {max(tokens)} but the model has {rows} embedding "
                         f"rows. Fix: save the tokenizer that was trained with this model")
    unknown = {k: v for k, v in config_token_ids(model.config).items() if v not in tokens}
    if unknown:
        raise ModelError(f"{src}/config.json names token ids its tokenizer does not have: {unknown}. Fix: set them "
                         f"to the tokenizer's ids, or to null")


def vocab_prune(src: Path, out: Path, data: DataSplits, cfg: VocabConfig = VocabConfig()) -> dict:
    """Drop the word-embedding rows of tokens the train split does not use from the classifier in `src`; write the
    smaller model and its renumbered tokenizer to `out`. Nothing is written unless every check passes."""
    from edgepress.files import atomic_dir
    from edgepress.models.introspect import param_counts
    from edgepress.models.loading import load_classifier
    from edgepress.runtime.predictor import position_limit

    model, tokenizer = load_classifier(src)
    spec = wordpiece_spec(tokenizer, src)
    rows, before = model.get_input_embeddings().num_embeddings, param_counts(model)["params"]
    tokens = tokens_by_id(spec)
    check_ids(model, tokens, src)
    counts = Counter(i for ids in encode_ids(spec, data.train.texts) for i in ids)
    kept = kept_ids(spec, tokenizer, model.config, counts, cfg)
    shrink_embeddings(model, kept)
    with atomic_dir(Path(out)) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        write_tokenizer(tokenizer, tmp, [tokens[i] for i in kept])
        check_tokenizers(tmp, spec, data.validation.texts, position_limit(model.config.to_dict()))
    details = {"rows_before": rows, "rows_after": len(kept), "rows_removed_share": round(1 - len(kept) / rows, 6),
               "min_count": cfg.min_count, **coverage(encode_ids(spec, data.test.texts), set(kept)),
               "params_before": before, "params_after": param_counts(model)["params"]}
    log.info("vocab: kept %d of %d embedding rows (min_count %d), %d -> %d params, test token coverage %.4f",
             len(kept), rows, cfg.min_count, before, details["params_after"], details["test_token_coverage"] or 0)
    return details
