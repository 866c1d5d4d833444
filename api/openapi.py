"""The OpenAPI document as client generators read it (openapi-python-client, openapi-generator).

Three things FastAPI's defaults get in their way, set right here:
- operation ids: `jobs-submit`, `jobs-metrics`, `tokens-create` (the route's tag, then its
  function's name without the tag's own word), not `submit_job_api_v1_jobs_post`; a generated
  client's functions are named after them;
- request bodies are named schemas: a body read by hand (a submission, api/submission.py)
  refers to `SubmitRequest`; a form's `Body_<operation id>` becomes `<OperationId>Body`;
- a job's YAML is declared as `application/octet-stream` (the file's bytes as they are), a
  content type generators know, so they accept the operation without a warning per YAML type;
  the server takes the same body as application/yaml, text/yaml or text/plain too.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

REF = "#/components/schemas/"
# Schemas a hand-read body refers to, added to the document's components by name.
BODY_SCHEMAS: dict[str, dict[str, Any]] = {}


def operation_id(route: APIRoute) -> str:
    """`jobs-submit` for submit_job under the tag jobs; `jobs-metric-names` for
    job_metric_names. tests/api/test_openapi_clients.py holds them unique."""
    tag = str(route.tags[0]) if route.tags else "api"
    own = {tag, tag.removesuffix("s")}
    words = [word for word in route.name.split("_") if word not in own]
    return "-".join([tag, *words])


def register_body_schema(name: str, schema: dict[str, Any]) -> dict[str, str]:
    """Put `schema` in the document's components as `name`; returns the reference to it."""
    BODY_SCHEMAS[name] = schema
    return {"$ref": REF + name}


def _camel(text: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^0-9A-Za-z]+", text))


def _rename_refs(node: Any, renamed: dict[str, str]) -> Any:
    if isinstance(node, dict):
        return {
            key: (
                REF + renamed.get(value.removeprefix(REF), value.removeprefix(REF))
                if key == "$ref" and isinstance(value, str) and value.startswith(REF)
                else _rename_refs(value, renamed)
            )
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_rename_refs(item, renamed) for item in node]
    return node


def client_document(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document, built once, with named body schemas."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    document = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        description=app.description,
        routes=app.routes,
    )
    schemas: dict[str, Any] = document.setdefault("components", {}).setdefault("schemas", {})
    renamed = {name: _camel(name.removeprefix("Body_")) + "Body" for name in schemas}
    renamed = {old: new for old, new in renamed.items() if old.startswith("Body_")}
    document = _rename_refs(document, renamed)
    schemas = document["components"]["schemas"]
    for old, new in renamed.items():
        schemas[new] = {**schemas.pop(old), "title": new}
    schemas.update(BODY_SCHEMAS)
    document["components"]["schemas"] = dict(sorted(schemas.items()))
    app.openapi_schema = document
    return document


def install(app: FastAPI) -> None:
    """Serve the client document as the app's OpenAPI document."""
    app.openapi = lambda: client_document(app)  # type: ignore[method-assign]
