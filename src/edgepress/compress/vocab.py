"""Vocabulary pruning (`vocab`): drop the word-embedding rows of tokens the train split never produces. A BERT-base
vocabulary has 30,522 rows, XLM-R's 250,002 and DeBERTa-v3's 128,100; a small encoder spends most of its parameters
there (MiniLM-L6: 11.7M of 22.7M; XLM-R base: 192M of 278M), and a narrow domain or one language uses a few
thousand of them.

Kept, for every tokenizer: every token the train split tokenizes to (at least `min_count` times, untruncated) and
every token the run's unlabeled texts (data.unlabeled: in-domain text never judged on) tokenize to at least
`unlabeled_min_count` times,
every special and added token, every token the config or the tokenizer names by id (pad, post-processor), and
where a model numbers positions from pad_token_id + 1 (RoBERTa, XLM-R) every id up to the pad id. Kept tokens keep
their relative order; their ids are renumbered 0..n-1, in the model and in tokenizer.json alike. Then, per
tokenizer model, what makes a text whose pieces were all kept tokenize exactly as before, and no text fall to the
unknown token:

- WordPiece (BERT, MiniLM, DistilBERT, ELECTRA): every single-character piece with its `##` form. WordPiece is
  greedy longest-match-first over a vocabulary the pruned one is a subset of: at every position the original's
  longest match is still there and nothing longer appeared, so the same pieces come out. A word with a dropped
  piece is split into smaller kept pieces; with every single character kept (BERT's vocabularies have both forms for
  all 997 of theirs) no word becomes [UNK] that was not one before.
- BPE, byte-level (RoBERTa, ModernBERT, GPT-2) or not (with byte fallback: Gemma, mmBERT): every base piece (the
  256 byte symbols, every single character, the `<0xNN>` byte-fallback pieces), every piece a kept piece is merged
  from (recursively), and the merges whose two sides and result are all kept, in their order. BPE applies the
  lowest-ranked merge among the adjacent pairs at each step; on a text whose original merges were all kept, each
  step's lowest-ranked pair is the original's (the kept merges are a subset holding it), so the same pieces come out.
- Unigram, SentencePiece's (XLM-R, DeBERTa-v3, ALBERT, T5): every single-character piece of a character the train
  or validation split contains, the byte-fallback pieces where the model has them, and the lowest-scored piece (the
  unknown token's penalty is counted from it). Unigram takes the segmentation of highest total score; the pruned
  vocabulary's segmentations are a subset that holds the original's, so where all its pieces were kept it still wins.

Every claim is checked on the validation sentences before anything is written: transformers and the torch-free
runtime read the new files alike, a text whose pieces were all kept gets those pieces, and no text gets the unknown
token that had none. The cost: a word with a dropped piece is split into pieces the model saw less often in that
context, so its meaning may shift; `test_token_coverage` and `test_sentence_coverage` in the details say how many
test texts that touches (the rest give exactly the unpruned logits). No training is done.
"""

import copy
import json
import logging
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from edgepress.configs import TextCount, changed
from edgepress.data import DataSplits
from edgepress.device.feeds import position_pad
from edgepress.errors import ConfigError, ModelError

log = logging.getLogger(__name__)


UNLABELED_MIN_COUNT = 3  # chosen by measurement on the demo (benchmarks/results/vocab_unlabeled.json, docs/results.md)


class VocabConfig(BaseModel):
    """The `vocab` method: keep the tokens seen at least `min_count` times in the train split and at least
    `unlabeled_min_count` times in the run's unlabeled texts (plus the special tokens and every single character),
    drop every other word-embedding row."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    min_count: TextCount = Field(1, description="times a token must occur in the train split to keep its row")
    unlabeled: bool = Field(True, description="keep the frequent tokens of data.unlabeled's texts too (in-domain "
                                              "text the run has, never judged on): fewer words of new texts split "
                                              "into smaller pieces; false: the train split alone")
    unlabeled_min_count: TextCount = Field(UNLABELED_MIN_COUNT, description=(
        "times a token must occur in data.unlabeled's texts to keep its row for them (a token of the train split is "
        "kept by `min_count`): on the demo's 25,000 IMDB sentences 1 keeps 21,714 rows and 3 keeps 17,278, at the "
        "same validation accuracy (paired CI) and half of 1's gain in agreement with the unpruned model "
        "(docs/results.md); 1: every token they use"))

    @model_validator(mode="after")
    def _counts_what_it_reads(self) -> "VocabConfig":
        if not self.unlabeled and changed(self, ("unlabeled_min_count",)):
            raise ValueError("unlabeled_min_count counts data.unlabeled's texts, which unlabeled: false leaves out. "
                             "Fix: remove unlabeled_min_count, or set unlabeled: true")
        return self


PRUNABLE = ("WordPiece", "BPE", "Unigram")  # tokenizers' model types whose vocabularies edgepress prunes


def tokenizer_spec(tokenizer, src: Path) -> dict:
    """The tokenizer's tokenizer.json as a dict; a tokenizer without one, or of another model type (WordLevel), is a
    ConfigError."""
    kind = "a slow tokenizer (no tokenizer.json)"
    if getattr(tokenizer, "is_fast", False):
        spec = json.loads(tokenizer.backend_tokenizer.to_str())
        if spec["model"]["type"] in PRUNABLE:
            return spec
        kind = f"a {spec['model']['type']} tokenizer"
    raise ConfigError(f"vocab pruning supports fast tokenizers whose model is WordPiece (BERT, DistilBERT, ELECTRA), "
                      f"BPE (RoBERTa, ModernBERT) or Unigram (XLM-R, DeBERTa-v3); {src} has {kind}. Fix: remove the "
                      f"vocab stage for this model, or save its tokenizer with a tokenizer.json")


def check_vocab(model, tokenizer, cfg: VocabConfig, task=None) -> None:
    """The pre-run check of `vocab`: the model's tokenizer is one it can prune."""
    from edgepress.models.sentence import encoder_of

    tokenizer_spec(tokenizer, Path(encoder_of(model).name_or_path))


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


def _model_vocab(model: dict) -> dict[str, int]:
    """The tokenizer model's own vocabulary, token -> id (Unigram keeps a list of (piece, score), id = position)."""
    if model["type"] == "Unigram":
        return {piece: i for i, (piece, _) in enumerate(model["vocab"])}
    return model["vocab"]


def tokens_by_id(spec: dict) -> dict[int, str]:
    """Every id the tokenizer can give -> its token: the model's vocabulary and the added tokens."""
    return ({i: t for t, i in _model_vocab(spec["model"]).items()}
            | {a["id"]: a["content"] for a in spec["added_tokens"]})


def unk_token(model: dict) -> str | None:
    """The tokenizer model's unknown token (byte-level BPE has none: every text is bytes it knows)."""
    if model["type"] == "Unigram":
        return None if model.get("unk_id") is None else model["vocab"][model["unk_id"]][0]
    return model.get("unk_token")


def _named_tokens(spec: dict, tokenizer) -> set[str]:
    """Tokens the tokenizer refers to by name: special and added tokens, unknown, the post-processor's, padding's."""
    padding = [spec["padding"]["pad_token"]] if spec.get("padding") else []
    return ({a["content"] for a in spec["added_tokens"]} | set(tokenizer.all_special_tokens)
            | {unk_token(spec["model"]), *_processor_tokens(spec.get("post_processor")), *padding}) - {None}


def config_token_ids(config) -> dict[str, int]:
    """The model config's `*_token_id` fields that hold a vocabulary id (pad, bos, eos, ...)."""
    return {k: v for k, v in config.to_dict().items() if k.endswith("_token_id") and isinstance(v, int)}


BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")  # SentencePiece's and BPE's byte-fallback pieces


def _merges(model: dict) -> list[tuple[str, str]]:
    """A BPE model's merges, in rank order (tokenizer.json writes them as pairs, or as "a b" in older files)."""
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model["merges"]]


def _merged(model: dict, a: str, b: str) -> str:
    """The token a BPE merge of `a` and `b` makes (the right side loses its continuing-subword prefix)."""
    return a + b[len(model.get("continuing_subword_prefix") or ""):]


def _base_pieces(model: dict, tokens: set[str], chars: set[str]) -> set[str]:
    """The pieces every text is built from, kept so that no text becomes unknown: single characters (Unigram: those
    of `chars`, the characters the data shows), their subword-prefixed and suffixed forms, byte-fallback pieces."""
    affixes = [model.get("continuing_subword_prefix") or "", model.get("end_of_word_suffix") or ""]
    single = {t for t in tokens if len(t.removeprefix(affixes[0]).removesuffix(affixes[1])) == 1}
    if model["type"] == "Unigram":
        single = {t for t in single if t in chars}
        single.add(min(model["vocab"], key=lambda piece: piece[1])[0])  # the unknown penalty counts from it
    return single | {t for t in tokens if BYTE_PIECE.fullmatch(t)}


def _with_merge_sources(model: dict, kept: set[str]) -> set[str]:
    """`kept` and every piece a kept BPE piece is merged from, recursively (each merge's result needs its sides)."""
    merges = _merges(model)
    while True:
        more = {side for a, b in merges if _merged(model, a, b) in kept for side in (a, b)} - kept
        if not more:
            return kept
        kept |= more


def kept_ids(spec: dict, tokenizer, model, counts: Counter, cfg: VocabConfig, chars: set[str],
             unlabeled: Counter) -> list[int]:
    """The ids kept, ascending (so the pad token and the other low special ids stay where they were): those the
    train split gives `counts[i]` times, at least `min_count`, or the unlabeled texts `unlabeled[i]` times, at
    least `unlabeled_min_count`, and the ones every text needs."""
    tokens = tokens_by_id(spec)
    pinned = set(config_token_ids(model.config).values())
    # RoBERTa's and MPNet's embeddings number positions from their pad id + 1: there the ids up to it must not move
    pad = position_pad(model.config.to_dict())
    kept = {t for i, t in tokens.items()
            if counts[i] >= cfg.min_count or unlabeled[i] >= cfg.unlabeled_min_count or i in pinned
            or (pad is not None and i <= pad)}
    kept |= _named_tokens(spec, tokenizer) | _base_pieces(spec["model"], set(tokens.values()), chars)
    if spec["model"]["type"] == "BPE":
        kept = _with_merge_sources(spec["model"], kept)
    return sorted(i for i, t in tokens.items() if t in kept)


def _remap_model(model: dict, ids: dict[str, int]) -> None:
    """The tokenizer model over the kept tokens `ids` (token -> new id), in place: BPE keeps the merges whose sides
    and result are all kept, in rank order; Unigram keeps its pieces' scores."""
    if model["type"] == "Unigram":
        unk = unk_token(model)
        model["vocab"] = [piece for piece in model["vocab"] if piece[0] in ids]
        model["unk_id"] = None if unk is None else ids[unk]
        return
    model["vocab"] = {t: ids[t] for t in ids if t in model["vocab"]}
    if model["type"] == "BPE":
        model["merges"] = [m for m, (a, b) in zip(model["merges"], _merges(model), strict=True)
                           if a in ids and b in ids and _merged(model, a, b) in ids]


def remap_tokenizer_json(spec: dict, kept: list[str]) -> dict:
    """`spec` (a tokenizer.json) over the vocabulary `kept` (tokens in new-id order): the model's vocabulary (and
    merges), the added tokens, the post-processor's special-token ids and the padding id all renumbered."""
    spec = copy.deepcopy(spec)
    ids = {token: i for i, token in enumerate(kept)}
    _remap_model(spec["model"], ids)
    for added in spec["added_tokens"]:
        added["id"] = ids[added["content"]]
    _remap_processor(spec.get("post_processor"), ids)
    if spec.get("padding"):
        spec["padding"]["pad_id"] = ids[spec["padding"]["pad_token"]]
    return spec


def shrink_embeddings(model, kept: list[int]) -> None:
    """Keep the word-embedding rows `kept` (in that order), in place: (vocab, hidden) -> (len(kept), hidden) (of a
    table lowrank factored, the rows of its (vocab, rank) factor); config.vocab_size and every `*_token_id` in the
    config follow."""
    import torch

    from edgepress.models.lowrank import is_factored_table

    new_id = {old: new for new, old in enumerate(kept)}
    old = model.get_input_embeddings()
    padding = new_id[old.padding_idx] if old.padding_idx is not None else None
    factored = is_factored_table(old)  # a factored table (lowrank) keeps rows of its left factor
    weight = (old.table if factored else old).weight.detach()[torch.tensor(kept)].clone()
    new = torch.nn.Embedding.from_pretrained(weight, freeze=False, padding_idx=padding)
    if factored:
        old.table, old.num_embeddings, old.padding_idx = new, len(kept), padding
    else:
        model.set_input_embeddings(new)
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
    """Save `tokenizer` into `directory` (tokenizer_config.json ...), then its tokenizer.json remapped to `kept`.
    Where the save wrote a slow tokenizer's files beside it, they are rewritten to match (WordPiece's vocab.txt: one
    token a line, line number = id; BPE's vocab.json and merges.txt) or, a SentencePiece model that cannot be, removed:
    every reader then takes tokenizer.json."""
    tokenizer.save_pretrained(directory)
    path = directory / "tokenizer.json"
    spec = remap_tokenizer_json(json.loads(path.read_text(encoding="utf-8")), kept)
    path.write_text(json.dumps(spec, ensure_ascii=False, indent=2), encoding="utf-8")
    model = spec["model"]
    if model["type"] == "WordPiece":
        (directory / "vocab.txt").write_text("".join(f"{t}\n" for t in kept), encoding="utf-8")
    if model["type"] == "BPE" and (directory / "vocab.json").exists():
        (directory / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False), encoding="utf-8")
        merges = "".join(f"{a} {b}\n" for a, b in _merges(model))
        (directory / "merges.txt").write_text(f"#version: 0.2\n{merges}", encoding="utf-8")
    for stale in directory.glob("*.model"):  # sentencepiece.bpe.model, spm.model: the unpruned vocabulary
        stale.unlink()


def check_tokenizers(directory: Path, spec: dict, texts: Sequence[str], limit: int) -> None:
    """The pruned dir's tokenizer, read by transformers and by the torch-free runtime, gives the same ids for
    `texts`; a text whose original pieces (under `spec`) were all kept gets those same pieces, special tokens
    included; no text gets [UNK] that had none. A ModelError lists the texts that fail."""
    from transformers import AutoTokenizer

    from edgepress.device.feeds import load_tokenizer

    runtime = load_tokenizer(directory, limit)
    runtime.no_padding()
    ours = runtime.encode_batch(list(texts))
    theirs = AutoTokenizer.from_pretrained(directory)(list(texts), truncation=True, max_length=limit)["input_ids"]
    originals = plain_tokenizer(spec, limit).encode_batch(list(texts))
    vocab, unk = runtime.get_vocab(with_added_tokens=True), unk_token(spec["model"])
    problems = []
    for k, (before, after, ids) in enumerate(zip(originals, ours, theirs, strict=True)):
        pieces = [runtime.id_to_token(i) for i in after.ids]
        if after.ids != ids:
            problems.append(f"text {k + 1}: transformers and the runtime tokenize it differently")
        elif all(t in vocab for t in before.tokens) and pieces != before.tokens:
            problems.append(f"text {k + 1}: its pieces were all kept, but it is tokenized differently")
        elif unk is not None and unk in pieces and unk not in before.tokens:
            problems.append(f"text {k + 1}: {unk} after pruning, none before ({texts[k][:60]!r})")
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


def vocab_prune(src: Path, out: Path, data: DataSplits, cfg: VocabConfig = VocabConfig(), task=None) -> dict:
    """Drop the word-embedding rows of tokens the train split does not use from the model of `task` in `src` (of a
    sentence encoder: from its Transformer module); write the smaller model and its renumbered tokenizer to `out`.
    Nothing is written unless every check passes. `task`: the run's (None: the model dir's own, `task_of`)."""
    from edgepress.device.feeds import position_limit
    from edgepress.files import atomic_dir
    from edgepress.models.introspect import param_counts
    from edgepress.models.sentence import encoder_of
    from edgepress.tasks import task_of

    task = task or task_of(src)
    whole, tokenizer = task.load_model(src)
    model = encoder_of(whole)  # the Hugging Face model whose word table shrinks
    spec = tokenizer_spec(tokenizer, src)
    rows, before = model.get_input_embeddings().num_embeddings, param_counts(model)["params"]
    tokens = tokens_by_id(spec)
    check_ids(model, tokens, src)
    train, unlabeled = encode_ids(spec, data.train.texts), encode_ids(spec, data.unlabeled if cfg.unlabeled else ())
    seen = train + unlabeled + encode_ids(spec, data.validation.texts)
    chars = {c for ids in seen for i in ids for c in tokens[i]}
    kept = kept_ids(spec, tokenizer, model, Counter(i for ids in train for i in ids), cfg, chars,
                    Counter(i for ids in unlabeled for i in ids))
    shrink_embeddings(model, kept)
    with atomic_dir(Path(out)) as tmp:
        task.save_model(whole, tmp)
        write_tokenizer(tokenizer, tmp, [tokens[i] for i in kept])
        check_tokenizers(tmp, spec, data.validation.texts, position_limit(model.config.to_dict()))
    details = {"rows_before": rows, "rows_after": len(kept), "rows_removed_share": round(1 - len(kept) / rows, 6),
               "min_count": cfg.min_count, "unlabeled_texts": len(data.unlabeled) if cfg.unlabeled else 0,
               "unlabeled_min_count": cfg.unlabeled_min_count if cfg.unlabeled else None,
               **coverage(encode_ids(spec, data.test.texts), set(kept)),
               "params_before": before, "params_after": param_counts(model)["params"]}
    log.info("vocab: kept %d of %d embedding rows (min_count %d, %d unlabeled texts at %s), %d -> %d params, test "
             "token coverage %.4f", len(kept), rows, cfg.min_count, details["unlabeled_texts"],
             details["unlabeled_min_count"], before, details["params_after"], details["test_token_coverage"] or 0)
    return details
