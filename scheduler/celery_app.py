"""The Celery application: Redis as broker, one queue per node agent, thin tasks of IDs.

The scheduler sends `trainyard.run_allocation(allocation_id)` by name to the queue of the node
it placed the allocation on; only the node agents register the task (scheduler/agent.py).
"""

from __future__ import annotations

from celery import Celery

from contract.settings import Settings

RUN_ALLOCATION = "trainyard.run_allocation"


class BrokerNotConfigured(RuntimeError):
    pass


def node_queue(settings: Settings, node_name: str) -> str:
    return f"{settings.redis_prefix}.node.{node_name}"


def create_celery(settings: Settings) -> Celery:
    if not settings.redis_url:
        raise BrokerNotConfigured(
            "no Redis to use as the Celery broker: set REDIS_URL (or run `trainyard up`, "
            "which starts one)"
        )
    app = Celery("trainyard", broker=settings.redis_url, backend=settings.redis_url)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        # A task is acknowledged when it ends, so a node dying mid-task leaves it to be
        # redelivered; the agent's claim on the allocation makes the redelivery a no-op.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # Tasks report through the job's Redis stream, never through results.
        task_ignore_result=True,
        task_default_queue=f"{settings.redis_prefix}.default",
        broker_connection_retry_on_startup=True,
        # A training task runs for hours; redelivery waits for the agent, not a timer.
        broker_transport_options={"visibility_timeout": 7 * 24 * 3600},
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    return app
