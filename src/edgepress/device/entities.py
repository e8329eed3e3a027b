"""Entities in raw text, as transformers' token-classification pipeline finds them (its `aggregation_strategy`),
with the tokenizers library alone."""

import numpy as np

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


def find_entities(tokenizer, encoding, text: str, scores: np.ndarray, aggregation: str, id2label: dict[int, str]
                  ) -> list[dict]:
    """The entities in raw `text` (tokenized as `encoding`, each token's tag probabilities `scores`), as
    transformers' token-classification pipeline gives them: {"entity_group", "score", "word", "start", "end"}, tags
    read per token (`simple`) or per word (`first`, `max`, `average`), adjacent tags of one type joined; `none`:
    each token's own tag but O, {"entity", "score", "index", "word", "start", "end"}."""
    pieces = _sub_tokens(tokenizer, encoding, text, scores)
    if aggregation == "none":  # each token's tag: {entity, score, index (its position), word, start, end}
        tagged = [{**_tagged([p], id2label), "index": p["index"], "word": p["word"]} for p in pieces]
        return [{k: t[k] for k in ("entity", "score", "index", "word", "start", "end")} for t in tagged
                if t["entity"] != "O"]
    decoder = tokenizer.decoder
    decode = decoder.decode if decoder is not None else " ".join
    return group_entities(_words(pieces, aggregation, id2label, decode), decode)
