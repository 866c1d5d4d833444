"""The job's `data:` section: one config model per data source, chosen by its `source` key.

Only the configuration lives here (the job language imports nothing from the workers); the
loaders that read these configs are registered in `workers.data` under the same `source` names.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from dsl.config import StrictModel

# The most numbers a generated dataset may hold (4 GB as float32): the worker holds all of its
# splits in memory, and the service checks this bound at submission, before anything runs.
MAX_GENERATED_ELEMENTS = 2**30


class DataSourceConfig(StrictModel):
    """Keys every data source has. Subclasses narrow `source` to a Literal."""

    source: str = Field(description="which data source loads the samples")
    batch_size: int = Field(
        default=64, gt=0, description="global batch of one worker group (split across its workers)"
    )
    test_fraction: float = Field(
        default=0.2,
        gt=0.0,
        lt=1.0,
        description="share of the samples held out as the test split, drawn with the job seed",
    )
    shuffle: bool = Field(default=True, description="reshuffle the training split every epoch")
    validation_fraction: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="share of the training split held out as the validation split, drawn with "
        "the job seed (the test split stays as it is); 0 = no validation split",
    )

    # Keys that name a validation split the source reads from its own file(s).
    validation_keys: ClassVar[tuple[str, ...]] = ()

    def has_validation(self) -> bool:
        """Whether the job has a validation split: a fraction of the training split, or the
        source's own validation samples."""
        given = any(getattr(self, key) is not None for key in self.validation_keys)
        return self.validation_fraction > 0 or given

    @model_validator(mode="after")
    def _one_validation_split(self) -> DataSourceConfig:
        given = [key for key in self.validation_keys if getattr(self, key) is not None]
        if given and self.validation_fraction > 0:
            raise ValueError(
                f"give either validation_fraction or {' and '.join(given)} (the validation "
                "samples the source reads), not both"
            )
        return self


class DigitsData(DataSourceConfig):
    """scikit-learn's bundled 8x8 handwritten digits (1797 samples): x (1, 8, 8) in [0, 1]."""

    source: Literal["digits"]


class Mnist1dData(DataSourceConfig):
    """MNIST-1D (Greydanus 2020), generated offline with the job seed and cached as .npz."""

    source: Literal["mnist1d"]
    test_fraction: float = Field(
        default=0.2,
        gt=0.0,
        lt=1.0,
        description="ignored: MNIST-1D keeps its own 80/20 train/test split so results are "
        "comparable with the paper",
    )
    num_samples: int = Field(
        default=5000,
        ge=10,
        le=10_000_000,
        description="samples generated in all, rounded down to a multiple of the 10 classes "
        "(the paper's 5000 give 4000 train / 1000 test)",
    )
    sequence: bool = Field(
        default=False,
        description="false: x is (1, 40) (channels, length) for conv1d; "
        "true: x is (40, 1) (time, features) for recurrent nets",
    )


def _both_or_neither(x_val_key: str | None, y_val_key: str | None) -> None:
    if (x_val_key is None) != (y_val_key is None):
        raise ValueError("x_val_key and y_val_key name the validation split together: give both")


SyntheticTask = Literal["classification", "images", "sequence"]


class SyntheticData(DataSourceConfig):
    """Generated toy problems for smoke tests and tutorials."""

    source: Literal["synthetic"]
    task: SyntheticTask = Field(
        default="classification",
        description="classification: gaussian blobs, x (num_features,); images: class-dependent "
        "bars plus noise, x (channels, image_size, image_size); sequence: the adding problem, "
        "x (seq_len, 2), regression target y (1,)",
    )
    num_samples: int = Field(
        default=2000, ge=2, le=100_000_000, description="samples generated in all"
    )
    num_features: int = Field(
        default=20, gt=0, le=1_000_000, description="features per sample (classification)"
    )
    num_classes: int = Field(
        default=4, ge=2, le=100_000, description="number of classes (classification, images)"
    )
    noise: float = Field(
        default=1.0,
        ge=0.0,
        description="standard deviation of the gaussian noise on every feature or pixel "
        "(classification, images)",
    )
    image_size: int = Field(default=8, ge=4, le=256, description="height and width (images)")
    channels: int = Field(default=1, gt=0, le=64, description="image channels (images)")
    seq_len: int = Field(
        default=20, ge=2, le=100_000, description="time steps of the adding problem (sequence)"
    )

    # The keys each task reads; setting another task's key is a mistake worth reporting.
    task_keys: ClassVar[dict[str, tuple[str, ...]]] = {
        "classification": ("num_features", "num_classes", "noise"),
        "images": ("image_size", "channels", "num_classes", "noise"),
        "sequence": ("seq_len",),
    }

    @model_validator(mode="after")
    def _keys_fit_task(self) -> SyntheticData:
        all_keys = {key for keys in self.task_keys.values() for key in keys}
        foreign = sorted((all_keys - set(self.task_keys[self.task])) & self.model_fields_set)
        if foreign:
            raise ValueError(
                f"{', '.join(foreign)} do(es) not apply to task '{self.task}' "
                f"(it reads: {', '.join(self.task_keys[self.task])})"
            )
        if self.num_samples * self.sample_elements > MAX_GENERATED_ELEMENTS:
            raise ValueError(
                f"num_samples {self.num_samples} x {self.sample_elements} numbers per sample "
                f"is more than the {MAX_GENERATED_ELEMENTS:,} numbers a generated dataset may "
                "hold (each worker holds them all in memory)"
            )
        if self.task == "images" and self.num_classes > 4 * (self.image_size // 2):
            raise ValueError(
                f"image_size {self.image_size} fits at most {4 * (self.image_size // 2)} "
                f"distinct bar patterns, got num_classes {self.num_classes}"
            )
        return self

    @property
    def sample_elements(self) -> int:
        """The numbers of one sample's x."""
        if self.task == "classification":
            return self.num_features
        if self.task == "images":
            return self.channels * self.image_size**2
        return self.seq_len * 2


class NpzData(DataSourceConfig):
    """Arrays from a numpy .npz file. Integer labels mean classification, float regression."""

    source: Literal["npz"]
    path: str = Field(description="the .npz file, relative to the job file's folder")
    x_key: str = Field(
        default="x",
        description="array of samples (N, ...); float arrays load as float32 features, "
        "integer arrays as int64 token ids (store pixels as float)",
    )
    y_key: str = Field(
        default="y",
        description="array of labels (N, ...); integers are class indices (num_classes = max + 1), "
        "floats are regression targets",
    )
    x_test_key: str = Field(
        default="x_test",
        description="test samples; when the file holds both test keys they are the test split "
        "and test_fraction is ignored, otherwise the test split is drawn from x_key's samples; "
        "a key set explicitly must be in the file",
    )
    y_test_key: str = Field(default="y_test", description="test labels; see x_test_key")
    x_val_key: str | None = Field(
        default=None,
        description="validation samples in the file: with y_val_key, the validation split "
        "(instead of validation_fraction)",
    )
    y_val_key: str | None = Field(default=None, description="validation labels; see x_val_key")

    validation_keys: ClassVar[tuple[str, ...]] = ("x_val_key",)

    @model_validator(mode="after")
    def _validation_pair(self) -> NpzData:
        _both_or_neither(self.x_val_key, self.y_val_key)
        return self


class CsvData(DataSourceConfig):
    """A comma-separated file of numeric features and one label column."""

    source: Literal["csv"]
    path: str = Field(description="the .csv file, relative to the job file's folder")
    label_column: int | str = Field(
        default=-1,
        description="the label column: an index (negative counts from the end) or a header name; "
        "integer labels mean classification, decimals regression",
    )
    header: bool = Field(default=True, description="the first row names the columns")
    val_path: str | None = Field(
        default=None,
        description="a second .csv file with the same columns, relative to the job file's "
        "folder: the validation split (instead of validation_fraction)",
    )

    validation_keys: ClassVar[tuple[str, ...]] = ("val_path",)

    @model_validator(mode="after")
    def _named_label_needs_header(self) -> CsvData:
        if isinstance(self.label_column, str) and not self.header:
            raise ValueError("a label_column given by name needs header: true")
        return self


DATASET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$"


class TextData(DataSourceConfig):
    """Character-level language modelling: predict every next character of a window."""

    source: Literal["text"]
    path: str | None = Field(
        default=None,
        description="UTF-8 text file, relative to the job file's folder; empty (and no "
        "dataset) for the built-in corpus (docstrings of Python's standard library, about "
        "160 KB of English)",
    )
    dataset: str | None = Field(
        default=None,
        pattern=DATASET_NAME_PATTERN,
        description="instead of path: a text dataset you uploaded (a .txt file, POST "
        "/api/v1/datasets/uploads); run locally, <dataset>.txt beside the job file",
    )
    seq_len: int = Field(
        default=64, gt=0, le=1_000_000, description="characters per sample; windows do not overlap"
    )
    val_path: str | None = Field(
        default=None,
        description="a second UTF-8 text file, relative to the job file's folder: the validation "
        "split, cut into windows as path is (instead of validation_fraction)",
    )

    validation_keys: ClassVar[tuple[str, ...]] = ("val_path",)

    @model_validator(mode="after")
    def _path_or_dataset(self) -> TextData:
        if self.path is not None and self.dataset is not None:
            raise ValueError("give path or dataset (an uploaded text), not both")
        return self


class DatasetData(DataSourceConfig):
    """A dataset uploaded to the service (POST /datasets) and referred to by its name: an .npz
    archive or a .csv table, read like the npz and csv sources with the options below, or a
    folder of npy shards (a table with text columns or a Parquet file, converted at upload),
    read into memory with its categories."""

    source: Literal["dataset"]
    name: str = Field(
        pattern=DATASET_NAME_PATTERN,
        description="the name the dataset was uploaded under (yours; an admin's job may only "
        "name the admin's own uploads); run locally, <name>.npz, <name>.csv or the shard "
        "folder <name>/ beside the job file",
    )
    x_key: str | None = Field(default=None, description="npz datasets: see the npz source")
    y_key: str | None = Field(default=None, description="npz datasets: see the npz source")
    x_test_key: str | None = Field(default=None, description="npz datasets: see the npz source")
    y_test_key: str | None = Field(default=None, description="npz datasets: see the npz source")
    x_val_key: str | None = Field(default=None, description="npz datasets: see the npz source")
    y_val_key: str | None = Field(default=None, description="npz datasets: see the npz source")
    label_column: int | str | None = Field(
        default=None, description="csv datasets: see the csv source"
    )
    header: bool | None = Field(default=None, description="csv datasets: see the csv source")
    path: str | None = Field(
        default=None,
        description="set by the service when it checks the job: the folder of a shards "
        "dataset (a table converted at upload); leave it out",
    )

    # The options only one file kind reads; the rest of the keys apply to all. A shards
    # dataset (a table converted at upload, its label chosen then) reads none of them.
    kind_keys: ClassVar[dict[str, tuple[str, ...]]] = {
        "npz": ("x_key", "y_key", "x_test_key", "y_test_key", "x_val_key", "y_val_key"),
        "csv": ("label_column", "header"),
        "shards": (),
    }
    validation_keys: ClassVar[tuple[str, ...]] = ("x_val_key",)

    @model_validator(mode="after")
    def _validation_pair(self) -> DatasetData:
        _both_or_neither(self.x_val_key, self.y_val_key)
        return self

    def foreign_keys(self, kind: str) -> list[str]:
        """Keys set here that a dataset of `kind` does not read."""
        own = set(self.kind_keys[kind])
        other = {key for keys in self.kind_keys.values() for key in keys} - own
        return sorted(
            key for key in other & self.model_fields_set if getattr(self, key) is not None
        )

    def as_file(self, kind: Literal["npz", "csv"], path: str) -> NpzData | CsvData:
        """The npz or csv source reading the stored file; unset options keep that source's
        defaults (and stay unset, which matters to npz's optional test keys)."""
        common = {"batch_size", "test_fraction", "shuffle", "validation_fraction"}
        common |= set(self.kind_keys[kind])
        values = {
            key: getattr(self, key)
            for key in common & self.model_fields_set
            if getattr(self, key) is not None
        }
        if kind == "npz":
            return NpzData(source="npz", path=path, **values)
        return CsvData(source="csv", path=path, **values)


class ShardTest(StrictModel):
    """The test split of a sharded dataset: whole shards, the last ones by name."""

    shards: int = Field(
        default=1,
        ge=1,
        le=100_000,
        description="how many shards (the last by name) are the test split",
    )


class ShardsData(DataSourceConfig):
    """A folder of shards streamed from disk while training (docs/data.md): each worker reads
    only its part, a bounded number of batches ahead; a dataset may be larger than memory."""

    source: Literal["shards"]
    path: str | None = Field(
        default=None,
        description="the folder of shards, relative to the job file's folder (a server folder: "
        "admins only)",
    )
    dataset: str | None = Field(
        default=None,
        pattern=DATASET_NAME_PATTERN,
        description="an uploaded dataset stored as a folder of shards (yours); run locally, the "
        "folder <name>/ beside the job file",
    )
    format: Literal["npy", "parquet"] = Field(
        default="npy",
        description="npy: NNNNN.x.npy + NNNNN.y.npy pairs, read by memory map; parquet: a "
        "column x (fixed-size list) or scalar feature columns, and y, read by row group",
    )
    shuffle_buffer: int = Field(
        default=8192,
        ge=1,
        le=1_000_000,
        description="samples shuffled together (with shuffle): the stream is cut into windows "
        "of this many samples, shared out among the group's workers, each window shuffled with "
        "the seed; the shard order is reshuffled every epoch",
    )
    test: ShardTest | None = Field(
        default=None,
        description="the test split as whole shards: {shards: N}, the last N by name "
        "(default: the last shard, unless test_path is given)",
    )
    test_path: str | None = Field(
        default=None,
        description="a second folder of shards in the same format, the test split (admins "
        "only on the service)",
    )
    test_fraction: float = Field(
        default=0.2,
        gt=0.0,
        lt=1.0,
        description="ignored: the test split of a sharded dataset is whole shards (test) or "
        "test_path",
    )
    validation_fraction: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="share of the training shards held out as the validation split: whole "
        "shards (round(fraction x shards), at least one), chosen with the job seed",
    )

    @model_validator(mode="after")
    def _one_folder(self) -> ShardsData:
        if (self.path is None) == (self.dataset is None):
            raise ValueError("give the folder of shards as path, or an uploaded one as dataset")
        if self.test is not None and self.test_path is not None:
            raise ValueError("give the test split as test: {shards: N} or as test_path, not both")
        return self


DataConfig = Annotated[
    DigitsData
    | Mnist1dData
    | SyntheticData
    | NpzData
    | CsvData
    | TextData
    | DatasetData
    | ShardsData,
    Field(discriminator="source"),
]
