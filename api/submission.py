"""Reading a submission from the request body (YAML or JSON); the pipeline it then goes through,
checks to announcement, is scheduler/admission/submit.py."""

from __future__ import annotations

import json
from typing import Annotated, Any

import yaml
from fastapi import Depends, HTTPException, Query, Request
from pydantic import ValidationError

from api.openapi import register_body_schema
from api.schemas import PRIORITY_RANGE, SubmitRequest
from scheduler.admission.submit import Submission

YAML_TYPES = frozenset(
    {"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain"}
)
JSON_TYPE = "application/json"
# The YAML file's bytes as they are: what client generators send for a file body.
OCTET_TYPE = "application/octet-stream"

EXAMPLE_YAML = """name: digits-mlp
data: {source: digits, batch_size: 64}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: fc1, type: innerproduct, srclayers: [data], units: 10}
    - {name: loss, type: softmax_loss, srclayers: [fc1]}
updater: {type: sgd, lr: {base: 0.05}}
train_steps: 500
"""

# The body is read by hand (YAML or JSON), so its forms are declared for the OpenAPI document:
# the JSON form as the named schema SubmitRequest, the YAML as the file's bytes (api/openapi.py
# says why octet-stream stands for the YAML types there).
SUBMIT_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "the job as JSON {spec, overrides, priority}, or its YAML as it is "
        f"(application/octet-stream, or any of {', '.join(sorted(YAML_TYPES))})",
        "content": {
            JSON_TYPE: {
                "schema": register_body_schema("SubmitRequest", SubmitRequest.model_json_schema()),
                "example": {"spec": EXAMPLE_YAML, "overrides": {"train_steps": 100}},
            },
            OCTET_TYPE: {
                "schema": {"type": "string", "format": "binary"},
                "example": EXAMPLE_YAML,
            },
        },
    }
}


def _json_problem(error: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in item['loc']) or 'body'}: {item['msg']}"
        for item in error.errors()
    )


async def read_submission(
    request: Request,
    priority: Annotated[
        int | None,
        Query(
            ge=-PRIORITY_RANGE,
            le=PRIORITY_RANGE,
            description="higher runs first (overrides a priority in a JSON body)",
        ),
    ] = None,
) -> Submission:
    """The submitted job from the body; the size cap was applied as it arrived."""
    body = await request.body()
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media == JSON_TYPE:
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError) as error:
            raise HTTPException(422, f"the body is not valid JSON: {error}") from None
        try:
            parsed = SubmitRequest.model_validate(payload)
        except ValidationError as error:
            raise HTTPException(422, _json_problem(error)) from None
        spec = parsed.spec
        try:
            spec_yaml = spec if isinstance(spec, str) else yaml.safe_dump(spec, sort_keys=False)
        except RecursionError:
            raise HTTPException(422, "the job document is nested too deeply") from None
        return Submission(
            document=spec,
            spec_yaml=spec_yaml,
            overrides=parsed.overrides,
            priority=parsed.priority if priority is None else priority,
            base_dir=parsed.base_dir,
        )
    if media and media not in YAML_TYPES and media != OCTET_TYPE:
        raise HTTPException(
            415,
            f"content type '{media}' is not accepted; send the job as YAML "
            f"({', '.join(sorted(YAML_TYPES))}, or its bytes as {OCTET_TYPE}) or as JSON "
            f"({JSON_TYPE})",
        )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise HTTPException(422, f"the job is not UTF-8 text: {error}") from None
    return Submission(document=text, spec_yaml=text, priority=priority or 0)


SubmissionDep = Annotated[Submission, Depends(read_submission)]
