"""Named API tokens: several per user, optional expiry, listed and revoked through /tokens;
revocation takes effect at once, also in another API process's cache."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.app import create_app
from scheduler.store.models import ApiToken, utcnow


def token_count(api: Any) -> int:
    with api.db.session() as session:
        return session.scalar(select(func.count()).select_from(ApiToken)) or 0


def create(api: Any, caller: str = "alice", **body: Any) -> Any:
    return api.client.post("/api/v1/tokens", json=body, headers=api.auth(caller))


def test_a_user_creates_lists_and_uses_several_named_tokens(api: Any) -> None:
    laptop = create(api, name="laptop")
    ci = create(api, name="ci", expires_in_days=30)
    assert laptop.status_code == ci.status_code == 201, (laptop.text, ci.text)
    assert laptop.json()["expires_at"] is None and laptop.json()["user"] == "alice"
    expires = ci.json()["expires_at"]
    assert expires.startswith((utcnow() + timedelta(days=30)).date().isoformat())
    listed = api.client.get("/api/v1/tokens", headers=api.auth()).json()
    assert [t["name"] for t in listed] == ["tests", "laptop", "ci"]
    assert all("token" not in t for t in listed)  # the secret is shown once, at creation
    with_new = {"Authorization": f"Bearer {ci.json()['token']}"}
    assert api.client.get("/api/v1/jobs", headers=with_new).status_code == 200
    # bob sees none of them
    assert [
        t["name"] for t in api.client.get("/api/v1/tokens", headers=api.auth("bob")).json()
    ] == ["tests"]


def test_bad_token_requests_are_clear_4xx_and_change_nothing(api: Any) -> None:
    assert create(api, name="laptop").status_code == 201
    before = token_count(api)
    cases = [
        ({"name": "laptop"}, 409, "already has a token named 'laptop'"),
        ({"name": ""}, 422, "body.name"),
        ({"name": "x", "expires_in_days": 0}, 422, "body.expires_in_days"),
        ({"name": "x", "expires_in_days": 10**9}, 422, "body.expires_in_days"),
        ({"name": "x", "colour": "red"}, 422, "body.colour"),
        ({"name": "x", "user": "bob"}, 403, "only admins"),
    ]
    for body, status, message in cases:
        response = create(api, **body)
        assert response.status_code == status, (body, response.text)
        assert message in response.json()["detail"], (body, response.text)
    assert token_count(api) == before
    others = api.client.get("/api/v1/tokens", params={"user": "bob"}, headers=api.auth())
    assert others.status_code == 403
    everyone = api.client.get("/api/v1/tokens", params={"all": "true"}, headers=api.auth())
    assert everyone.status_code == 403


def test_revocation_takes_effect_at_once(api: Any) -> None:
    made = create(api, name="laptop").json()
    headers = {"Authorization": f"Bearer {made['token']}"}
    # used once: now in the API's token cache
    assert api.client.get("/api/v1/jobs", headers=headers).status_code == 200
    revoked = api.client.delete(f"/api/v1/tokens/{made['id']}", headers=api.auth())
    assert revoked.status_code == 204
    refused = api.client.get("/api/v1/jobs", headers=headers)
    assert refused.status_code == 401 and refused.json()["detail"] == "invalid API token"
    assert api.client.delete(f"/api/v1/tokens/{made['id']}", headers=api.auth()).status_code == 404
    # the other tokens still work
    assert api.client.get("/api/v1/jobs", headers=api.auth()).status_code == 200


def test_revocation_reaches_another_api_process_cache(api: Any) -> None:
    """A second app (another API worker) had the token cached; the announcement drops it."""
    made = create(api, name="shared").json()
    headers = {"Authorization": f"Bearer {made['token']}"}
    other_app = create_app(api.settings, web_dist=None)
    with TestClient(other_app) as other:
        assert other.get("/api/v1/jobs", headers=headers).status_code == 200
        deadline = time.monotonic() + 5
        assert (
            api.client.delete(f"/api/v1/tokens/{made['id']}", headers=api.auth()).status_code == 204
        )
        while (
            time.monotonic() < deadline
            and other.get("/api/v1/jobs", headers=headers).status_code != 401
        ):
            time.sleep(0.02)
        assert other.get("/api/v1/jobs", headers=headers).status_code == 401


def test_others_tokens_are_not_found_but_admins_manage_any(api: Any) -> None:
    made = create(api, "bob", name="bobs").json()
    before = token_count(api)
    assert (
        api.client.delete(f"/api/v1/tokens/{made['id']}", headers=api.auth("alice")).status_code
        == 404
    )
    assert token_count(api) == before
    listed = api.client.get("/api/v1/tokens", params={"user": "bob"}, headers=api.auth("admin"))
    assert [t["name"] for t in listed.json()] == ["tests", "bobs"]
    everyone = api.client.get("/api/v1/tokens", params={"all": "true"}, headers=api.auth("admin"))
    assert {t["user"] for t in everyone.json()} == {"admin", "alice", "bob"}
    for_bob = create(api, "admin", name="from-admin", user="bob")
    assert for_bob.status_code == 201 and for_bob.json()["user"] == "bob"
    missing = create(api, "admin", name="x", user="nobody")
    assert missing.status_code == 404 and "no user named 'nobody'" in missing.json()["detail"]
    assert (
        api.client.delete(f"/api/v1/tokens/{made['id']}", headers=api.auth("admin")).status_code
        == 204
    )
    bob_headers = {"Authorization": f"Bearer {made['token']}"}
    assert api.client.get("/api/v1/jobs", headers=bob_headers).status_code == 401


def test_an_expired_token_gets_401_saying_so(api: Any) -> None:
    made = create(api, name="short", expires_in_days=1).json()
    headers = {"Authorization": f"Bearer {made['token']}"}
    assert api.client.get("/api/v1/jobs", headers=headers).status_code == 200
    with api.db.session() as session:
        row = session.get(ApiToken, made["id"])
        assert row is not None
        row.expires_at = utcnow() - timedelta(seconds=1)
    api.app.state.services.tokens.clear()  # the cache holds it for seconds; the row decides
    refused = api.client.get("/api/v1/jobs", headers=headers)
    assert refused.status_code == 401
    assert refused.json()["detail"].startswith("the API token 'short' expired at ")
    assert refused.headers["www-authenticate"].startswith("Bearer")


def test_the_cache_never_outlives_a_token(api: Any) -> None:
    from api.deps import TokenCache
    from scheduler.store.models import User

    cache = TokenCache(seconds=60)
    user = User(id=1, name="x", is_admin=False)
    cache.put("soon", user, utcnow() + timedelta(seconds=0.2))
    cache.put("later", user, None)
    assert cache.get("soon") is user
    time.sleep(0.3)
    assert cache.get("soon") is None and cache.get("later") is user
