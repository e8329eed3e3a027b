"""Sentence-transformers model dirs, read from their own JSON files: no sentence-transformers import, no remote code.

`modules.json` lists the modules run in order: a Transformer (the Hugging Face encoder: the dir itself; one in a
subfolder, as older sentence-transformers saved it, is refused), a Pooling (its config.json says which token vectors
make the sentence vector), and optionally a Normalize (unit length). `SentenceEncoder` computes what
sentence-transformers computes from those three, in one torch module, so that the export puts pooling and normalization
inside the graph (output `sentence_embedding`; the token vectors the pooling reads are the tensor named
`token_embeddings`). A module of any other type (Dense, a custom class, a Router) is refused with its name: edgepress
would otherwise silently compute another vector than the user's model does.
"""

from dataclasses import dataclass
from pathlib import Path

from edgepress.device.bundle import MODULES, json_value
from edgepress.errors import ModelError
from edgepress.models.loading import ENCODER_BESIDE_MODULES, FIX_DIR

MODULES_FILE = MODULES
POOLING_FILE = "config.json"  # inside the Pooling module's folder
# sentence-transformers' pooling modes edgepress computes (with their legacy config flags)
POOLING_MODES = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens",
                 "mean": "pooling_mode_mean_tokens", "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens"}
MODULE_TYPES = ("Transformer", "Pooling", "Normalize")
# The graph's name for the encoder's token vectors (batch, seq, dim), the pooling's input: the export names it so
# (`with_token_output`), and a web bundle gives it as an output for transformers.js to pool
TOKEN_OUTPUT = "token_embeddings"
FIX_SENTENCE = ("Fix: give a sentence-transformers dir of Transformer + Pooling (+ Normalize) modules, as "
                "SentenceTransformer.save(DIR) writes it")


@dataclass(frozen=True)
class SentenceLayout:
    """What a sentence-transformers dir computes: the encoder's folder inside it ("" for the dir itself), the
    pooling modes whose vectors are concatenated, in order, whether the vector is normalized to unit length, and
    the Transformer module's max_seq_length (None when it sets none)."""

    transformer: str
    pooling: tuple[str, ...]
    normalize: bool
    max_seq_length: int | None = None

    def to_json(self) -> dict:
        return {"transformer": self.transformer, "pooling": list(self.pooling), "normalize": self.normalize,
                "max_seq_length": self.max_seq_length}


def is_sentence_encoder(model) -> bool:
    """A torch module made by `sentence_encoder` (it gives sentence vectors, not logits)."""
    return isinstance(getattr(model, "layout", None), SentenceLayout)


def encoder_of(model):
    """The Hugging Face model whose layers and weights the methods change: a sentence encoder's Transformer module,
    or the model itself."""
    return model.transformer if is_sentence_encoder(model) else model


def is_sentence_dir(path: Path) -> bool:
    """A sentence-transformers model dir (it has modules.json)."""
    return (Path(path) / MODULES_FILE).is_file()


def _folder(root: Path, entry: dict, problems: list[str]) -> Path | None:
    """The module's folder: a relative path inside `root` (a module outside it would read other files)."""
    relative = entry.get("path", "")
    if not isinstance(relative, str) or Path(relative).is_absolute() or ".." in Path(relative).parts:
        problems.append(f"module {entry.get('name')!r}: path {relative!r} is not a folder inside the model dir")
        return None
    return root / relative


def _module_type(entry) -> str | None:
    """Transformer / Pooling / Normalize for sentence-transformers' own classes (any of its package paths:
    sentence_transformers.models.X, sentence_transformers.base.models.X, ...); None for anything else."""
    kind = entry.get("type") if isinstance(entry, dict) else None
    if not isinstance(kind, str) or not kind.startswith("sentence_transformers."):
        return None
    name = kind.rsplit(".", 1)[-1]
    return name if name in MODULE_TYPES else None


def _pooling(folder: Path, problems: list[str]) -> tuple[str, ...]:
    """The Pooling module's modes, in the order their vectors are concatenated: `pooling_mode` (a name or a list,
    sentence-transformers 6), else the legacy `pooling_mode_*` flags in their fixed order; none set means mean, as
    sentence-transformers 6 reads it."""
    config = json_value(folder / POOLING_FILE, FIX_SENTENCE) if (folder / POOLING_FILE).is_file() else None
    if not isinstance(config, dict):
        problems.append(f"the Pooling module has no {folder.name}/{POOLING_FILE}")
        return ()
    modes = config.get("pooling_mode")
    if modes is None:
        legacy = {**POOLING_MODES, "weightedmean": "pooling_mode_weightedmean_tokens",
                  "lasttoken": "pooling_mode_lasttoken"}
        modes = [mode for mode, flag in legacy.items() if config.get(flag)] or ["mean"]
    modes = [modes] if isinstance(modes, str) else modes
    unsupported = [str(mode) for mode in modes if mode not in POOLING_MODES]
    if config.get("include_prompt") is False:
        unsupported.append("include_prompt: false")
    if unsupported:
        problems.append(f"pooling {', '.join(unsupported)} is not supported (edgepress pools with "
                        f"{', '.join(POOLING_MODES)})")
    return tuple(modes)


def _transformer(folder: Path, problems: list[str]) -> int | None:
    """The Transformer module's sentence_bert_config.json: its max_seq_length (sentence-transformers < 6; 6 keeps it
    in the tokenizer's model_max_length); a task other than token vectors, or model_args asking for remote code
    (edgepress never runs it), are problems."""
    file = folder / "sentence_bert_config.json"
    config = json_value(file, FIX_SENTENCE) if file.is_file() else {}
    if not isinstance(config, dict):
        problems.append(f"{file.name} holds no JSON object")
        return None
    if config.get("do_lower_case"):
        problems.append(f"{file.name}: do_lower_case (sentence-transformers lowercases each text before its "
                        f"tokenizer) is not supported; a tokenizer that lowercases itself (tokenizer.json's "
                        f"normalizer) is")
    if config.get("transformer_task", "feature-extraction") != "feature-extraction" or \
            config.get("module_output_name", "token_embeddings") != "token_embeddings":
        problems.append(f"{file.name}: the Transformer gives {config.get('transformer_task')!r} / "
                        f"{config.get('module_output_name')!r}; edgepress pools the encoder's token vectors "
                        f"(feature-extraction / token_embeddings)")
    for key in ("model_args", "tokenizer_args", "config_args", "processor_kwargs", "model_kwargs", "config_kwargs"):
        args = config.get(key)
        if isinstance(args, dict) and args.get("trust_remote_code"):
            problems.append(f"{file.name}: {key}.trust_remote_code asks for code from outside transformers, which "
                            f"edgepress never runs")
    length = config.get("max_seq_length")
    return int(length) if isinstance(length, int) and length > 0 else None


def _prompt(path: Path, problems: list[str]) -> None:
    """A default prompt (config_sentence_transformers.json) is put before every text by sentence-transformers:
    not yet by edgepress, so such a model is refused rather than computed on other inputs."""
    file = path / "config_sentence_transformers.json"
    config = json_value(file, FIX_SENTENCE) if file.is_file() else {}
    name = config.get("default_prompt_name") if isinstance(config, dict) else None
    if name:
        prompt = (config.get("prompts") or {}).get(name)
        problems.append(f"{file.name}: default_prompt_name {name!r} puts {prompt!r} before every text, which "
                        f"edgepress does not do yet (set it to null to embed the texts as given)")


def read_layout(path: Path) -> SentenceLayout:
    """The layout of the sentence-transformers dir `path`; a ModelError with a line per problem otherwise."""
    path = Path(path)
    entries = json_value(path / MODULES_FILE, FIX_SENTENCE)
    if not isinstance(entries, list) or not entries:
        raise ModelError(f"{path / MODULES_FILE} must list the model's modules (a JSON list). {FIX_SENTENCE}")
    problems: list[str] = []
    kinds = [_module_type(entry) for entry in entries]
    for entry, kind in zip(entries, kinds, strict=True):
        if kind is None:
            name = entry.get("type") if isinstance(entry, dict) else entry
            problems.append(f"module {name!r} is not one edgepress computes ({', '.join(MODULE_TYPES)})")
    if kinds[:2] != ["Transformer", "Pooling"] or kinds[2:] not in ([], ["Normalize"]):
        problems.append(f"the modules are {' -> '.join(str(k) for k in kinds)}; edgepress computes Transformer -> "
                        f"Pooling (-> Normalize)")
    folders = [_folder(path, entry, problems) if isinstance(entry, dict) else None for entry in entries]
    pooling, length = (), None
    if kinds[:1] == ["Transformer"] and folders[0] not in (None, path):
        problems.append(f"the Transformer module is in {entries[0]['path']}/: {ENCODER_BESIDE_MODULES}")
    if kinds[:2] == ["Transformer", "Pooling"] and None not in folders[:2]:
        length = _transformer(folders[0], problems)
        pooling = _pooling(folders[1], problems)
    _prompt(path, problems)
    if problems:
        lines = "\n".join(f"  ✗ {p}" for p in problems)
        raise ModelError(f"{path} is a sentence-transformers dir edgepress cannot compute exactly:\n{lines}\n"
                         f"{FIX_SENTENCE}")
    transformer = entries[0].get("path", "")
    return SentenceLayout(transformer, pooling, kinds[2:] == ["Normalize"], length)


def module_folders(path: Path) -> list[Path]:
    """The folders inside the sentence-transformers dir `path` that its modules other than the encoder name
    (1_Pooling, ...), those that exist: the files saying how it pools, which travel beside modules.json with every
    ONNX artifact and bundle; none for any other dir."""
    path = Path(path)
    if not is_sentence_dir(path):
        return []
    entries = json_value(path / MODULES_FILE, FIX_SENTENCE)
    folders = [_folder(path, entry, []) for entry in entries if isinstance(entry, dict)] \
        if isinstance(entries, list) else []
    return [folder for folder in folders if folder is not None and folder != path and folder.is_dir()]


def pool(hidden, mask, modes: tuple[str, ...], normalize: bool):
    """sentence-transformers' Pooling (+ Normalize) in torch ops an ONNX export keeps: `hidden` (batch, seq, dim)
    token vectors, `mask` (batch, seq) 1 for real tokens -> (batch, dim x len(modes))."""
    import torch

    weights = mask.unsqueeze(-1).to(hidden.dtype)  # (batch, seq, 1)
    counts = weights.sum(dim=1).clamp(min=1e-9)  # (batch, 1) real tokens per text
    summed = (hidden * weights).sum(dim=1)  # (batch, dim)
    vectors = {"cls": lambda: hidden[:, 0],  # the first token: edgepress's tokenizers pad on the right
               "max": lambda: hidden.masked_fill(weights == 0, -1e9).max(dim=1).values,
               "mean": lambda: summed / counts,
               "mean_sqrt_len_tokens": lambda: summed / torch.sqrt(counts)}
    parts = [vectors[mode]() for mode in modes]
    embedding = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
    if not normalize:
        return embedding
    # F.normalize(p=2, dim=1) in ops whose shapes ONNX Runtime's symbolic shape inference knows: it fails on
    # F.normalize's Expand and on ReduceL2, and without it the optimizer fuses nothing (Attention, SkipLayerNorm)
    norm = torch.sqrt((embedding * embedding).sum(dim=1, keepdim=True))  # (batch, 1)
    return embedding / norm.clamp(min=1e-12)


def sentence_encoder(transformer, layout: SentenceLayout, token_output: bool = False):
    """A torch module computing the sentence vector of `layout` over the Hugging Face encoder `transformer`:
    forward(input_ids, attention_mask[, token_type_ids]) -> (batch, dim) (with `token_output`, and the token
    vectors it pools (batch, seq, hidden)), and `.config` the encoder's."""
    import torch

    class SentenceEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer, self.layout, self.config = transformer, layout, transformer.config

        def set_attn_implementation(self, attention: str) -> None:  # the exporter traces with eager attention
            self.transformer.set_attn_implementation(attention)

        def get_input_embeddings(self):  # the word table (transfer data's perturbed copies read it)
            return self.transformer.get_input_embeddings()

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
            hidden = self.transformer(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
            embedding = pool(hidden, attention_mask, layout.pooling, layout.normalize)
            return (embedding, hidden) if token_output else embedding

    return SentenceEncoder().eval()


def with_token_output(model):
    """The sentence encoder `model` (the same encoder, not a copy) giving the token vectors it pools beside the
    sentence vector: what the export traces, so that the graph names that tensor `TOKEN_OUTPUT`."""
    return sentence_encoder(model.transformer, model.layout, token_output=True)


def load_sentence_encoder(path: str | Path):
    """(SentenceEncoder in eval mode, tokenizer) of a sentence-transformers dir: its encoder loaded as
    `load_classifier` loads a classifier (safetensors first, the same deny-list of code-loading fields)."""
    from edgepress.models.loading import load_pretrained

    path = Path(path)
    layout = read_layout(path)
    transformer, tokenizer, info = load_pretrained(path / layout.transformer, "AutoModel")
    unused = ("pooler.",)  # the encoder's own pooler: sentence-transformers' Pooling replaces it
    missing = [key for key in info["missing_keys"] if not key.startswith(unused)]
    if missing:
        raise ModelError(f"{path}: the encoder's weights lack {', '.join(sorted(missing)[:4])}. {FIX_DIR}")
    return sentence_encoder(transformer.eval(), layout), tokenizer


def save_sentence_encoder(model, out: Path) -> None:
    """A sentence encoder as a sentence-transformers dir: its encoder (save_pretrained, safetensors) and the files
    that say how it pools (`save_layout`); the tokenizer is saved beside it by the caller."""
    model.transformer.save_pretrained(out, safe_serialization=True)
    save_layout(model.layout, model.config.hidden_size, Path(out))


def save_layout(layout: SentenceLayout, dimension: int, out: Path) -> None:
    """The sentence-transformers files describing `layout` in the model dir `out`, whose own config and tokenizer
    are the Transformer module's (path ""): modules.json, 1_Pooling/config.json, sentence_bert_config.json."""
    from edgepress.files import write_json

    modules = [("Transformer", ""), ("Pooling", "1_Pooling"), *([("Normalize", "2_Normalize")] if layout.normalize
                                                                 else [])]
    write_json(out / MODULES_FILE, [{"idx": i, "name": str(i), "path": folder,
                                     "type": f"sentence_transformers.models.{kind}"}
                                    for i, (kind, folder) in enumerate(modules)])
    (out / "1_Pooling").mkdir(exist_ok=True)
    modes = layout.pooling[0] if len(layout.pooling) == 1 else list(layout.pooling)
    write_json(out / "1_Pooling" / POOLING_FILE, {"embedding_dimension": dimension, "pooling_mode": modes,
                                                  "include_prompt": True})  # sentence-transformers 6's form
    if layout.max_seq_length is not None:
        write_json(out / "sentence_bert_config.json", {"max_seq_length": layout.max_seq_length,
                                                       "do_lower_case": False})
