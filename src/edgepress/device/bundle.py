"""What a bundle dir holds: the graph, the tokenizer, config.json (with id2label), and the manifest."""

import json
import os
from pathlib import Path

from .errors import ModelError, access_denied
from .locks import check_not_written

BUNDLE_FILES = ("model.onnx", "tokenizer.json", "config.json")
MANIFEST = "edgepress.json"
MODULES = "modules.json"  # a sentence-transformers dir's list of modules: how it pools its token vectors
# The tasks a model can do, by the names edgepress.tasks gives them and every bundle's manifest records (its
# `task`), each with the graph output its reader reads
CLASSIFICATION, TOKEN_CLASSIFICATION, EMBEDDING = "classification", "token-classification", "embedding"
TASK_OUTPUTS = {CLASSIFICATION: "logits", TOKEN_CLASSIFICATION: "logits", EMBEDDING: "sentence_embedding"}


def json_value(path: Path, fix: str = "Fix: export or bundle the model again"):
    """The JSON value in the file at `path`: the one reader of the JSON files edgepress and a bundle read (a
    model's config.json, a manifest, a run's records). A file that cannot be read or is not UTF-8 JSON is a
    ModelError ending in `fix`."""
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except PermissionError as e:
        raise access_denied(e) from None
    except OSError as e:
        raise ModelError(f"{path} cannot be read: {e.strerror or e}. {fix}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path} is not valid JSON ({e}). {fix}") from None


def json_object(path: Path, fix: str = "Fix: export or bundle the model again") -> dict:
    """The JSON object in the file at `path` (`json_value`); another JSON value is a ModelError ending in `fix`."""
    value = json_value(path, fix)
    if not isinstance(value, dict):
        raise ModelError(f"{path} holds a JSON {type(value).__name__}, not an object. {fix}")
    return value


def whole(value, least: int = 0) -> bool:
    """`value` is a whole number of at least `least`, as JSON writes one (true and false are not numbers here)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def whole_field(config: dict, field: str, default: int | None, least: int, where: str = "config.json") -> int:
    """config.json's `field` (`default` where it is not given), a whole number of at least `least`, or a ModelError
    naming it (`where`: the file, as the message names it)."""
    value = config.get(field, default)
    if not whole(value, least):
        raise ModelError(f"{where}: {field} must be a whole number of at least {least}; got {value!r}. Fix: restore "
                         f"the config.json saved with the model")
    return value


def check_readable(directory: Path) -> None:
    """Every file of the model dir `directory` can be opened, and every dir in it listed: what the system refuses is
    an AccessDenied naming it, before a library reads it and reports the refusal as something else (a missing
    weights file, a corrupt graph); a dir another process is writing (it, or a dir above it) is an InUse. Other
    failures are left to the reader of that file."""
    def refused(e: OSError) -> None:
        if isinstance(e, PermissionError):
            raise access_denied(e) from None

    check_not_written(directory)

    for root, _, files in os.walk(directory, onerror=refused):
        for name in files:
            try:
                os.close(os.open(os.path.join(root, name), os.O_RDONLY))
            except OSError as e:
                refused(e)


def model_file(manifest: dict) -> str:
    """The graph's path in a bundle: model.onnx, or where the manifest says (a web bundle keeps it in onnx/)."""
    return manifest.get("model_file", BUNDLE_FILES[0])


def onnx_path(artifact: Path) -> Path | None:
    """The .onnx file of an artifact (a file, a dir holding model.onnx, or a bundle whose manifest says where its
    graph is: a web bundle's onnx/), None for a torch model dir."""
    artifact = Path(artifact)
    if artifact.suffix == ".onnx":
        return artifact
    manifest = artifact / MANIFEST
    graph = artifact / model_file(json_object(manifest) if manifest.is_file() else {})
    return graph if graph.is_file() else None


def read_bundle(bundle: Path) -> tuple[dict, dict]:
    """(config.json, edgepress.json or {}) of a bundle or exported model dir (its files all readable)."""
    check_readable(bundle)
    manifest_path = bundle / MANIFEST
    manifest = json_object(manifest_path) if manifest_path.is_file() else {}
    missing = [name for name in (model_file(manifest), *BUNDLE_FILES[1:]) if not (bundle / name).is_file()]
    if missing:
        raise ModelError(f"{bundle} is not a model bundle: missing {', '.join(missing)}. Fix: point at the final/ "
                         f"dir of a run, a dir written by `edgepress bundle`, or one written by `edgepress export`")
    return json_object(bundle / "config.json"), manifest


def files_task(directory: Path) -> str:
    """The task the files of a model dir say, as every reader of one reads them: a sentence-transformers dir
    (modules.json) embeds; one whose config.json names a ...ForTokenClassification architecture tags tokens; any
    other classifies texts."""
    directory = Path(directory)
    if (directory / MODULES).is_file():
        return EMBEDDING
    config = directory / "config.json"
    if config.is_file() and tags_tokens(json_object(config, "Fix: restore the config.json saved with the model")):
        return TOKEN_CLASSIFICATION
    return CLASSIFICATION


def tags_tokens(config: dict) -> bool:
    """A token classifier's config.json (NER, PII): it names a ...ForTokenClassification architecture."""
    architectures = config.get("architectures") or []
    return isinstance(architectures, list) and any(str(a).endswith("ForTokenClassification") for a in architectures)


def bundle_task(directory: Path, manifest: dict) -> str:
    """The task of the model in `directory`, read once: the one its manifest records (every bundle's `task`), else,
    for a model dir without one (`edgepress export`'s, a run's stage), what its files say (`files_task`). A task
    the manifest names that is none of edgepress's is a ModelError."""
    if "task" not in manifest:
        return files_task(directory)
    if not isinstance(manifest["task"], str) or manifest["task"] not in TASK_OUTPUTS:
        raise ModelError(f"{Path(directory) / MANIFEST}: task {manifest['task']!r} is none of "
                         f"{', '.join(TASK_OUTPUTS)}. Fix: bundle the model again with `edgepress bundle`")
    return manifest["task"]


def label_names(config: dict, where: Path) -> dict[int, str]:
    """config.json's id2label as {output row: label name} (empty where it has none); one that is not a mapping of
    whole numbers to names is a ModelError naming it."""
    given = config.get("id2label", {})
    try:
        names = {int(row): name for row, name in given.items()} if isinstance(given, dict) else None
    except ValueError:
        names = None
    if names is None or not all(isinstance(name, str) for name in names.values()):
        raise ModelError(f"{where}/config.json: id2label must map each output row's number to its label's name, e.g. "
                         f"{{\"0\": \"negative\", \"1\": \"positive\"}}; got {str(given)[:120]}. Fix: export the model "
                         f"again with `edgepress export` (which writes the names), or correct id2label")
    return names
