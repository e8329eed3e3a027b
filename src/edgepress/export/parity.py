"""Hard parity: a graph must give the logits of the model it came from on real sentences, batch 1 and batch > 1,
and on passages longer than 128 tokens alone and padded beside a short text (where runtimes get local attention
windows, ModernBERT's, and long positions wrong). A miss raises ExportParityError with a line per failing check; it
is never a warning."""

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edgepress.configs import Logits
from edgepress.device.feeds import encode, load_tokenizer, position_limit
from edgepress.device.sessions import output_name
from edgepress.errors import ExportParityError
from edgepress.files import read_json
from edgepress.models.sentence import module_folders
from edgepress.runtime.session import SessionConfig, open_session

ONNX_FILE = "model.onnx"

Feeds = dict[str, np.ndarray]
Runner = Callable[[Feeds], np.ndarray]


class ParityConfig(BaseModel):
    """Tolerances of a parity check (the `parity` gate takes the same two limits)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_abs_diff: Logits = Field(1e-4, description="largest allowed |logit difference| (of a sentence "
                                "embedder: |difference| of a vector component)")
    min_agreement: float = Field(0.999, ge=0, le=1, description="fraction of examples with the same argmax (of a "
                                 "sentence embedder: with cosine ≥ 0.95 to the reference vector)")
    n_texts: int = Field(64, ge=2, le=10**6, description="real sentences checked")
    batch_size: int = Field(8, ge=2, le=4096, description="the batched (padded) pass uses batches of this size")


# a throwaway copy's parity is not judged (the stage judges its own graph's); no limit a user may write
UNCHECKED = ParityConfig.model_construct(max_abs_diff=float("inf"), min_agreement=0.0, n_texts=2, batch_size=2)
PARITY_LENGTH = "tokens the parity sentences are cut to"
LOOSE_PARITY = ("a loose check that catches a broken graph (quantization moves logits; the accuracy gate decides "
                "whether the move costs predictions); left at its default, a token classifier's graph may move a "
                "logit by up to 5, the largest over every token")


def spread_by_length(texts: tuple[str, ...], n: int) -> list[str]:
    """`n` texts spanning the length distribution, shortest to longest."""
    order = np.argsort([len(t) for t in texts], kind="stable")
    picks = np.unique(np.linspace(0, len(order) - 1, num=min(n, len(order))).round().astype(int))
    return [texts[order[i]] for i in picks]


def parity_feeds(tokenizer, texts: list[str], input_names: tuple[str, ...], batch_size: int) -> list[Feeds]:
    """Every text alone (batch 1, its natural length), then the same texts shuffled into padded batches."""
    singles = [encode(tokenizer, [t], input_names) for t in texts]
    mixed = [texts[i] for i in np.random.default_rng(0).permutation(len(texts))]
    batches = [encode(tokenizer, mixed[i : i + batch_size], input_names) for i in range(0, len(mixed), batch_size)]
    return singles + batches


LONG_TOKENS = 320  # past ModernBERT's 128-token local window and BERT's usual 128-token exports


def long_feeds(directory: Path, texts: list[str], input_names: tuple[str, ...]) -> list[Feeds]:
    """Two passages of the `texts` joined (each as long as the model in `directory` takes, up to LONG_TOKENS), alone
    and in one padded batch with the shortest text between them."""
    limit = min(LONG_TOKENS, position_limit(read_json(directory / "config.json")))
    tokenizer = load_tokenizer(directory, limit)
    ordered = sorted(texts, key=len)
    passages = [" ".join(ordered[k::2]) for k in (0, 1)]
    return ([encode(tokenizer, [p], input_names) for p in passages]
            + [encode(tokenizer, [passages[0], ordered[0], passages[1]], input_names)])


def real_feeds(directory: Path, texts, max_length: int, input_names: tuple[str, ...], cfg: ParityConfig) -> list[Feeds]:
    """What every parity check runs, read by the tokenizer in `directory`: `cfg.n_texts` of the real `texts` cut to
    `max_length` tokens (`parity_feeds`), then the long passages (`long_feeds`)."""
    texts = spread_by_length(tuple(texts), cfg.n_texts)
    return (parity_feeds(load_tokenizer(directory, max_length), texts, input_names, cfg.batch_size)
            + long_feeds(directory, texts, input_names))


# A sentence vector agrees with its reference from this cosine up: loose enough for int8 (all-MiniLM-L6-v2's dynamic
# int8 graph: lowest 0.986 on the parity texts), far above what a broken graph gives; an exact export is held by
# max_abs_diff, and what int8 costs a search by the neighbour-overlap gate
COSINE_AGREES = 0.95


def check_parity(reference: Runner, candidate: Runner, feeds: list[Feeds], cfg: ParityConfig, what: str,
                 output: str = "logits") -> dict:
    """Compare two runners on `feeds`; returns max_abs_diff and agreement (the same argmax; of `output`
    sentence_embedding: cosine ≥ COSINE_AGREES, and min_cosine), raises ExportParityError on a miss. A token
    classifier's logits are compared token by token, on the real tokens of each text (its padding is no input)."""
    from edgepress.data.metrics import row_cosines
    diffs, agree, total, worst, low, unit = [], 0, 0, (0.0, 0, 0), 1.0, "texts"
    embedding = output == "sentence_embedding"
    for k, batch in enumerate(feeds):
        ref, got = reference(batch), candidate(batch)
        if ref.shape != got.shape:
            raise ExportParityError(f"{what}: {output} shape {got.shape} differs from the reference {ref.shape}")
        if ref.ndim == 3:  # a token classifier's (batch, sequence, labels): the real tokens' rows, padding left out
            real = np.asarray(batch["attention_mask"]).astype(bool)
            ref, got, unit = ref[real], got[real], "tokens"
        diff = float(np.max(np.abs(ref.astype(np.float64) - got.astype(np.float64))))
        if diff > worst[0]:
            worst = (diff, k, int(batch["input_ids"].shape[1]))
        diffs.append(diff)
        if embedding:
            similar = row_cosines(ref, got)
            agree, low = agree + int(np.sum(similar >= COSINE_AGREES)), min(low, float(similar.min()))
        else:
            agree += int(np.sum(ref.argmax(-1) == got.argmax(-1)))
        total += ref.shape[0]
    result = {"max_abs_diff": max(diffs), "agreement": agree / total, "n_examples": total, "n_batches": len(feeds),
              **({"examples": unit} if unit != "texts" else {}),
              **({"min_cosine": low} if embedding else {})}
    failures = []
    if not np.isfinite(result["max_abs_diff"]) or result["max_abs_diff"] > cfg.max_abs_diff:
        failures.append(f"max |Δ{'component' if embedding else 'logit'}| {result['max_abs_diff']:.3g} > "
                        f"{cfg.max_abs_diff:g} (worst: batch {worst[1]}, {worst[2]} tokens)")
    if result["agreement"] < cfg.min_agreement:
        failures.append(f"{f'cosine ≥ {COSINE_AGREES} on' if embedding else 'argmax agreement'} "
                        f"{result['agreement']:.4f} < {cfg.min_agreement}" + (
                            f" (lowest cosine {low:.4f})" if embedding else ""))
    if failures:
        lines = "\n".join(f"  ✗ {line}" for line in failures)
        raise ExportParityError(f"{what} does not match its reference on {total} real {unit}:\n{lines}", result, cfg)
    return result


def check_onnx_file(path: Path) -> None:
    """onnx.checker with full shape inference; a failure is a parity failure of the graph."""
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise ExportParityError(f"{path} fails onnx.checker:\n  ✗ {str(e).strip()[:500]}") from e


def ort_runner(session):
    """A runner over an ONNX Runtime session (feeds restricted to the inputs the graph takes)."""
    names, output = [i.name for i in session.get_inputs()], output_name(session)

    def run(feeds):
        return session.run([output], {n: feeds[n] for n in names})[0]

    return run


def input_names(session) -> tuple[str, ...]:
    return tuple(i.name for i in session.get_inputs())


def copy_side_files(src: Path, dst: Path) -> None:
    """config.json and tokenizer files travel with every ONNX artifact, and a sentence encoder's module folders
    (1_Pooling/: how it pools)."""
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".onnx" and not f.name.endswith(".onnx.data"):
            shutil.copy2(f, dst / f.name)
    for folder in module_folders(src):
        shutil.copytree(folder, dst / folder.relative_to(src), dirs_exist_ok=True)


# A token classifier's loose check (its method's `parity` left at the default) allows this largest |Δlogit|: it is
# the largest over every token of the parity sentences (about 4,000), not over one logit row per text. The
# MiniLM-L6 CoNLL-2003 teacher's int8 graph (per channel, 7-bit weights) moved one logit by 2.02 over 4,121 tokens
# while 99.15% kept their tag, and its test F1 was 0.8671 against the float graph's 0.8673.
TOKEN_LOOSE_DIFF = 5.0


def check_graph_change(src_dir: Path, tmp: Path, texts, max_length: int, parity: ParityConfig, what: str,
                       candidate: SessionConfig, default: bool = False) -> dict:
    """Check the graph written to `tmp` against `src_dir`'s (ORT, unoptimized) on real `texts`; `default`: `parity`
    is a quantizing method's loose default, which a token classifier's graph meets at TOKEN_LOOSE_DIFF."""
    from edgepress.device.sessions import gives_token_logits

    check_onnx_file(tmp / ONNX_FILE)
    reference = open_session(src_dir / ONNX_FILE, SessionConfig(optimization="disable"))
    if default and gives_token_logits(reference):
        parity = parity.model_copy(update={"max_abs_diff": max(parity.max_abs_diff, TOKEN_LOOSE_DIFF)})
    session = open_session(tmp / ONNX_FILE, candidate)
    feeds = real_feeds(src_dir, texts, max_length, input_names(reference), parity)
    return check_parity(ort_runner(reference), ort_runner(session), feeds, parity, what, output_name(reference))
