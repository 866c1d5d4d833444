"""The dashboard's build (web/dist) served at /, with index.html for paths that are no file.

The dashboard routes with the URL's fragment (/#/jobs/7), so every page is index.html; a path
such as /jobs, typed or bookmarked, gets the same page instead of a 404. Paths under /api are
never answered with the page: an unknown API route stays a JSON 404.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope


class Dashboard(StaticFiles):
    def __init__(self, directory: str) -> None:
        super().__init__(directory=directory, html=True)

    async def get_response(self, path: str, scope: Scope) -> Response:
        try:
            return await super().get_response(path, scope)
        except HTTPException as exc:
            if exc.status_code != 404 or path.split("/", 1)[0] == "api":
                raise
            return await super().get_response("index.html", scope)
