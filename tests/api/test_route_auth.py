"""Every route of the app refuses a request without a token (401), except the few that are
public on purpose, each listed here with why. The routes come from the app itself
(`fastapi.routing.iter_route_contexts`), so a route added tomorrow is checked tomorrow: a new
public one fails here until it is listed."""

from __future__ import annotations

import re
from typing import Any

from fastapi.routing import iter_route_contexts

# (method, path) -> why anyone may call it
PUBLIC = {
    ("GET", "/api/v1/openapi.json"): "the API's description: what the clients are generated from",
    ("GET", "/docs"): "the interactive documentation page (it calls the API with a token)",
    ("GET", "/docs/oauth2-redirect"): "part of the documentation page",
    ("GET", "/healthz"): "load balancers and orchestrators probe it without credentials",
    ("GET", "/api/v1/healthz"): "the same probe under the API's prefix",
}


def routes(app: Any) -> list[tuple[str, str]]:
    found = []
    for context in iter_route_contexts(app.routes):
        for method in sorted(getattr(context, "methods", None) or ()):
            if method != "HEAD":  # answered as GET
                found.append((method, str(context.path)))
    return found


def test_every_route_but_the_public_ones_answers_401_without_a_token(api: Any) -> None:
    every = routes(api.app)
    assert len(every) >= 35, every  # the enumeration reaches into the included routers
    assert set(PUBLIC) <= set(every), set(PUBLIC) - set(every)
    answered = {}
    for method, path in every:
        concrete = re.sub(r"\{name\}", "alice", re.sub(r"\{\w+\}", "1", path))
        response = api.client.request(method, concrete)
        answered[(method, path)] = response.status_code
    wrong = {
        route: status
        for route, status in answered.items()
        if (status >= 400 if route in PUBLIC else status != 401)
    }
    assert not wrong, wrong
    # A bad token is refused the same way.
    bad = {"Authorization": "Bearer forged"}
    for method, path in every:
        if (method, path) not in PUBLIC:
            concrete = re.sub(r"\{name\}", "alice", re.sub(r"\{\w+\}", "1", path))
            assert api.client.request(method, concrete, headers=bad).status_code == 401, path
