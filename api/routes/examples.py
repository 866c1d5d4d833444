"""/examples: the example jobs shipped in examples/, for the dashboard's editor to start from."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from pydantic import BaseModel, Field

from api.deps import CurrentUser
from api.schemas import errors

router = APIRouter(tags=["examples"])

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"


class ExampleOut(BaseModel):
    name: str = Field(description="the file's stem, e.g. mnist1d_cnn")
    description: str = Field(description="the file's leading comment lines, joined")
    yaml: str = Field(description="the job document")


def leading_comment(text: str) -> str:
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def load_examples(folder: Path = EXAMPLES_DIR) -> list[ExampleOut]:
    """Every *.yaml in the folder by name; an installation without the folder has none."""
    out = []
    for path in sorted(folder.glob("*.yaml")):
        text = path.read_text()
        out.append(ExampleOut(name=path.stem, description=leading_comment(text), yaml=text))
    return out


@router.get(
    "/examples",
    response_model=list[ExampleOut],
    summary="Example jobs",
    description="The job documents in the server's examples/ folder, by file name, to start "
    "a new job from.",
    responses=errors(401),
)
def list_examples(_: CurrentUser) -> list[ExampleOut]:
    return load_examples()
