"""The collectives a partitioned net runs between its layers, differentiable.

SINGA inserts connection layers where the partitioning of consecutive layers differs: concat
and bridge layers join the pieces held by other workers, slice layers take a worker's piece.
Here the joining is one all-gather along an axis; its backward is the matching reduce-scatter,
which sums what every worker's copy of the joined tensor contributed to each piece. Taking a
piece is local slicing, whose backward autograd already knows.

Pieces may differ in size by one (`split_sizes`, the convention of torch.tensor_split): they are
padded to the largest size on the wire and trimmed again, since the collectives need equal
pieces.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

ProcessGroup = dist.ProcessGroup | None


def split_sizes(total: int, parts: int) -> list[int]:
    """Sizes of `parts` near-equal pieces of `total`, the larger ones first."""
    if parts < 1 or total < parts:
        raise ValueError(f"cannot cut {total} into {parts} non-empty pieces")
    base, extra = divmod(total, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def piece_bounds(total: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of piece `index` of `split_sizes(total, parts)`."""
    sizes = split_sizes(total, parts)
    start = sum(sizes[:index])
    return start, start + sizes[index]


def _pad_front_axis(x: torch.Tensor, size: int) -> torch.Tensor:
    """Zero-pad axis 0 of `x` up to `size` rows."""
    missing = size - x.shape[0]
    if missing == 0:
        return x
    # F.pad counts pairs from the last axis, so axis 0 is the last pair.
    return F.pad(x, [0, 0] * (x.dim() - 1) + [0, missing])


def gather_pieces(
    x: torch.Tensor, axis: int, sizes: list[int], group: ProcessGroup = None
) -> torch.Tensor:
    """Every worker's piece joined along `axis`; worker i holds `sizes[i]` entries of it."""
    width = max(sizes)
    front = _pad_front_axis(x.movedim(axis, 0), width).contiguous()  # (piece, *rest)
    out = front.new_empty((len(sizes) * width, *front.shape[1:]))  # (world * piece, *rest)
    dist.all_gather_single(out, front, group=group)
    if len(set(sizes)) > 1:
        out = torch.cat([out[i * width : i * width + s] for i, s in enumerate(sizes)])
    return out.movedim(0, axis)


def reduce_scatter_pieces(
    g: torch.Tensor, axis: int, sizes: list[int], group: ProcessGroup = None
) -> torch.Tensor:
    """This worker's piece of the sum over workers of `g` (the adjoint of `gather_pieces`)."""
    width = max(sizes)
    front = g.movedim(axis, 0)  # (total, *rest)
    if len(set(sizes)) > 1:
        front = torch.cat([_pad_front_axis(p, width) for p in front.split(sizes)])
    front = front.contiguous()
    out = front.new_empty((width, *front.shape[1:]))
    dist.reduce_scatter_single(out, front, group=group)
    rank = dist.get_rank(group)
    return out[: sizes[rank]].movedim(0, axis)


class _GatherPieces(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, axis: int, sizes: list[int], group: ProcessGroup
    ) -> torch.Tensor:
        ctx.axis, ctx.sizes, ctx.group = axis, sizes, group
        return gather_pieces(x, axis, sizes, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        return reduce_scatter_pieces(grad, ctx.axis, ctx.sizes, ctx.group), None, None, None


def all_gather_along(
    x: torch.Tensor, axis: int, sizes: list[int], group: ProcessGroup = None
) -> torch.Tensor:
    """`gather_pieces` that autograd differentiates (backward: reduce-scatter of the grads)."""
    if not x.requires_grad:
        return gather_pieces(x, axis, sizes, group)
    out: torch.Tensor = _GatherPieces.apply(x, axis, sizes, group)
    return out


def take_piece(x: torch.Tensor, axis: int, parts: int, index: int) -> torch.Tensor:
    """Piece `index` of `x` cut into `parts` along `axis` (a view; backward zero-pads)."""
    start, stop = piece_bounds(x.shape[axis], parts, index)
    return x.narrow(axis, start, stop - start)
