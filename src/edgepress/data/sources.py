"""Reading user data: a .csv or .jsonl file, a directory of per-split files, or a saved Hugging Face dataset."""

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

from edgepress.device.lines import text_lines
from edgepress.errors import DataError, missing

SPLIT_ALIASES = {"train": ("train",), "validation": ("validation", "valid", "dev"), "test": ("test",)}
UNLABELED = ("unsupervised", "unlabeled", "unlabelled")  # splits without labels (IMDB's unsupervised: labels -1)
FILE_KINDS = (".csv", ".jsonl")
SHOWN = 5  # rows named in an error message
FIX_SOURCE = (
    "Fix: give a .csv or .jsonl file, a directory with train (and test) .csv/.jsonl files, a dataset saved with "
    "datasets' save_to_disk, or demo:movie-snippets"
)


def row_numbers(indices: list[int], noun: str = "row", verb: tuple[str, str] = ("do not", "does not")) -> str:
    """Rows `indices` (0-based) as an error names them, with what they do: 1-based, the first SHOWN, and how many
    more; one row in the singular ("row 4 does not"), more in the plural ("rows 4, 8 do not")."""
    more = f" and {len(indices) - SHOWN} more" if len(indices) > SHOWN else ""
    numbers = ", ".join(str(i + 1) for i in indices[:SHOWN]) + more
    return f"{noun} {numbers} {verb[1]}" if len(indices) == 1 else f"{noun}s {numbers} {verb[0]}"


def column_texts(rows: list[dict], column: str, where: str) -> tuple[str, ...]:
    """The stripped texts of `column` in every row; a DataError naming the rows whose value is not non-empty text."""
    values = [row.get(column) for row in rows]
    bad = [i for i, v in enumerate(values) if not isinstance(v, str) or not v.strip()]
    if bad:
        raise DataError(
            f"{where}: column '{column}' must hold non-empty text; {row_numbers(bad)} "
            f"(first: {values[bad[0]]!r}). Fix: drop or fill those rows"
        )
    return tuple(v.strip() for v in values)


@dataclass(frozen=True)
class RawSource:
    """Records per split (`{"all": rows}` when the source has no splits of its own) and the label names it knows;
    `ignored` names the splits of the source that are not read (unlabeled, or not train/validation/test)."""

    splits: dict[str, list[dict]]
    label_names: tuple[str, ...] | None = None
    ignored: tuple[str, ...] = ()


def split_role(name: str) -> str | None:
    """train, validation or test for a split name in any case (`TEST`, `Dev`), else None."""
    return next((role for role, aliases in SPLIT_ALIASES.items() if name.lower() in aliases), None)


def read_text(path: Path) -> str:
    """The text of a data file, UTF-8 (a BOM allowed): the one way every data reader opens its file. A file that
    cannot be read or is not UTF-8 is a DataError naming it."""
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}). Fix: save it as UTF-8") from None
    except OSError as e:
        raise DataError(f"{path} cannot be read: {e.strerror}. Fix: check the path and its permissions") from None


def _read_csv(path: Path) -> list[dict]:
    reader = csv.DictReader(io.StringIO(read_text(path), newline=""))  # csv's own line ends: \n, \r\n, \r
    rows = list(reader)
    header = reader.fieldnames or []
    other = next((sep for sep in ";\t|" if len(header) == 1 and sep in header[0]), None)
    if other:
        raise DataError(f"{path} looks {other!r}-separated (its header is {header[0]!r}); edgepress reads comma-"
                        f"separated CSV. Fix: save it with commas (pandas: df.to_csv(path, index=False))")
    ragged = [i for i, row in enumerate(rows, start=2) if None in row]  # DictReader files extra fields under None
    if ragged:
        raise DataError(f"{path}: line {ragged[0]} has more fields than the header"
                        f"{f' (and {len(ragged) - 1} more lines)' if len(ragged) > 1 else ''}. Fix: quote text that "
                        f"holds commas, or remove the extra fields")
    return rows


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(text_lines(read_text(path)), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            message = f"{path}: line {number} is not valid JSON ({e.msg}). Fix: one JSON object per line"
            raise DataError(message) from e
        if not isinstance(row, dict):
            raise DataError(f"{path}: line {number} is a JSON {type(row).__name__}, not an object. Fix: one JSON "
                            f"object per line")
        rows.append(row)
    return rows


def named_file(value: str, field: str, suffixes: tuple[str, ...], fix_missing: str, fix_kind: str,
               where: str | None = None) -> Path:
    """The file the config field `field` (data.unlabeled, ...) names as `value`, checked to exist and to end in one
    of `suffixes`; each DataError names the field (`where`: as the kind error names it) and its fix."""
    path = Path(value).expanduser()
    if not path.exists():
        raise DataError(f"{field} {missing(value)}. Fix: {fix_missing}")
    if not path.is_file() or path.suffix not in suffixes:
        kinds = ", ".join(suffixes[:-1]) + f" or {suffixes[-1]}"
        raise DataError(f"{where or f'{field} {value}'} is not a {kinds} file. Fix: {fix_kind}")
    return path


def read_file(path: Path) -> list[dict]:
    try:
        if path.suffix == ".csv":
            return _read_csv(path)
        return read_jsonl(path)
    except csv.Error as e:  # a NUL byte, an unterminated quote at the end of the file
        raise DataError(f"{path} is not a readable CSV file ({e}). Fix: save it as plain UTF-8 CSV text") from e


def split_files(directory: Path, kinds: tuple[str, ...] = FILE_KINDS) -> dict[str, Path]:
    """{train, validation, test: the file of `directory` for it}, by name (train.csv, TEST.jsonl, dev.csv), of the
    suffixes `kinds`; two files for one split are an error."""
    found: dict[str, list[Path]] = {}
    for split, aliases in SPLIT_ALIASES.items():
        for file in sorted(directory.iterdir()):
            if file.is_file() and file.suffix in kinds and file.stem.lower() in aliases:
                found.setdefault(split, []).append(file)
    twice = {split: files for split, files in found.items() if len(files) > 1}
    if twice:
        split, files = next(iter(twice.items()))
        raise DataError(f"data directory {directory} has {len(files)} files for the {split} split "
                        f"({', '.join(f.name for f in files)}). Fix: keep one of them")
    return {split: files[0] for split, files in found.items()}


def _read_hf_dataset(directory: Path, label_column: str) -> RawSource:
    from datasets import ClassLabel, DatasetDict, load_from_disk

    try:
        loaded = load_from_disk(str(directory))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # datasets' on missing or damaged files
        raise DataError(f"{directory} looks like a saved dataset but cannot be loaded ({e}). Fix: save it again "
                        f"with dataset.save_to_disk(DIR)") from e
    parts = dict(loaded) if isinstance(loaded, DatasetDict) else {"all": loaded}
    splits, label_names, ignored = {}, None, []
    for name, part in parts.items():
        role = "all" if name == "all" else split_role(name)
        if role is None or role in splits or name.lower() in UNLABELED or _unlabeled(part, label_column):
            ignored.append(name)
            continue
        splits[role] = part.to_list()
        feature = part.features.get(label_column)
        if isinstance(feature, ClassLabel):
            label_names = tuple(feature.names)
    if not splits:
        raise DataError(f"{directory} has no labelled train, validation or test split (splits: "
                        f"{', '.join(parts) or 'none'}). Fix: name the labelled splits train and test (validation "
                        f"optional), e.g. DatasetDict(train=..., test=...).save_to_disk(DIR)")
    return RawSource(splits, label_names, tuple(ignored))


def _unlabeled(part, label_column: str) -> bool:
    """Every label is -1 (datasets' ClassLabel for "no label"), or the label column is missing while others exist."""
    if label_column not in part.column_names:
        return False  # the label column check names it
    return len(part) > 0 and all(label == -1 for label in part[label_column])


def _is_hf_dataset(directory: Path) -> bool:
    return (directory / "dataset_dict.json").is_file() or (directory / "state.json").is_file()


def read_source(source: str, label_column: str) -> RawSource:
    """The records of a user data source, per split when the source has its own splits."""
    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(f"data source {missing(source)}. {FIX_SOURCE}")
    if path.is_file():
        if path.suffix not in FILE_KINDS:
            raise DataError(f"data source {source} is a {path.suffix or 'suffix-less'} file. {FIX_SOURCE}")
        return RawSource({"all": read_file(path)})
    if _is_hf_dataset(path):
        return _read_hf_dataset(path, label_column)
    files = split_files(path)
    if "train" not in files:
        found = ", ".join(sorted(p.name for p in files.values())) or "none"
        raise DataError(f"data directory {source} needs a train file (found: {found}). {FIX_SOURCE}")
    return RawSource({split: read_file(file) for split, file in files.items()})
