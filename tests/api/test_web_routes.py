"""What the dashboard needs from the server: the example jobs (api/routes/examples.py), the
built pages at / with index.html for other paths (api/dashboard.py), and the live stream's token
as a query parameter (a browser's EventSource cannot send headers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anyio import to_thread
from fastapi.testclient import TestClient

from api.app import create_app
from api.routes.examples import leading_comment
from scheduler.store.lifecycle import transition
from scheduler.store.models import Job
from scheduler.store.states import JobState

ROOT = Path(__file__).resolve().parents[2]
MLP = (ROOT / "examples" / "digits_mlp.yaml").read_text()


def test_examples_are_the_example_files_with_their_comments(api: Any) -> None:
    assert api.client.get("/api/v1/examples").status_code == 401
    response = api.client.get("/api/v1/examples", headers=api.auth())
    assert response.status_code == 200
    listed = {item["name"]: item for item in response.json()}
    files = sorted((ROOT / "examples").glob("*.yaml"))
    assert sorted(listed) == [path.stem for path in files]
    for path in files:
        assert listed[path.stem]["yaml"] == path.read_text()
    cnn = listed["mnist1d_cnn"]["description"]
    assert cnn.startswith("A 1-D CNN on MNIST-1D") and "#" not in cnn


def test_leading_comment_stops_at_the_first_other_line() -> None:
    text = "# one\n#two\nname: x\n# not this\n"
    assert leading_comment(text) == "one two"
    assert leading_comment("name: x\n") == ""


def test_dashboard_pages_at_the_root_never_hide_the_api(api: Any, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    (dist / "assets").mkdir(parents=True)
    (dist / "index.html").write_text("<html>dashboard</html>")
    (dist / "assets" / "app.js").write_text("console.log('app')")
    with TestClient(create_app(api.settings, web_dist=dist)) as client:
        assert client.get("/").text == "<html>dashboard</html>"
        assert client.get("/assets/app.js").text == "console.log('app')"
        # A path that is no file (typed, bookmarked) gets the page; the page routes by fragment.
        for path in ("/jobs", "/jobs/7/graph"):
            response = client.get(path)
            assert (response.status_code, response.text) == (200, "<html>dashboard</html>")
        for path in ("/api/v1/no-such-route", "/api/nothing"):
            response = client.get(path)
            assert response.status_code == 404
            assert response.json()["detail"] == "Not Found"
        assert client.get("/api/v1/examples", headers=api.auth()).status_code == 200
        assert client.get("/healthz").json()["status"] == "ok"


def test_stream_takes_a_one_use_ticket_for_one_job_never_the_token(api: Any) -> None:
    job_id = api.submit(MLP)["id"]
    other_id = api.submit(MLP)["id"]
    with api.db.session() as session:
        transition(session, session.get(Job, job_id), JobState.CANCELLED, "test: ended")
    url = f"/api/v1/jobs/{job_id}/stream"

    def ticket(user: str = "alice", job: int = job_id) -> str:
        issued = api.client.post(f"/api/v1/jobs/{job}/stream-ticket", headers=api.auth(user))
        assert issued.status_code == 200, issued.text
        assert issued.json()["expires_in"] == api.settings.stream_ticket_seconds
        return str(issued.json()["ticket"])

    first = ticket()
    with api.client.stream("GET", url, params={"ticket": first}) as response:
        assert response.status_code == 200
        kinds = [
            line.split(": ", 1)[1] for line in response.iter_lines() if line.startswith("event")
        ]
    assert kinds == ["state", "end"]
    used = api.client.get(url, params={"ticket": first})
    assert used.status_code == 401 and "used or expired stream ticket" in used.json()["detail"]
    assert api.client.get(url, params={"ticket": "wrong"}).status_code == 401
    elsewhere = api.client.get(f"/api/v1/jobs/{other_id}/stream", params={"ticket": ticket()})
    assert elsewhere.status_code == 401
    assert f"for job {job_id}, not job {other_id}" in elsewhere.json()["detail"]
    # The long-lived token is no longer taken in the URL.
    refused = api.client.get(url, params={"token": api.tokens["alice"]})
    assert refused.status_code == 401 and refused.json()["detail"].startswith("missing API token")
    # Only the job's owner (or an admin) gets a ticket; the header wins over a ticket.
    nope = api.client.post(f"/api/v1/jobs/{job_id}/stream-ticket", headers=api.auth("bob"))
    assert nope.status_code == 404
    response = api.client.get(url, params={"ticket": ticket()}, headers=api.auth("bob"))
    assert response.status_code == 404


def test_a_stream_ticket_expires(api: Any) -> None:
    job_id = api.submit(MLP)["id"]
    issued = api.client.post(f"/api/v1/jobs/{job_id}/stream-ticket", headers=api.auth())
    key = api.keys.stream_ticket(issued.json()["ticket"])
    assert 0 < api.redis.ttl(key) <= api.settings.stream_ticket_seconds
    api.redis.delete(key)  # what its TTL does
    response = api.client.get(
        f"/api/v1/jobs/{job_id}/stream", params={"ticket": issued.json()["ticket"]}
    )
    assert response.status_code == 401


def test_the_api_thread_pool_is_sized_by_the_settings(api: Any) -> None:
    settings = api.settings.model_copy(update={"api_threads": 3})

    def tokens() -> float:
        return float(to_thread.current_default_thread_limiter().total_tokens)

    with TestClient(create_app(settings, web_dist=None)) as client:
        assert client.portal is not None
        assert client.portal.call(tokens) == 3
