"""Loading a Hugging Face classifier dir (of sequences, or of tokens: NER): safetensors first, no remote code, no
pickles."""

import json
import re
from pathlib import Path

from edgepress.device.bundle import check_readable, json_object, json_value, tags_tokens, whole, whole_field
from edgepress.errors import ModelError, available_memory
from edgepress.models.lowrank import RECORD as LOWRANK_RECORD
from edgepress.models.width import RECORD as WIDTH_RECORD

WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"
)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model")
FIX_DIR = "Fix: save it with model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR)"
# weights of other shapes than the config.json beside them builds: edgepress records its cuts in that file
FIX_RECORDS = ("Fix: restore the config.json saved with these weights (edgepress records the heads it pruned, the "
               "width it narrowed and the Linears it factored there: pruned_heads, pruned_hidden_size, "
               "lowrank_ranks), or save the model again")

# Fields with which a model dir steers transformers into importing or fetching code that is not its own, whatever
# `trust_remote_code` says on some versions: remote modules (auto_map, custom_pipelines), Hub kernels for attention
# or experts (CVE-2026-4372: `_attn_implementation_internal`, transformers 4.56-5.2; 5.x honours
# `attn_implementation`), third-party quantizer packages and their kernels (quantization_config). edgepress never
# runs remote code, so a dir carrying one is a mistake or an attack: it is refused before any from_pretrained.
CODE_FIELDS = ("auto_map", "custom_pipelines", "_attn_implementation_internal", "experts_implementation",
               "_experts_implementation_internal", "quantization_config")
ATTENTION_FIELDS = ("attn_implementation", "_attn_implementation")
BUILT_IN_ATTENTION = ("eager", "sdpa", "flex_attention")  # anything else may name a Hub kernel ("org/repo:fn")
SIDE_CONFIGS = ("tokenizer_config.json", "processor_config.json", "preprocessor_config.json")


def _code_fields(config: dict, where: str) -> list[str]:
    """`where.field` for every field of `config` (nested sub-configs included) that steers code loading."""
    found = []
    for key, value in config.items():
        if key in CODE_FIELDS and value is not None:
            found.append(f"{where}{key}")
        elif key in ATTENTION_FIELDS and value is not None and value not in BUILT_IN_ATTENTION:
            found.append(f"{where}{key} = {json.dumps(value)[:60]}")
        if isinstance(value, dict):
            found += _code_fields(value, f"{where}{key}.")
    return found


def check_no_remote_code(path: Path, config: dict) -> None:
    """Refuse a model dir whose config.json (or tokenizer/processor config, or an adapter config) carries a field
    that makes transformers load code from outside itself; the ModelError names every such field."""
    found = [f"config.json: {field}" for field in _code_fields(config, "")]
    for name in SIDE_CONFIGS:
        side = path / name
        side_config = json_value(side, FIX_DIR) if side.is_file() else {}
        found += [f"{name}: {field}" for field in _code_fields(side_config, "")] if isinstance(side_config, dict) \
            else []
    if (path / "adapter_config.json").is_file():
        found.append("adapter_config.json (a PEFT adapter: transformers would load its base model from elsewhere)")
    if found:
        lines = "\n".join(f"  ✗ {f}" for f in found)
        raise ModelError(f"{path} asks transformers to load code from outside itself, which edgepress never runs:\n"
                         f"{lines}\nFix: remove these fields from the model dir's JSON files (a model saved with "
                         f"save_pretrained from a built-in architecture does not need them), or merge an adapter "
                         f"into its base model first")


def model_dir_problems(path: Path) -> list[str]:
    """What keeps `path` from being a loadable classifier dir (empty when nothing does)."""
    if not path.is_dir():
        return [f"{path} is not a directory"]
    problems = []
    if not (path / "config.json").is_file():
        problems.append("config.json is missing")
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        problems.append(f"no weights ({' or '.join(WEIGHT_FILES[::2])})")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        problems.append(f"no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...)")
    return problems


def check_model_dir(path: Path) -> dict:
    """Raise `ModelError` with a line per problem unless `path` is a loadable classifier dir (an AccessDenied for a
    file in it the system will not let edgepress read), its config.json a JSON object (before anything, a tokenizer
    among them, reads it and blames itself); return that object."""
    check_readable(path)
    problems = model_dir_problems(path)
    if problems:
        lines = "\n".join(f"  ✗ {p}" for p in problems)
        raise ModelError(f"{path} is not a Hugging Face model directory:\n{lines}\n{FIX_DIR}")
    return read_model_config(path)


# a sentence-transformers dir whose encoder is in a subfolder: read_model_config and models.sentence.read_layout
ENCODER_BESIDE_MODULES = ("edgepress reads the encoder's files beside modules.json, not in a subfolder (as older "
                          "sentence-transformers saved them, e.g. 0_Transformer/). Fix: save the model again with a "
                          "current sentence-transformers, SentenceTransformer(DIR).save(NEW_DIR), which keeps the "
                          "encoder beside modules.json")


def read_model_config(path: Path) -> dict:
    """The model dir's config.json as a dict; unreadable or not a JSON object is a ModelError. A sentence-transformers
    dir keeps its encoder's config.json beside modules.json: one that keeps it in a subfolder (as older
    sentence-transformers saved it, e.g. 0_Transformer/) is refused here, by every command."""
    path = Path(path)
    if not (path / "config.json").exists() and (path / "modules.json").is_file():
        raise ModelError(f"{path} is a sentence-transformers dir without config.json beside its modules.json: its "
                         f"encoder is in a subfolder. {ENCODER_BESIDE_MODULES}")
    return json_object(path / "config.json", FIX_DIR)


def label2id_of(path: Path, torch_weights: bool = True) -> dict[str, int]:
    """The model's label names -> ids, from its config.json (of a torch model dir, checked whole, or with
    `torch_weights` off, of any dir with a config.json: an ONNX model dir, a bundle)."""
    config = check_model_dir(path) if torch_weights else read_model_config(path)
    if "label2id" not in config:
        return {f"LABEL_{i}": i for i in range(config.get("num_labels", 2))}  # transformers' default naming
    given = config["label2id"]
    if not isinstance(given, dict) or not all(whole(i) or isinstance(i, str) and i.isdigit() for i in given.values()):
        raise ModelError(f"{path}/config.json: label2id must map each label name to its id, a whole number; got "
                         f"{str(given)[:120]}. Fix: write it as {{name: id}} for ids 0 to num_labels - 1, as "
                         f"id2label has them (or remove label2id: transformers rebuilds it from id2label)")
    label2id = {str(name): int(i) for name, i in given.items()}
    if sorted(label2id.values()) != list(range(len(label2id))):  # each id is a row of the classifier's output
        raise ModelError(f"{path}/config.json: label2id must number its {len(label2id)} labels 0 to "
                         f"{len(label2id) - 1}, each once; got {label2id}. Fix: renumber label2id and id2label "
                         f"to the classifier's output rows")
    return label2id


def safetensors_files(path: Path) -> list[Path]:
    """The dir's safetensors weight files: model.safetensors, or the shards its index names -- each a plain file
    name inside the dir (an index naming `../x` or `/x` would make a loader read outside it)."""
    if (path / WEIGHT_FILES[0]).is_file():
        return [path / WEIGHT_FILES[0]]
    index = path / WEIGHT_FILES[1]
    if not index.is_file():
        return []
    try:
        shards = sorted(set(json_object(index, FIX_DIR)["weight_map"].values()))
    except (KeyError, TypeError, AttributeError) as e:
        raise ModelError(f"{index} is not a safetensors index (a JSON object with a weight_map): {e}. "
                         f"{FIX_DIR}") from None
    outside = [s for s in shards if not isinstance(s, str) or Path(s).name != s or s in ("", ".", "..")]
    if outside:
        raise ModelError(f"{index} names weight files outside the model dir: {outside[:3]}. Fix: the weight_map "
                         f"may only name files in the same directory (save the model again)")
    return [path / s for s in shards]


def _load_rebuilt(path: Path, files: list[Path], auto_class, **overrides):
    """A model whose config.json records pruned heads, a narrowed hidden width or factored Linears: built from its
    config with transformers' `auto_class`, shrunk and factored as recorded, then its safetensors weights `files`
    loaded (transformers 5 would build full-size layers and refuse the smaller weights). `overrides` are set over its
    config as `from_pretrained` sets them (a fresh head: a saved head sized for other labels is not loaded)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from edgepress.models.heads import pruned_heads, remove_heads
    from edgepress.models.lowrank import rebuild, recorded_ranks
    from edgepress.models.width import narrow, recorded_width

    if not files:
        raise ModelError(f"{path}: a pruned model loads from safetensors only (model.safetensors). Fix: save it "
                         f"with model.save_pretrained(DIR) (safetensors is the default)")
    config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    for key, value in overrides.items():
        setattr(config, key, value)
    try:  # the records' own refusals name config.json; here it is said whose
        removed, width, ranks = pruned_heads(config), recorded_width(config), recorded_ranks(config)
        if width is not None:
            delattr(config, WIDTH_RECORD)  # set again by `narrow`
        model = auto_class.from_config(config)
        remove_heads(model, removed)
        if width is not None:
            narrow(model, list(range(width)))  # the shapes; the weights come next
        rebuild(model, ranks)
    except ModelError as e:
        raise ModelError(f"{path}/{e}" if str(e).startswith("config.json") else str(e)) from None
    state, shapes = {}, {name: tensor.shape for name, tensor in model.state_dict().items()}
    for file in files:
        state.update(load_file(str(file)))
    if overrides:  # outside the base model: the head, drawn afresh where the saved one does not fit the labels
        state = {name: tensor for name, tensor in state.items() if name.startswith(f"{model.base_model_prefix}.")
                 or shapes.get(name, tensor.shape) == tensor.shape}
    wrong = [f"{name} {tuple(tensor.shape)}, built {tuple(shapes[name])}" for name, tensor in state.items()
             if name in shapes and shapes[name] != tensor.shape]
    unexpected = [name for name in state if name not in shapes]
    if wrong or unexpected:
        raise ModelError(f"{path}: weights that do not fit its config.json ({'; '.join((wrong + unexpected)[:3])}"
                         f"{', ...' if len(wrong + unexpected) > 3 else ''}). {FIX_RECORDS}")
    missing, _ = model.load_state_dict(state, strict=False)
    return model, {"missing_keys": missing}


# config.json fields that count something a model has at least one of (BERT's names, DistilBERT's, ALBERT-style
# embedding_size): 0 or fewer builds a model that fails at its first text, far from the field
SIZES = ("hidden_size", "intermediate_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "dim",
         "hidden_dim", "n_layers", "n_heads", "embedding_size")


def check_sizes(path: Path, config: dict) -> None:
    """Each of `SIZES` that config.json gives is a whole number of at least 1."""
    for field in SIZES:
        if config.get(field) is not None:
            whole_field(config, field, None, 1, f"{path}/config.json")


# the layer folders of every family edgepress loads (BERT's encoder.layer.N, DistilBERT's transformer.layer.N,
# ModernBERT's layers.N); ALBERT's shared albert_layers.N do not count: its config repeats them
LAYER = re.compile(r"(?:^|\.)(?:layer|layers)\.(\d+)\.")
LAYER_FIELDS = ("num_hidden_layers", "n_layers")


def weight_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in the safetensors `files`, from their headers: no tensor is read."""
    from safetensors import safe_open

    shapes = {}
    for file in files:
        with safe_open(str(file), framework="numpy") as weights:
            for name in weights.keys():  # noqa: SIM118 (safe_open has keys(), not iteration)
                shapes[name] = tuple(weights.get_slice(name).get_shape())
    return shapes


def check_layers(path: Path, config: dict, shapes: dict[str, tuple[int, ...]]) -> None:
    """config.json asks for no more layers than the weights hold (a config that claims 100,000 layers over a
    2-layer model's weights would be built for minutes before its weights were found missing)."""
    held = {int(m.group(1)) for name in shapes if (m := LAYER.search(name))}
    for field in LAYER_FIELDS:
        asked = config.get(field)
        if held and whole(asked) and asked > max(held) + 1:
            raise ModelError(f"{path}/config.json: {field} is {asked}, but the weights hold {max(held) + 1} layers. "
                             f"{FIX_RECORDS}")


def _meta_model(path: Path, auto, overrides: dict):
    """The model `auto` builds from the dir's config.json (with `overrides`), on torch's meta device: its shapes,
    no memory."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    for key, value in overrides.items():
        setattr(config, key, value)
    with torch.device("meta"):
        return auto.from_config(config)


def check_fits_weights(path: Path, config: dict, files: list[Path], auto, overrides: dict) -> None:
    """Before any model is built: config.json's layers are bounded by the weights (`check_layers`), the model it
    builds fits this machine's memory, and (a dir of no recorded edits, whose weights have the shapes it builds)
    every weight's shape in the safetensors headers is the one config.json builds; the ModelError names the field,
    its value and what the weights hold."""
    shapes = weight_shapes(files)
    check_layers(path, config, shapes)
    model = _meta_model(path, auto, overrides)
    needed, free = sum(p.numel() * p.element_size() for p in model.parameters()), available_memory()
    if free is not None and needed > free:
        raise ModelError(f"{path}/config.json builds a model of {needed / 1e6:,.0f} MB, more than the "
                         f"{free / 1e6:,.0f} MB this machine has free. {FIX_RECORDS}")
    if config.get("pruned_heads") or config.get(WIDTH_RECORD) is not None or config.get(LOWRANK_RECORD):
        return  # built full size, then cut: `_load_rebuilt` compares the cut shapes
    wrong = _misfits(model, shapes, base_only=bool(overrides))
    if wrong:
        name, built, held = wrong[0]
        fields = [f"{field} is {config[field]}" for field in sorted(config) if whole(config.get(field), 1)
                  and config[field] in set(built) - set(held)]
        said = " or ".join(fields) if fields else "the shapes it builds differ"
        raise ModelError(f"{path}: weights that do not fit its config.json: {said}, but the weights hold {name} of "
                         f"shape {list(held)} (config.json builds "
                         f"{list(built)}){f'; and {len(wrong) - 1} more' if len(wrong) > 1 else ''}. {FIX_RECORDS}")


def _misfits(model, shapes: dict[str, tuple[int, ...]], base_only: bool) -> list[tuple[str, tuple, tuple]]:
    """(name, built shape, weights' shape) of every weight the headers and the built `model` both name (with or
    without the base model's prefix) whose shapes differ; `base_only`: the encoder's (a fresh head is drawn)."""
    prefix = f"{model.base_model_prefix}."
    def bare(name: str) -> str:
        return name.removeprefix(prefix)

    held = {bare(name): (name, shape) for name, shape in shapes.items()}
    built = {bare(name): tuple(t.shape) for name, t in model.state_dict().items()
             if not base_only or name.startswith(prefix)}
    return [(*held[name][:1], shape, held[name][1]) for name, shape in built.items()
            if name in held and held[name][1] != shape]


def load_pretrained(path: Path, auto_class: str, **overrides):
    """(model, tokenizer, loading info) of the HF model dir `path`, built by transformers' `auto_class`
    (AutoModelForSequenceClassification, AutoModel): checked whole first, refused when it asks for code from
    outside transformers, safetensors preferred; every failure a ModelError naming the fix. `overrides`: fields set
    over its config.json (a fresh head's num_labels and label names)."""
    import transformers
    from huggingface_hub.errors import StrictDataclassError
    from safetensors import SafetensorError

    path, auto = Path(path), getattr(transformers, auto_class)
    config = check_model_dir(path)
    check_no_remote_code(path, config)
    check_sizes(path, config)
    files = safetensors_files(path)  # refuses an index that names weight files outside the dir
    try:
        if files:  # a pickled .bin has no header to read without unpickling: transformers checks it as it loads
            check_fits_weights(path, config, files, auto, overrides)
        if config.get("pruned_heads") or config.get(WIDTH_RECORD) is not None or config.get(LOWRANK_RECORD):
            model, info = _load_rebuilt(path, files, auto, **overrides)
        else:
            model, info = auto.from_pretrained(path, use_safetensors=bool(files), trust_remote_code=False,
                                               output_loading_info=True, **overrides)
    except SafetensorError as e:
        raise ModelError(f"{path}: the weights file is corrupt or truncated ({e}). Fix: copy or save the model "
                         f"again (model.save_pretrained(DIR))") from None
    # RuntimeError: weights whose shapes do not fit; the others: config.json values of a type or size transformers
    # cannot build a model from ("384" for hidden_size, a list for id2label, 0 heads: a division by zero)
    except (OSError, ValueError, LookupError, RuntimeError, TypeError, AttributeError, ArithmeticError,
            StrictDataclassError) as e:
        if "ignore_mismatched_sizes" in str(e):  # transformers' words for weights of other shapes than the config's
            raise ModelError(f"{path}: weights of other shapes than its config.json builds. {FIX_RECORDS}") from None
        what = {"AutoModelForSequenceClassification": "a sequence classifier",
                "AutoModelForTokenClassification": "a token classifier"}.get(auto_class, "an encoder")
        fix = FIX_DIR if isinstance(e, OSError | ValueError | KeyError | RuntimeError) else (
            "Fix: give config.json's fields the values and types the model was saved with (model.save_pretrained(DIR) "
            "writes them)")
        raise ModelError(f"{path} could not be loaded as {what}: {e}\n{fix}") from None
    return model, load_hf_tokenizer(path), info


def load_hf_tokenizer(path: Path):
    """The transformers tokenizer of the model dir `path` (no remote code); a ModelError naming the fix when its
    files cannot be read."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except Exception as e:  # tokenizers raises a bare Exception for a tokenizer.json it cannot parse
        raise ModelError(f"{path}: the tokenizer files cannot be loaded ({e}). Fix: save the tokenizer again "
                         f"(tokenizer.save_pretrained(DIR))") from None


def with_new_head(path: Path, auto_class: str, id2label: dict[int, str], seed: int):
    """(model, tokenizer) of the pretrained encoder dir `path` (`load_pretrained`) with a fresh head for the labels
    `id2label`, its initial weights drawn after seeding with `seed`: a teacher fine-tuned from an encoder, a
    pretrained student."""
    from accelerate.utils import set_seed

    set_seed(seed)
    model, tokenizer, _ = load_pretrained(path, auto_class, num_labels=len(id2label), id2label=dict(id2label),
                                          label2id={label: i for i, label in id2label.items()})
    return model, tokenizer


def is_token_classifier_dir(path: str | Path) -> bool:
    """A token classifier's dir (NER, PII): its config.json names a ...ForTokenClassification architecture."""
    return (Path(path) / "config.json").is_file() and tags_tokens(read_model_config(Path(path)))


def load_classifier(path: str | Path, auto: str | None = None):
    """(model in eval mode, tokenizer) from an HF classifier dir whose head was trained, loaded by the transformers
    class `auto` (its task's; None: a token classifier where its config.json says so, `is_token_classifier_dir`,
    else a sequence classifier)."""
    path = Path(path)
    auto = auto or ("AutoModelForTokenClassification" if is_token_classifier_dir(path)
                    else "AutoModelForSequenceClassification")
    tokens = auto == "AutoModelForTokenClassification"
    model, tokenizer, info = load_pretrained(path, auto)
    prefix = f"{model.base_model_prefix}."  # the encoder's own weights, not the head's (the rebuilt: no unexpected)
    inside = {kind: sorted(name for name in info.get(f"{kind}_keys", ()) if name.startswith(prefix))
              for kind in ("missing", "unexpected")}
    if inside["missing"] or inside["unexpected"]:  # (unexpected: more layers in the weights than config.json has)
        names = "; ".join(f"{kind}: {', '.join(names[:3])}" for kind, names in inside.items() if names)
        raise ModelError(f"{path}: weights that do not fit its config.json ({names}). {FIX_RECORDS}")
    if info["missing_keys"]:
        raise ModelError(
            f"{path} has no trained classification head (missing: {', '.join(sorted(info['missing_keys'])[:4])}). "
            f"Fix: give a model fine-tuned for {'token' if tokens else 'sequence'} classification"
            f"{'' if tokens else ', or build one with `edgepress teacher`'}"
        )
    return model.eval(), tokenizer
