"""Character-level language modelling on a user's text file or a built-in English corpus.

The built-in corpus needs neither a download nor a data file: it is the documentation that ships
inside Python itself, the docstrings of a fixed list of standard-library modules and their public
functions, classes and methods, in a fixed order (about 160 KB on Python 3.11).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from pathlib import Path

import numpy as np

from dsl.data_config import TextData
from dsl.errors import DataSourceError
from workers.data.base import (
    DataInfo,
    Dataset,
    DataSource,
    register_source,
    resolve_file,
    split_train_test,
    to_dataset,
)

# Pure-Python modules with prose-rich documentation; the order is part of the corpus.
CORPUS_MODULES = (
    "textwrap",
    "difflib",
    "json",
    "collections",
    "argparse",
    "string",
    "calendar",
    "functools",
    "itertools",
    "pathlib",
    "heapq",
    "bisect",
    "fractions",
    "statistics",
    "shlex",
    "csv",
    "random",
    "datetime",
    "enum",
    "dataclasses",
    "contextlib",
    "pprint",
    "abc",
    "typing",
    "logging",
)


@functools.cache
def builtin_corpus() -> str:
    """Docstrings of CORPUS_MODULES and their public members, each text once, blank-line joined."""
    texts: list[str] = []
    seen: set[str] = set()

    def add(obj: object) -> None:
        doc = inspect.getdoc(obj)
        if doc and doc not in seen:
            seen.add(doc)
            texts.append(doc)

    for name in CORPUS_MODULES:
        module = importlib.import_module(name)
        add(module)
        for attr, obj in sorted(vars(module).items()):
            if attr.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
                continue
            # Re-exports and aliases would repeat text or pull in modules outside the list.
            if obj.__module__ != name or obj.__name__ != attr:
                continue
            add(obj)
            if inspect.isclass(obj):
                for member_name, member in sorted(vars(obj).items()):
                    if member_name.startswith("_"):
                        continue
                    if isinstance(member, classmethod | staticmethod):
                        member = member.__func__
                    if inspect.isroutine(member) or isinstance(member, property):
                        add(member)
    return "\n\n".join(texts)


@register_source("text")
class TextSource(DataSource[TextData]):
    def load(self, config: TextData, *, seed: int, cache_dir: Path, base_dir: Path) -> Dataset:
        text, where = self._text(config, base_dir)
        val_text = self._val_text(config, base_dir)
        # Code points sorted ascending are the sorted set of characters, so `ids` index `vocab`;
        # a validation file's characters join the vocabulary, numbered alike.
        codes = np.frombuffer((text + val_text).encode("utf-32-le"), dtype=np.uint32)
        vocab_codes, all_ids = np.unique(codes, return_inverse=True)
        ids, val_ids = all_ids[: len(text)], all_ids[len(text) :]
        vocabulary = "".join(map(chr, vocab_codes))
        length = config.seq_len
        x, y = _windows(ids, length)
        if len(x) < 2:
            raise DataSourceError(
                f"{where} has {len(ids)} characters: fewer than 2 windows of seq_len {length} "
                "(plus one character to predict)",
                hint="use a longer text or a smaller seq_len",
                field="seq_len" if config.path is None and config.dataset is None else "path",
            )
        info = DataInfo(
            sample_shape=(length,),
            num_classes=len(vocabulary),
            label_shape=(length,),
            label_is_index=True,
            x_dtype="int64",
            vocabulary=vocabulary,
        )
        splits = split_train_test(x, y, config.test_fraction, seed)
        if config.val_path is None:
            return to_dataset(info, *splits)
        x_val, y_val = _windows(val_ids, length)
        if len(x_val) == 0:
            raise DataSourceError(
                f"{config.val_path} has {len(val_ids)} characters: not one window of seq_len "
                f"{length} (plus one character to predict)",
                hint="use a longer validation text or a smaller seq_len",
                field="val_path",
            )
        return to_dataset(info, *splits, x_val, y_val)

    def _val_text(self, config: TextData, base_dir: Path) -> str:
        if config.val_path is None:
            return ""
        return _read_text(resolve_file(config.val_path, base_dir, field="val_path"), "val_path")

    def _text(self, config: TextData, base_dir: Path) -> tuple[str, str]:
        if config.dataset is not None:  # run locally: the service's jobs have its path
            path = resolve_file(f"{config.dataset}.txt", base_dir, field="dataset")
            return _read_text(path, "dataset"), f"dataset '{config.dataset}'"
        if config.path is None:
            text = builtin_corpus()
            if not text:
                raise DataSourceError(
                    "the built-in corpus is empty: Python runs without docstrings (-OO)",
                    hint="run without -OO / PYTHONOPTIMIZE=2, or give a text file as path",
                    field="path",
                )
            return text, "the built-in corpus"
        path = resolve_file(config.path, base_dir)
        return _read_text(path, "path"), str(path)


def _windows(ids: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping windows of `length` characters (W, T) and the character after each
    (W, T)."""
    windows = (len(ids) - 1) // length if len(ids) else 0
    used = windows * length
    return ids[:used].reshape(windows, length), ids[1 : used + 1].reshape(windows, length)


def _read_text(path: Path, field: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataSourceError(
            f"{path} is not UTF-8 text: {error}", hint="save the file as UTF-8", field=field
        ) from error
    except OSError as error:
        raise DataSourceError(f"cannot read {path}: {error}", field=field) from error
