"""The Celery application's settings, held against a real worker on the session's Redis."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis

from contract.settings import Settings
from scheduler.celery_app import create_celery

ROOT = Path(__file__).resolve().parents[2]
# A worker as a node agent runs one (threads, one per slot; here one slot), whose task holds
# its thread as an allocation's does; the task's own options say nothing of acknowledgement.
WORKER = """
import sys, time
import redis
from contract.settings import Settings
from scheduler.celery_app import create_celery

url, queue = sys.argv[1], sys.argv[2]
app = create_celery(Settings(redis_url=url))
client = redis.Redis.from_url(url)

@app.task(name="test.hold")
def hold(started: str) -> None:
    client.rpush(started, "1")
    time.sleep(120)

app.worker_main(["worker", "--pool=threads", "--concurrency=1", f"--queues={queue}",
                 "--without-gossip", "--without-mingle", "--without-heartbeat",
                 "--loglevel=WARNING"])
"""


def test_an_agent_busy_on_every_slot_leaves_the_next_tasks_in_redis(redis_url: str) -> None:
    """Acknowledged when they end, running tasks hold the worker's places: while its one
    thread runs a task, the two sent after it wait in the queue in Redis (acknowledged when
    they start, one of them would wait in the worker's memory)."""
    queue, started = f"test-acks-{uuid.uuid4().hex}", f"test-acks-started-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(redis_url)
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, redis_url, queue],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        app = create_celery(Settings(redis_url=redis_url))
        for _ in range(3):
            app.send_task("test.hold", args=[started], queue=queue)
        assert client.blpop([started], timeout=120) is not None, "the first task never ran"
        time.sleep(3.0)  # what the worker would take to fetch another message
        assert client.llen(queue) == 2
        assert client.llen(started) == 0, "a second task ran beside the first"
    finally:
        worker.kill()
        worker.wait()
        client.delete(queue, started)
