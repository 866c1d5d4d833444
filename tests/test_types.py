"""The clients' types (trainyard/models.py, web/src/types.gen.ts) are what scripts/gen_types.py
makes of the API's current OpenAPI document: a change to api/schemas.py fails here until
regenerated."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_types", ROOT / "scripts" / "gen_types.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


GEN = _generator()


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    openapi: dict[str, Any] = GEN.openapi_document()
    return openapi


def test_generated_types_are_current(document: dict[str, Any]) -> None:
    stale = [
        str(path.relative_to(ROOT))
        for path, text in GEN.outputs(document).items()
        if path.read_text(encoding="utf-8") != text
    ]
    assert not stale, f"{stale} differ from the API's schemas: run `make types`"


def test_derived_schemas_extend_their_base(document: dict[str, Any]) -> None:
    schemas = GEN.response_schemas(document)
    assert GEN.base_of("JobDetail", schemas) == "JobOut"
    assert list(schemas).index("JobOut") < list(schemas).index("JobDetail")


def test_an_unknown_construct_stops_the_generator() -> None:
    uuid = {"type": "string", "format": "uuid"}
    schemas = {"Odd": {"type": "object", "properties": {"x": uuid}, "required": ["x"]}}
    with pytest.raises(GEN.UnsupportedSchema, match="uuid"):
        GEN.python_models(schemas)
    with pytest.raises(GEN.UnsupportedSchema, match=r"Odd\.y"):
        GEN.typescript_types({"Odd": {"type": "object", "properties": {"y": {"not": {}}}}})
