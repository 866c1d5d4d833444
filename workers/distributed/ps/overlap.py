"""Gradients sent while the backward pass runs, in parts, each the moment it is complete.

Each shard's slices are grouped into parts in the order the backward pass produces their
gradients (the net's parameters in reverse), each closed once it holds `PART_BYTES` of fp32.
The worker counts, through a hook on every parameter, the gradients each part still waits for;
a part whose last gradient was just accumulated is handed to a sender thread while the backward
pass goes on with the layers below. Each shard's last part (the first layers, whose gradients
come at the very end), and what no hook announced (a parameter without a gradient, or gradients
not accumulated by a backward pass), go with the step's round trip; with them, when the job
clips, a part of no slices that carries the gradient's global norm, known only at the end.

The shards receive the same slices with the same bits as when the whole gradient goes in one
message per shard, and average them in the same order (shard.py), so the parameters do not
depend on how the gradient travelled. Where it is exact, a shard also updates each slice as soon
as every worker of the group sent it (`ShardServer.early`), so that most of the update is done
too by the time the backward pass ends.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.distributed.ps.slicing import Slice
from workers.distributed.ps.wire import MAX_PARTS

# DDP's first bucket is 1 MB too: small enough that the first part leaves early in the backward
# pass, large enough that a message's fixed costs (XADD, the shard's read) stay small.
PART_BYTES = 1 << 20


def plan_parts(
    slices: Sequence[Slice], order: Sequence[str], *, part_bytes: int = PART_BYTES
) -> list[list[Slice]]:
    """One shard's `slices` grouped into parts in the order of the parameters in `order` (the
    order their gradients become ready), each closed once it holds `part_bytes` of fp32, as
    DDP fills its buckets: a layer's bias goes with its weight, whose gradients come together.
    At most MAX_PARTS - 1 parts: one more may carry the norm."""
    rank = {name: i for i, name in enumerate(order)}
    ordered = sorted(slices, key=lambda s: (rank[s.param], s.start))
    # Every part but the last holds at least `target`: at most total / target + 1 parts.
    total = 4 * sum(s.numel for s in ordered)
    target = max(part_bytes, -(-total // (MAX_PARTS - 2)))
    parts: list[list[Slice]] = []
    size = target  # the first slice opens a part
    for s in ordered:
        if size >= target:
            parts.append([])
            size = 0
        parts[-1].append(s)
        size += 4 * s.numel
    return parts


class ReadyParts:
    """Which parts, of every shard, wait for which parameters' gradients in one backward pass.

    Parts are numbered across the shards (the client keeps which shard each is for).
    """

    def __init__(self, parts: Sequence[Sequence[Slice]]) -> None:
        self.needs = [len({s.param for s in part}) for part in parts]
        self.parts_of: dict[str, list[int]] = {}
        for index, part in enumerate(parts):
            for name in dict.fromkeys(s.param for s in part):
                self.parts_of.setdefault(name, []).append(index)
        self.missing = list(self.needs)
        self.seen: set[str] = set()

    def begin(self) -> None:
        """A new backward pass: every part waits for all its gradients again."""
        self.missing = list(self.needs)
        self.seen.clear()

    def accumulated(self, name: str) -> list[int]:
        """Note that parameter `name`'s gradient is complete; the parts that now are."""
        if name in self.seen:
            raise ValueError(
                f"the gradient of {name} was accumulated twice in one step; sending gradients "
                "during the backward pass needs one backward pass per step"
            )
        self.seen.add(name)
        complete = []
        for index in self.parts_of.get(name, ()):
            self.missing[index] -= 1
            if self.missing[index] == 0:
                complete.append(index)
        return complete

    def unsent(self) -> list[int]:
        """The parts no hook completed in this pass."""
        return [index for index, missing in enumerate(self.missing) if missing > 0]
