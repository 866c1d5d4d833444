"""The Celery application: Redis as broker, one queue per node agent, thin tasks of IDs.

The scheduler sends `trainyard.run_allocation(allocation_id)` by name to the queue of the node
it placed the allocation on; only the node agents register the task (scheduler/agent/node_agent.py).
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
        # A task is acknowledged when it ends. The message left Redis when the worker took it
        # (no acknowledgement emulation, below), so this decides only what the worker takes:
        # one message per thread, held until its task ends, so an agent busy on every slot
        # takes no further message; the next waits in the node's queue in Redis, not in the
        # memory of an agent that may die (tests/scheduler/test_celery_app.py). Should kombu
        # put a running task's message back (it restores the unacknowledged ones when its
        # channel closes), the second delivery is a no-op: the agent's claim.
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        # Tasks report through the job's Redis stream, never through results.
        task_ignore_result=True,
        task_default_queue=f"{settings.redis_prefix}.default",
        broker_connection_retry_on_startup=True,
        # A task message is taken from the queue once: with acknowledgement emulation, kombu's
        # Redis transport kept it in Redis, unacknowledged, for the hours a task runs, and
        # crashed the worker putting it back when the connection to Redis broke. A message
        # lost before its agent claimed the allocation is sent again by the scheduler
        # (dispatch.undispatched); a claimed allocation its agent lost is reconciled
        # (agent.reconcile).
        broker_transport_options={"ack_emulation": False},
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        # No broadcast commands (shutdown, rate limits, ...) from whoever can publish on the
        # broker; nothing of ours uses them, and a node agent's Redis user reaches no
        # pidbox queue (contract/keys.py, Keys.role_user_rules).
        worker_enable_remote_control=False,
    )
    return app
