"""The collectives of the gradient sync and of distributed Muon, each counting the bytes it sends.

Averages use ReduceOp.AVG where the backend has it (NCCL) and SUM followed by one division of
the reduced buffer elsewhere (gloo), inside Pending.wait(). Reduce-scatter and all-gather work
in place on a flat buffer split into world_size equal segments, segment r being rank r's.

Every call adds to COMM_BYTES what this rank sends under the ring algorithms that NCCL and gloo
use for large messages, with n the bytes of the whole buffer and W the world size:
  all-reduce       2 (W - 1) / W * n
  reduce-scatter   (W - 1) / W * n
  all-gather       (W - 1) / W * n
so two ways of syncing a step can be compared by what they move (tests/test_model_optim.py).
"""
import collections

import torch
import torch.distributed as dist

# torch >= 2.12 names the flat-tensor collectives *_single; 2.11 (GPU nodes may keep it) has the older names.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class ByteCounter:
    """Bytes sent by this rank, per collective."""

    def __init__(self):
        self.bytes = collections.Counter()

    def add(self, op: str, n: float) -> None:
        self.bytes[op] += n

    def total(self) -> float:
        return sum(self.bytes.values())

    def reset(self) -> None:
        self.bytes.clear()


COMM_BYTES = ByteCounter()


class Pending:
    """An asynchronous collective; wait() finishes it (and divides when the backend had no AVG)."""

    def __init__(self, work, divide: torch.Tensor | None = None, by: int = 1):
        self.work, self.divide, self.by = work, divide, by

    def wait(self) -> None:
        self.work.wait()
        if self.divide is not None:
            self.divide.div_(self.by)


def is_distributed() -> bool:
    """True when torch.distributed runs with more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _mean_op():
    """(the reduce op, whether the caller must divide by world_size afterwards)."""
    if dist.get_backend() == "nccl":
        return dist.ReduceOp.AVG, False
    return dist.ReduceOp.SUM, True  # gloo has no AVG on every torch this repo supports


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def all_reduce_mean(flat: torch.Tensor) -> Pending:
    """Start averaging `flat` over all ranks, in place."""
    world = dist.get_world_size()
    op, divide = _mean_op()
    COMM_BYTES.add("all_reduce", 2 * (world - 1) / world * _nbytes(flat))
    return Pending(dist.all_reduce(flat, op=op, async_op=True), flat if divide else None, world)


def reduce_scatter_mean(flat: torch.Tensor) -> Pending:
    """Start averaging over all ranks THIS rank's segment of `flat` (1-D, world_size equal
    segments), in place; the other segments keep this rank's own values."""
    world, rank = dist.get_world_size(), dist.get_rank()
    mine = own_segment(flat, rank, world)
    op, divide = _mean_op()
    COMM_BYTES.add("reduce_scatter", (world - 1) / world * _nbytes(flat))
    return Pending(_reduce_scatter(mine, flat, op=op, async_op=True), mine if divide else None, world)


def all_gather_segments(flat: torch.Tensor) -> Pending:
    """Start sending this rank's segment of `flat` to every rank, in place: afterwards segment r
    holds rank r's."""
    world, rank = dist.get_world_size(), dist.get_rank()
    COMM_BYTES.add("all_gather", (world - 1) / world * _nbytes(flat))
    return Pending(_all_gather(flat, own_segment(flat, rank, world), async_op=True))


def own_segment(flat: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Segment `rank` of a 1-D buffer split into `world` equal parts."""
    size = flat.numel() // world
    return flat[rank * size:(rank + 1) * size]
