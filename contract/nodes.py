"""A node agent's registration: the hash `Keys.node(name)` its agent rewrites at every heartbeat
(and drops out of Redis after a few missed ones), which the scheduler syncs into its Node rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.codec import from_fields, to_fields


@dataclass(frozen=True)
class NodeRegistration:
    """What a node offers and how it is, as its agent last said."""

    queue: str  # the node's Celery queue (scheduler/celery_app.py)
    slots: int
    gpus: int
    heartbeat: float  # when it was written (unix time): a new value is a sign of life
    host: str = ""
    pid: int = 0  # the agent's process
    draining: bool = False  # its agent is stopping and takes no work
    # The parameter-server Redis servers it could not reach, as "host:port: error"
    # (scheduler/agent/ps_reach.py); none: all answered, or an agent that does not check.
    ps_unreachable: tuple[str, ...] = ()
    # The plugins its processes load (dsl/plugins.py), each "name=version" ("name=" for a
    # module of no distribution): jobs using a plugin's types are placed only where it is.
    plugins: tuple[str, ...] = ()
    # Why a plugin failed to load in its agent ("plugin x (path) failed to load: ..."): such a
    # node takes no jobs and says why on its node card; "": every plugin loaded.
    plugin_error: str = ""

    def plugin_versions(self) -> dict[str, str]:
        return {name: version for name, _, version in (p.partition("=") for p in self.plugins)}

    # The memory (MB) its worker processes may use together (0: an agent that does not say);
    # each slot's share is a worker's default limit (contract/allocation.py: memory_mb).
    memory_mb: int = 0

    @property
    def memory_per_slot_mb(self) -> int:
        return self.memory_mb // self.slots if self.slots else 0

    def to_hash(self) -> dict[str, str]:
        return to_fields(self)

    @classmethod
    def from_hash(cls, fields: dict[str, str]) -> NodeRegistration:
        """ValueError or KeyError for a hash that is not a registration."""
        return from_fields(cls, fields)
