"""Named API tokens: several per user, optional expiry, listed and revoked through /tokens;
revocation takes effect at once, also in another API process's cache."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.app import create_app
from scheduler.store.models import ApiToken, User, utcnow


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
    from api.deps import Caller, TokenCache
    from scheduler.store.models import User

    cache = TokenCache(seconds=60)
    user = User(id=1, name="x", is_admin=False)
    cache.put(Caller(user, 1, "soon", utcnow() + timedelta(seconds=0.2)))
    cache.put(Caller(user, 2, "later", None))
    assert cache.get("soon").user is user  # type: ignore[union-attr]
    time.sleep(0.3)
    assert cache.get("soon") is None and cache.get("later").user is user  # type: ignore[union-attr]


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def test_a_token_mints_only_tokens_that_expire_no_later_than_itself(api: Any) -> None:
    """A stolen short-lived token cannot buy itself a long life through its offspring."""
    short = create(api, name="short", expires_in_days=2).json()
    with_short = bearer(short["token"])
    inherits = api.client.post("/api/v1/tokens", json={"name": "child"}, headers=with_short)
    assert inherits.status_code == 201, inherits.text
    assert inherits.json()["expires_at"] == short["expires_at"]
    before = token_count(api)
    for days in (3, 3650):
        longer = api.client.post(
            "/api/v1/tokens",
            json={"name": f"long{days}", "expires_in_days": days},
            headers=with_short,
        )
        assert longer.status_code == 422, longer.text
        assert longer.json()["detail"].startswith("expires_in_days: ")
        assert "at most 1 days" in longer.json()["detail"]
    assert token_count(api) == before
    shorter = api.client.post(
        "/api/v1/tokens", json={"name": "shorter", "expires_in_days": 1}, headers=with_short
    )
    assert shorter.status_code == 201 and shorter.json()["expires_at"] < short["expires_at"]
    # A child that inherits an expiry passes it on: its own children are held to it too.
    grandchild = api.client.post(
        "/api/v1/tokens",
        json={"name": "grandchild", "expires_in_days": 30},
        headers=bearer(inherits.json()["token"]),
    )
    assert grandchild.status_code == 422
    # alice's "tests" token never expires: it is a root, and may mint tokens that never expire.
    assert create(api, name="forever").json()["expires_at"] is None


def test_revoking_a_token_revokes_everything_it_minted(api: Any) -> None:
    parent = create(api, name="parent").json()
    child = api.client.post(
        "/api/v1/tokens", json={"name": "child"}, headers=bearer(parent["token"])
    ).json()
    grandchild = api.client.post(
        "/api/v1/tokens", json={"name": "grandchild"}, headers=bearer(child["token"])
    ).json()
    sibling = create(api, name="sibling").json()  # minted by alice's "tests", not by parent
    family = [parent, child, grandchild]
    for made in (*family, sibling):  # each cached by the API
        assert api.client.get("/api/v1/jobs", headers=bearer(made["token"])).status_code == 200
    assert (
        api.client.delete(f"/api/v1/tokens/{parent['id']}", headers=api.auth()).status_code == 204
    )
    for made in family:
        assert api.client.get("/api/v1/jobs", headers=bearer(made["token"])).status_code == 401
    assert api.client.get("/api/v1/jobs", headers=bearer(sibling["token"])).status_code == 200
    assert api.client.get("/api/v1/jobs", headers=api.auth()).status_code == 200
    names = {t["name"] for t in api.client.get("/api/v1/tokens", headers=api.auth()).json()}
    assert names == {"tests", "sibling"}


def test_a_token_cannot_revoke_its_minters(api: Any) -> None:
    """A stolen 1-day child token could revoke its user's root token and lock the user out;
    it may revoke itself, its own offspring and unrelated tokens, never a minter."""
    parent = create(api, name="parent").json()
    child = api.client.post(
        "/api/v1/tokens",
        json={"name": "child", "expires_in_days": 1},
        headers=bearer(parent["token"]),
    ).json()
    grandchild = api.client.post(
        "/api/v1/tokens", json={"name": "grandchild"}, headers=bearer(child["token"])
    ).json()
    with api.db.session() as session:
        root = session.scalar(
            select(ApiToken.id)
            .join(User, User.id == ApiToken.user_id)
            .where(ApiToken.label == "tests", User.name == "alice")
        )
    with_grandchild = bearer(grandchild["token"])
    before = token_count(api)
    for minter in (child["id"], parent["id"], root):  # its minter, and theirs
        refused = api.client.delete(f"/api/v1/tokens/{minter}", headers=with_grandchild)
        assert refused.status_code == 403, refused.text
        assert "may not revoke its minters" in refused.json()["detail"]
    assert token_count(api) == before
    for made in (parent, child):
        assert api.client.get("/api/v1/jobs", headers=bearer(made["token"])).status_code == 200
    assert api.client.get("/api/v1/jobs", headers=api.auth()).status_code == 200
    # A minter revokes its offspring; a token revokes itself.
    sibling = api.client.post(
        "/api/v1/tokens", json={"name": "sibling"}, headers=bearer(child["token"])
    ).json()
    assert (
        api.client.delete(f"/api/v1/tokens/{sibling['id']}", headers=bearer(child["token"]))
    ).status_code == 204
    assert (
        api.client.delete(f"/api/v1/tokens/{grandchild['id']}", headers=with_grandchild)
    ).status_code == 204
    assert api.client.get("/api/v1/jobs", headers=with_grandchild).status_code == 401


def test_an_admin_revoking_a_users_token_revokes_its_offspring(api: Any) -> None:
    parent = create(api, name="stolen").json()
    child = api.client.post(
        "/api/v1/tokens", json={"name": "offspring"}, headers=bearer(parent["token"])
    ).json()
    listed = api.client.get("/api/v1/tokens", params={"all": "true"}, headers=api.auth("admin"))
    assert {"stolen", "offspring"} <= {t["name"] for t in listed.json() if t["user"] == "alice"}
    assert (
        api.client.delete(f"/api/v1/tokens/{parent['id']}", headers=api.auth("admin")).status_code
        == 204
    )
    assert api.client.get("/api/v1/jobs", headers=bearer(child["token"])).status_code == 401


def test_token_creation_is_rate_limited_and_capped(api: Any) -> None:
    per_minute = api.settings.token_creations_per_minute
    for number in range(per_minute):
        assert create(api, name=f"t{number}").status_code == 201
    before = token_count(api)
    refused = create(api, name="one-too-many")
    assert refused.status_code == 429, refused.text
    assert "token_creations_per_minute" in refused.json()["detail"]
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert token_count(api) == before
    # bob has his own allowance; held to a cap of 2 tokens, he holds "tests" and one more.
    services = api.app.state.services
    services.settings = services.settings.model_copy(update={"tokens_per_user": 2})
    assert create(api, "bob", name="second").status_code == 201
    capped = create(api, "bob", name="third")
    assert capped.status_code == 403 and "tokens_per_user" in capped.json()["detail"]


def test_a_repeated_bad_token_costs_no_query(api: Any) -> None:
    from sqlalchemy import event

    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(args[2])

    engine = api.app.state.services.db.engine  # the app's own pool
    event.listen(engine, "before_cursor_execute", count)
    try:
        bad = bearer("not-a-token")
        for _ in range(20):
            response = api.client.get("/api/v1/jobs", headers=bad)
            assert response.status_code == 401 and response.json()["detail"] == "invalid API token"
    finally:
        event.remove(engine, "before_cursor_execute", count)
    lookups = [sql for sql in statements if "api_tokens" in sql]
    assert len(lookups) == 1, lookups


def test_a_token_revoked_elsewhere_but_still_cached_mints_nothing(api: Any) -> None:
    """Another process revoked it and this one has not heard yet: its cache still says yes."""
    made = create(api, name="gone").json()
    assert api.client.get("/api/v1/jobs", headers=bearer(made["token"])).status_code == 200
    with api.db.session() as session:  # revoked without telling this process
        session.delete(session.get(ApiToken, made["id"]))
    before = token_count(api)
    minted = api.client.post("/api/v1/tokens", json={"name": "late"}, headers=bearer(made["token"]))
    assert minted.status_code == 403 and "has been revoked" in minted.json()["detail"]
    assert token_count(api) == before
