"""`python predict.py`: a bundle's own command line (classify, embed, tag, time; `similar` searches a corpus)."""

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .bundle import EMBEDDING
from .cascade import open_predictor
from .entities import AGGREGATIONS
from .errors import ConfigError, DataError, EdgepressError, ModelError, access_denied
from .lines import text_lines
from .predictor import Prediction, Predictor, check_texts
from .sessions import PROVIDERS


def _lines(file: str, option: str = "--file") -> list[str]:
    """The non-blank lines of the UTF-8 text file that `option` names (blank lines, a trailing newline, are not
    texts)."""
    try:
        lines = text_lines(Path(file).read_bytes().decode("utf-8"))
    except OSError as e:
        raise DataError(f"{option} {str(file)!r}: cannot read it ({e.strerror}). Fix: pass a readable text file, one "
                        f"text a line") from None
    except UnicodeDecodeError:
        raise DataError(f"{option} {file} is not UTF-8 text. Fix: save it in the UTF-8 encoding") from None
    return [line for line in lines if line.strip()]


def _texts(args: argparse.Namespace) -> tuple[str, ...]:
    texts = list(args.texts) + (_lines(args.file) if args.file is not None else [])
    if not texts:
        raise DataError("no text to classify. Fix: pass texts as arguments or --file FILE (one text a line)")
    return tuple(texts)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose refusals (an unknown option, a value of the wrong type) end, like every other
    refusal, with their fix (exit 2)."""

    def error(self, message: str):
        super().error(f"{message}. Fix: see `{self.prog} --help` for what it takes")


def _session_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """What every command takes about how the bundle runs: entities' aggregation, provider, threads."""
    parser.add_argument("--aggregation", choices=AGGREGATIONS, default="simple", help="a token classifier's "
                        "entities: each token's tag (simple) or each word's, read at its first token, its most "
                        "confident one, or their average (first, max, average), as transformers' pipeline does; "
                        "none: every token's tag")
    parser.add_argument("--provider", choices=tuple(PROVIDERS), default="cpu", help="execution provider")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: ONNX Runtime's)")
    return parser


def _parser(here: Path) -> argparse.ArgumentParser:
    parser = _Parser(prog="predict.py", description="Classify texts with an edgepress bundle, or "
                                     "embed them with an embedding model's bundle (one JSON object a text); "
                                     "onnxruntime, tokenizers and numpy only.")
    parser.add_argument("texts", nargs="*", help="texts to classify (or embed)")
    parser.add_argument("--file", help="a UTF-8 file of texts, one a line (blank lines skipped); each classified "
                        "alone")
    parser.add_argument("--bundle", type=Path, default=here, help="the bundle dir (default: predict.py's dir)")
    parser.add_argument("--json", action="store_true", help="one JSON object per text (per result with --bench)")
    parser.add_argument("--bench", action="store_true", help="time the model on the texts: p50/p90/p99 ms at "
                        "batch 1 x 128 tokens and at each text's natural length")
    parser.add_argument("--runs", type=int, default=100, help="timed runs per shape with --bench (default 100)")
    return _session_arguments(parser)


def _print_bench(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
        return
    for shape in ("fixed", "natural"):
        r = result[shape]
        what = f"batch 1 x {r['sequence_length']} tokens" if shape == "fixed" else \
            f"natural lengths ({r['mean_tokens']:.1f} tokens mean)"
        print(f"{what}: mean {r['mean_ms']:.2f} ms, p50 {r['p50_ms']:.2f} ms, p90 {r['p90_ms']:.2f} ms, "
              f"p99 {r['p99_ms']:.2f} ms ({r['runs']} runs)")
    if "deferred" in result:  # a cascade's
        print(f"cascade: {result['deferred']:.1%} of the texts given deferred to the fallback (confidence "
              f"{result['rule']} under {result['threshold']:.4g}); mean ms include both models where deferred")
    print(f"{result['cpu']} ({result['machine']}), {', '.join(result['providers_used'])}")


def similar(predictor: Predictor, queries: list[str] | tuple[str, ...], corpus: tuple[str, ...], top: int
            ) -> list[list[tuple[float, str]]]:
    """For each query, the `top` texts of `corpus` nearest it by the cosine of their vectors, nearest first (every
    text embedded alone, as everywhere; the corpus once)."""
    if predictor.task != EMBEDDING:
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
    corpus = tuple(_lines(file, "--corpus"))
    if not corpus:
        raise DataError(f"--corpus {file} holds no text. Fix: one text a line")
    return corpus


def similar_line(query: str, rank: int, score: float, text: str, as_json: bool) -> str:
    return json.dumps({"query": query, "rank": rank, "score": score, "text": text}) if as_json else \
        f"{score:.4f}\t{text}"


def _similar_parser(here: Path) -> argparse.ArgumentParser:
    parser = _Parser(prog="predict.py similar", description="The texts of a corpus nearest a query, "
                                     "by the cosine of an embedding model's vectors.")
    parser.add_argument("query", help="the text to search for")
    parser.add_argument("--corpus", required=True, help="a UTF-8 file of texts, one a line (blank lines skipped)")
    parser.add_argument("--top", type=int, default=10, help="how many to show (default 10)")
    parser.add_argument("--json", action="store_true", help="one JSON object per result")
    parser.add_argument("--bundle", type=Path, default=here, help="the bundle dir (default: predict.py's dir)")
    return _session_arguments(parser)


def _main_similar(argv: list[str], here: Path) -> None:
    args = _similar_parser(here).parse_args(argv)
    if args.top < 1 or (args.threads is not None and args.threads < 1):
        raise ConfigError("--top and --threads must be at least 1. Fix: pass a positive number")
    corpus = read_corpus(args.corpus)
    predictor = Predictor(args.bundle, providers=(args.provider,), threads=args.threads)
    for rank, (score, text) in enumerate(similar(predictor, [args.query], corpus, args.top)[0], start=1):
        print(similar_line(args.query, rank, score, text, args.json))


def _main_predict(argv: list[str], here: Path) -> None:
    args = _parser(here).parse_args(argv)
    if args.runs < 1 or (args.threads is not None and args.threads < 1):
        raise ConfigError("--runs and --threads must be at least 1. Fix: pass a positive number")
    texts = _texts(args)
    predictor = open_predictor(args.bundle, providers=(args.provider,), threads=args.threads)
    if args.bench:
        _print_bench(predictor.bench(texts, runs=args.runs), args.json)
        return
    for line in answer_lines(predictor, texts, args.aggregation, args.json):
        print(line)


def main(argv: list[str] | None = None, here: Path | None = None) -> int:
    """Classify or embed (or time) texts, or (`similar`) search a corpus; exit 2 with the error's fix on bad
    input. `here`: the bundle dir read without --bundle (predict.py's own dir)."""
    argv = sys.argv[1:] if argv is None else argv
    here = Path.cwd() if here is None else here
    command, argv = (_main_similar, argv[1:]) if argv[:1] == ["similar"] else (_main_predict, argv)
    try:
        try:
            command(argv, here)
        except PermissionError as e:  # a file it was given that the system will not let it read
            raise access_denied(e) from None
    except EdgepressError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


def embedding_json(text: str, vector: np.ndarray) -> str:
    """A text's vector as one JSON object (with or without --json: a vector is for programs to read)."""
    return json.dumps({"text": text, "embedding": [round(float(v), 7) for v in vector]})


def entity_lines(text: str, entities: list[dict], as_json: bool) -> list[str]:
    """How a token classifier's entities in `text` are printed: one JSON object (`as_json`), else the text and a line
    an entity (type, score, characters, the text they cover)."""
    if as_json:
        return [json.dumps({"text": text, "entities": entities})]
    return [text, *(f"  {e.get('entity_group', e.get('entity'))}\t{e['score']:.3f}\t{e['start']}-{e['end']}\t"
                    f"{text[e['start']:e['end']]}" for e in entities)]


def prediction_line(p: Prediction, as_json: bool) -> str:
    """How a text's label is printed: one JSON object (`as_json`; a cascade's names the model that answered and the
    student's confidence), else the label, its probability and the text."""
    routed = {"model": p.model, "confidence": p.confidence} if p.model is not None else {}
    return json.dumps({"text": p.text, "label": p.label, "score": p.score, "scores": p.scores, **routed}) \
        if as_json else f"{p.label}\t{p.score:.3f}\t{p.text}"


def answer_lines(predictor: Predictor, texts: tuple[str, ...], aggregation: str, as_json: bool) -> Iterator[str]:
    """What `predict.py` and `edgepress predict` print for `texts`, by the bundle's task (the reader its manifest
    names): an embedder's vector per text (one JSON object each), a token classifier's entities, a classifier's
    label; each text answered alone, every text checked first."""
    if predictor.task == EMBEDDING:
        for text, vector in zip(texts, predictor.embed(texts), strict=True):
            yield embedding_json(text, vector)
    elif predictor.tokens:
        check_texts(texts)
        for text in texts:
            yield from entity_lines(text, predictor.entities(text, aggregation), as_json)
    else:
        for p in predictor.predict_each(texts):
            yield prediction_line(p, as_json)
