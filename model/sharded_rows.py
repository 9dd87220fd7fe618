"""A table sharded by row range over ranks: who owns a row, the pull that brings a sorted-unique set
of rows to a rank, and the same routes reversed, which carry those rows' gradients to their owners.

Rank r owns rows [r n / W, (r + 1) n / W) of an n-row table (W ranks; n % W == 0). A pull of `want`
(this rank's sorted-unique global row ids) runs three exchanges, each one `all_to_all_single`:
  1. counts: `want` is cut by owner; each owner learns how many rows this rank asks of it. The rows
     this rank owns itself, want[lo:hi], are read locally and never go on the wire (count 0).
  2. ids: the asked ids go to their owners; `asked` is what every peer asks of this rank, by peer.
  3. rows: each owner serves its shard at `asked`; the rows come back in want order, and this rank's
     own block is filled in between (`fetch_rows`).
The gradient of exactly those rows goes back along the same routes with the splits swapped
(`send_back`): the owner receives, per peer, the gradient of the rows that peer asked for.
With one rank nothing goes on the wire: every row is this rank's own.

The record (its sharded_rows.py, for the n-gram table and value_embeds) sends the counts over gloo
(CPU tensors) and the ids and rows over NCCL, and starts each stage asynchronously under the step's
compute (perf/row_prefetch.py). Here each stage is one synchronous collective on `group`, with the
counts on the ids' device; gloo on this torch has all_to_all_single with uneven and empty splits.
"""
from dataclasses import dataclass

import torch
import torch.distributed as dist


class RowOwners:
    """Ownership of a [num_rows, D] table split by row range over world_size ranks."""

    def __init__(self, num_rows: int, rank: int, world_size: int):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank {rank}, world_size {world_size}")
        if num_rows <= 0 or num_rows % world_size:
            raise ValueError(f"a table of {num_rows} rows does not split evenly over {world_size} ranks")
        self.num_rows, self.rank, self.world_size = num_rows, rank, world_size
        self.rows_per_rank = num_rows // world_size
        self.first_row = rank * self.rows_per_rank

    def cuts(self, want: torch.Tensor) -> torch.Tensor:
        """Positions in sorted `want` where each owner's rows start, and the end: [world_size + 1]."""
        bounds = torch.arange(self.world_size + 1, device=want.device, dtype=torch.int64) * self.rows_per_rank
        return torch.searchsorted(want, bounds)


@dataclass
class RowPull:
    """One fetch of a sorted-unique row set, and the routes its gradient takes back."""
    want: torch.Tensor      # [n] int64 sorted-unique global row ids
    lo: int                 # want[lo:hi] are this rank's own rows: read locally, never on the wire
    hi: int
    send_counts: list[int]  # rows asked of each rank (0 for this rank)
    recv_counts: list[int]  # rows each rank asks of this rank
    asked: torch.Tensor     # [sum(recv_counts)] int64 global ids asked of this rank, by asking rank

    @property
    def num_rows(self) -> int:
        return self.want.numel()

    def peer_rows(self) -> torch.Tensor:
        """The wanted rows other ranks own, in want order (the order the fetch returns them in)."""
        return torch.cat([self.want[:self.lo], self.want[self.hi:]])


def _exchange(send: torch.Tensor, send_counts: list[int], recv_counts: list[int], group) -> torch.Tensor:
    """Rows send[sum(send_counts[:r]) : sum(send_counts[:r + 1])] go to rank r; the received rows come
    back concatenated in rank order."""
    out = send.new_empty((sum(recv_counts), *send.shape[1:]))
    dist.all_to_all_single(out, send.contiguous(), output_split_sizes=recv_counts,
                           input_split_sizes=send_counts, group=group)
    return out


def plan_pull(owners: RowOwners, want: torch.Tensor, group=None) -> RowPull:
    """Stages 1 and 2 (a collective when world_size > 1): the counts, then the ids, to their owners.
    `want` is this rank's sorted-unique global row ids (int64)."""
    if want.ndim != 1 or want.dtype != torch.int64:
        raise ValueError(f"want must be a 1-D int64 tensor of row ids, got {want.dtype} {tuple(want.shape)}")
    if want.numel() and (int(want[0]) < 0 or int(want[-1]) >= owners.num_rows):
        raise ValueError(f"row ids must lie in [0, {owners.num_rows}), got [{int(want[0])}, {int(want[-1])}]")
    cuts = owners.cuts(want)
    lo, hi = int(cuts[owners.rank]), int(cuts[owners.rank + 1])
    send = cuts[1:] - cuts[:-1]
    send[owners.rank] = 0
    if owners.world_size == 1:
        return RowPull(want, lo, hi, [0], [0], want.new_empty(0))
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    pull = RowPull(want, lo, hi, send.tolist(), recv.tolist(), want.new_empty(0))
    pull.asked = _exchange(pull.peer_rows(), pull.send_counts, pull.recv_counts, group)
    return pull


@torch.no_grad()
def fetch_rows(owners: RowOwners, pull: RowPull, shard: torch.Tensor, group=None) -> torch.Tensor:
    """Stage 3 (a collective when world_size > 1): the pulled rows, [n, D] in want order, read from
    every owner's shard as it is now."""
    rows = shard.new_empty((pull.num_rows, shard.shape[1]))
    rows[pull.lo:pull.hi] = shard[pull.want[pull.lo:pull.hi] - owners.first_row]
    if owners.world_size > 1:
        served = shard[pull.asked - owners.first_row]
        received = _exchange(served, pull.recv_counts, pull.send_counts, group)
        rows[:pull.lo] = received[:pull.lo]
        rows[pull.hi:] = received[pull.lo:]
    return rows


@torch.no_grad()
def send_back(owners: RowOwners, pull: RowPull, grads: torch.Tensor, wire_dtype: torch.dtype,
              group=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reverse routes (a collective when world_size > 1): `grads` [n, D] in want order go to the
    rows' owners, in `wire_dtype` on the wire. Returns, for this rank as owner: the local indices of
    its own rows and their gradients (as given, never on the wire), and the local indices of the rows
    the peers asked for and the gradients received for them (by peer; a row may repeat across peers)."""
    own_rows = pull.want[pull.lo:pull.hi] - owners.first_row
    own = grads[pull.lo:pull.hi]
    asked_rows = pull.asked - owners.first_row
    if owners.world_size == 1:
        return own_rows, own, asked_rows, grads.new_empty((0, grads.shape[1]), dtype=wire_dtype)
    wire = torch.cat([grads[:pull.lo], grads[pull.hi:]]).to(wire_dtype)
    received = _exchange(wire, pull.send_counts, pull.recv_counts, group)
    return own_rows, own, asked_rows, received
