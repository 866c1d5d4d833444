"""The job-language reference (docs/dsl.md) and schema (docs/job.schema.json) match the code.

Names come from the registries and the pydantic models, so a new layer type, data source,
updater, schedule or key fails here until it is documented. Every YAML snippet in the reference
is validated, and the complete ones are compiled, so the examples cannot rot.
"""

from __future__ import annotations

import re
import types
import typing
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from pydantic import BaseModel

from dsl.compiler import compile_job
from dsl.data_config import DataConfig, DataSourceConfig
from dsl.frameworks import FRAMEWORK_SPECS
from dsl.init import ParamSpec
from dsl.layers.base import LAYERS, BuildContext, LayerConfig
from dsl.objective import ObjectiveConfig
from dsl.schema import (
    BPTTConfig,
    CDConfig,
    CheckpointConfig,
    ClusterConfig,
    EarlyStopConfig,
    JobSpec,
    NeuralNetConfig,
    PipelineConfig,
    ResourcesConfig,
    TestConfig,
    ValidateConfig,
    json_schema_text,
)
from dsl.updater_config import (
    ClipConfig,
    LRConfig,
    ScheduleName,
    SGDConfig,
    UpdaterBase,
    UpdaterConfig,
)
from workers.data import DATA_SOURCES, describe
from workers.schedules import SCHEDULES
from workers.updaters import UPDATERS

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REFERENCE = (DOCS / "dsl.md").read_text(encoding="utf-8")

KEYS_HEADER = "|key|type|default|meaning|"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
HEADING = re.compile(r"^(#{1,6}) (.+)$")
CODE = re.compile(r"`([^`\n]+)`")

# A valid job that YAML fragments are merged into, so each fragment is checked in place.
SKELETON: dict[str, Any] = {
    "name": "docs-snippet",
    "data": {"source": "digits"},
    "neuralnet": {
        "layers": [
            {"name": "data", "type": "input"},
            {"name": "fc", "type": "dense", "srclayers": ["data"]},
            {"name": "loss", "type": "softmax_loss", "srclayers": ["fc"]},
        ]
    },
    "updater": {"type": "sgd", "lr": {"base": 0.1}},
    "train_steps": 1,
}
# Sections whose keys tables document models shared by several parts of a job.
SHARED_TABLES: dict[str, tuple[type[BaseModel], ...]] = {
    "Top-level keys": (JobSpec,),
    "data: data sources": (DataSourceConfig,),
    "neuralnet: layers and how they connect": (NeuralNetConfig, LayerConfig),
    "Parameters": (ParamSpec,),
    "`bptt`": (BPTTConfig,),
    "`cd`": (CDConfig,),
    "updater: optimiser, learning rate and clipping": (UpdaterBase, SGDConfig),
    "Learning-rate schedules": (LRConfig,),
    "Clipping": (ClipConfig,),
    "`test`": (TestConfig,),
    "`checkpoint`": (CheckpointConfig,),
    "`validate`": (ValidateConfig,),
    "`objective`": (ObjectiveConfig,),
    "`early_stop`": (EarlyStopConfig,),
    "cluster: the topology": (ClusterConfig, ResourcesConfig),
    "pipeline: pipeline stages": (PipelineConfig,),
}
REQUIRED_TOP_LEVEL = {key for key, field in JobSpec.model_fields.items() if field.is_required()}


def _prose(text: str) -> str:
    """The text without its fenced code blocks (whose `#` comments are not headings)."""
    return FENCE.sub("", text)


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading, text up to the next heading) for every heading outside code blocks."""
    out: list[tuple[str, list[str]]] = []
    in_code = False
    for line in text.splitlines():
        in_code ^= line.startswith("```")
        match = None if in_code else HEADING.match(line)
        if match:
            out.append((match.group(2), []))
        elif out:
            out[-1][1].append(line)
    return [(heading, "\n".join(body)) for heading, body in out]


SECTIONS = _sections(REFERENCE)


def _code_spans(text: str) -> set[str]:
    """Names written in backticks in the prose (code blocks left out)."""
    return set(CODE.findall(_prose(text)))


def _keys_rows(text: str) -> list[list[str]]:
    """The rows (key, type, default, meaning) of the keys tables in `text`."""
    rows: list[list[str]] = []
    for table in re.findall(r"(?:^\|.*\n?)+", _prose(text), re.M):
        header, _, *body = table.strip().splitlines()
        if header.replace(" ", "") != KEYS_HEADER:
            continue
        for line in body:
            cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
            assert len(cells) == 4, f"keys table row with {len(cells)} cells: {line}"
            rows.append([cells[0].strip("`"), *cells[1:]])
    return rows


def _table_keys(text: str) -> set[str]:
    return {row[0] for row in _keys_rows(text)}


def _section_of(name: str) -> tuple[str, str]:
    """The section whose heading names `name` first in backticks, e.g. "`dense` (alias ...)"."""
    for heading, body in SECTIONS:
        named = CODE.findall(heading)
        if named and named[0] == name:
            return heading, body
    raise AssertionError(f"docs/dsl.md has no heading for `{name}`")


def _union_members(annotation: Any) -> list[type[BaseModel]]:
    """The models of a (possibly Annotated) union such as DataConfig."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _union_members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _union_members(a)]
    return (
        [annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []
    )


def _tags(model: type[BaseModel], key: str) -> tuple[str, ...]:
    return typing.get_args(model.model_fields[key].annotation)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _reachable_models() -> list[type[BaseModel]]:
    """Every model that validates some part of a job document."""
    seen: dict[type[BaseModel], None] = {}
    todo: list[type[BaseModel]] = [JobSpec]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen[model] = None
        for field in model.model_fields.values():
            todo.extend(_models_in(field.annotation))
    return list(seen)


def _layer_classes() -> list[type[LayerConfig]]:
    return list(dict.fromkeys(cls for _, cls in LAYERS.items()))


def _keys_tables() -> list[tuple[str, str, tuple[type[BaseModel], ...]]]:
    """(heading, section text, the models its keys tables document) for every keys table."""
    tables = [
        (heading, body, models)
        for heading, models in SHARED_TABLES.items()
        for h, body in SECTIONS
        if h == heading
    ]
    for cls in _layer_classes():
        tables.append((*_section_of(_tags(cls, "type")[0]), (cls,)))
    for model in _union_members(DataConfig):
        tables.append((*_section_of(_tags(model, "source")[0]), (model,)))
    for model in _union_members(UpdaterConfig):
        tables.append((*_section_of(_tags(model, "type")[0]), (model,)))
    return tables


def _default_agrees(cell: str, field: Any) -> bool:
    """Whether a default cell (`required`, `unset`, a `literal` or words) fits the field."""
    if cell.startswith("required"):
        return bool(field.is_required())
    if field.is_required():
        return False
    if cell == "unset":
        return field.default is None
    literal = re.fullmatch(r"`([^`]+)`", cell)
    if literal is None:  # words such as "the kernel": what an unset value means
        return True
    value = yaml.safe_load(literal.group(1))
    if isinstance(value, str) and re.fullmatch(r"-?\d+(\.\d*)?e-?\d+", value):
        value = float(value)  # YAML 1.1 reads 1e-8 as a string
    default = field.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):
        dumped = default.model_dump()
        return isinstance(value, dict) and all(dumped.get(k) == v for k, v in value.items())
    return bool(value == default)


def _yaml_blocks(text: str = REFERENCE) -> list[tuple[int, str]]:
    """(line number, text) of every ```yaml block."""
    return [
        (text.count("\n", 0, match.start()) + 1, match.group(2))
        for match in FENCE.finditer(text)
        if match.group(1) == "yaml"
    ]


def _github_slug(heading: str) -> str:
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_schema_file_is_current() -> None:
    published = (DOCS / "job.schema.json").read_text(encoding="utf-8")
    assert published == json_schema_text(), (
        "docs/job.schema.json is stale: run `trainyard schema --output docs/job.schema.json`"
    )


@pytest.mark.parametrize("cls", _layer_classes(), ids=lambda cls: _tags(cls, "type")[0])
def test_every_layer_type_has_a_section_with_its_keys(cls: type[LayerConfig]) -> None:
    names = _tags(cls, "type")
    assert sorted(names) == sorted(n for n, c in LAYERS.items() if c is cls)
    heading, body = _section_of(names[0])
    assert set(names) <= _code_spans(heading), f"aliases {names} missing from '{heading}'"
    own_keys = set(cls.model_fields) - set(LayerConfig.model_fields)
    missing = sorted(own_keys - _table_keys(body))
    assert not missing, f"the keys table of section '{heading}' lacks {missing}"
    snippets = [text for _, text in _yaml_blocks(body)]
    assert any(f"type: {name}," in text for text in snippets for name in names), (
        f"section '{heading}' has no YAML snippet using the type"
    )


@pytest.mark.parametrize("model", _union_members(DataConfig), ids=lambda m: _tags(m, "source")[0])
def test_every_data_source_has_a_section_with_its_keys(model: type[DataSourceConfig]) -> None:
    heading, body = _section_of(_tags(model, "source")[0])
    own_keys = set(model.model_fields) - set(DataSourceConfig.model_fields)
    missing = sorted(own_keys - _table_keys(body))
    assert not missing, f"the keys table of section '{heading}' lacks {missing}"


def test_data_sources_of_the_language_are_the_registered_ones() -> None:
    documented = sorted(_tags(m, "source")[0] for m in _union_members(DataConfig))
    assert documented == DATA_SOURCES.names()


@pytest.mark.parametrize("model", _union_members(UpdaterConfig), ids=lambda m: _tags(m, "type")[0])
def test_every_updater_has_a_section_with_its_keys(model: type[UpdaterBase]) -> None:
    heading, body = _section_of(_tags(model, "type")[0])
    own_keys = set(model.model_fields) - set(UpdaterBase.model_fields) - {"type"}
    missing = sorted(own_keys - _table_keys(body))
    assert not missing, f"the keys table of section '{heading}' lacks {missing}"


def test_updaters_of_the_language_are_the_registered_ones() -> None:
    documented = sorted(_tags(m, "type")[0] for m in _union_members(UpdaterConfig))
    assert documented == UPDATERS.names()


@pytest.mark.parametrize("name", SCHEDULES.names())
def test_every_schedule_has_a_section_with_its_formula(name: str) -> None:
    heading, body = _section_of(name)
    assert "lr = " in body, f"section '{heading}' gives no formula"


def test_schedules_of_the_language_are_the_registered_ones() -> None:
    assert sorted(typing.get_args(ScheduleName)) == SCHEDULES.names()


def test_the_frameworks_table_is_the_registered_frameworks() -> None:
    """docs/distributed.md's table of the frameworks: each descriptor's preset groups and its
    line, so a new framework fails here until it is documented."""
    text = (DOCS / "distributed.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\w+) \| (\d+) x (\d+) \| [^|]+ \| ([^|]+) \|$", text, re.M)
    documented = {
        name: (int(groups), int(workers), doc.strip()) for name, groups, workers, doc in rows
    }
    assert documented == {
        name: (spec.preset.nworker_groups, spec.preset.nworkers_per_group, spec.doc)
        for name, spec in FRAMEWORK_SPECS.items()
    }


def test_every_top_level_key_is_in_the_top_level_table() -> None:
    _, body = next(section for section in SECTIONS if section[0] == "Top-level keys")
    missing = sorted(set(JobSpec.model_fields) - _table_keys(body))
    assert not missing


def test_keys_tables_give_the_real_defaults() -> None:
    tables = _keys_tables()
    assert {heading for heading, _, _ in tables} >= set(SHARED_TABLES)
    wrong = []
    for heading, body, models in tables:
        for key, _, default, _ in _keys_rows(body):
            fields = [m.model_fields[key] for m in models if key in m.model_fields]
            if not fields or not any(_default_agrees(default, f) for f in fields):
                wrong.append(f"{heading}: `{key}` default {default!r}")
    assert not wrong


def test_every_key_of_the_language_is_documented() -> None:
    spans = _code_spans(REFERENCE)
    missing = sorted(
        f"{model.__name__}.{key}"
        for model in _reachable_models()
        for key in model.model_fields
        if key not in spans
    )
    assert not missing


def test_every_example_is_in_the_examples_table() -> None:
    _, body = next(section for section in SECTIONS if section[0] == "Examples")
    files = sorted(path.name for path in (ROOT / "examples").glob("*.yaml"))
    assert files
    missing = [name for name in files if f"`{name}`" not in body]
    assert not missing


def test_annotated_example_is_the_example_file() -> None:
    _, first = _yaml_blocks()[0]
    example = (ROOT / "examples" / "mnist1d_cnn.yaml").read_text(encoding="utf-8")
    assert yaml.safe_load(first) == yaml.safe_load(example)


def test_links_inside_the_reference_resolve() -> None:
    slugs: Counter[str] = Counter()
    anchors = set()
    for heading, _ in SECTIONS:
        slug = _github_slug(heading)
        anchors.add(slug if not slugs[slug] else f"{slug}-{slugs[slug]}")
        slugs[slug] += 1
    targets = set(re.findall(r"\]\(#([^)]+)\)", _prose(REFERENCE)))
    assert targets
    assert not sorted(targets - anchors)


@pytest.mark.parametrize(("line", "text"), _yaml_blocks(), ids=[str(n) for n, _ in _yaml_blocks()])
def test_yaml_snippet_is_valid(line: int, text: str, tmp_path: Path) -> None:
    """Complete jobs and nets compile to modules; fragments validate inside a skeleton job."""
    snippet = yaml.safe_load(text)
    assert isinstance(snippet, dict), f"the block at line {line} is not a mapping"
    if snippet.keys() >= REQUIRED_TOP_LEVEL:
        document = snippet
    elif "layers" in snippet:
        layers = snippet["layers"]
        whole_net = len(layers) > 1 and any(layer["type"] == "input" for layer in layers)
        if not whole_net:  # a few layers out of a net: check each on its own
            for layer in layers:
                LAYERS.get(layer["type"]).model_validate(layer)
            return
        document = {**SKELETON, "neuralnet": {"layers": layers}}
    else:
        JobSpec.model_validate({**SKELETON, **snippet})
        return

    def described(spec: JobSpec) -> BuildContext:
        info = describe(spec.data, seed=spec.seed, cache_dir=tmp_path, base_dir=ROOT)
        return info.build_context()

    job = compile_job(document, described)
    assert [row.name for row in job.table]
    assert sum(p.numel() for p in job.net.parameters()) > 0


def _rooms() -> list[str]:
    """scheduler/'s rooms: its sub-packages and its modules at the top."""
    folder = Path(__file__).resolve().parents[1] / "scheduler"
    rooms = [p.name for p in folder.iterdir() if (p / "__init__.py").exists()]
    rooms += [p.stem for p in folder.glob("*.py") if not p.stem.startswith("__")]
    return sorted(rooms)


def test_the_layout_tables_name_every_room() -> None:
    """README's layout and docs/architecture.md's rooms say what every folder of scheduler/
    holds; a room added or renamed fails here until they do."""
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    architecture = (root / "docs" / "architecture.md").read_text()
    rooms = _rooms()
    assert len(rooms) >= 10
    for room in rooms:
        folder = (root / "scheduler" / room).is_dir()
        if folder:
            assert f"| `scheduler/{room}/` |" in readme, f"README's layout lacks scheduler/{room}/"
        name = f"`{room}/`" if folder else f"`{room}.py`"
        assert f"| {name} |" in architecture, f"docs/architecture.md's rooms lack {name}"
    for package in ("contract", "dsl", "workers", "api", "trainyard", "web"):
        assert f"| `{package}/` |" in readme and f"| `{package}/` |" in architecture
