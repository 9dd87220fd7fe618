"""The record's hashed bigram/trigram embedding: row ids and sign hashes, the table sharded over
ranks, the per-cycle row cache, and the row-sparse update. It is NOT a model parameter: the model's
forward takes the result, `ngram (T, d)`.

What it computes. Token t of a rank's packed 1-D batch (the hashes cross document boundaries) reads
two rows of one [rows, d] table: a bigram row in the first half and a trigram row in the second
half, each times a +-1 row of a small shared sign pool picked by an independent hash of the same
tokens, summed:   ng_t = T[bigram_t] * S[bigram_sign_t] + T[trigram_t] * S[trigram_sign_t].
The model adds ng (gated) before layer 0 and at layers 1, 4, 5, 9 and 10 (the core's job).

Row ids (`ngram_row_ids`, exactly the record's ngram_table.py): products in int32 that wrap, XOR,
then the non-negative remainder. With half = rows / 2 and M = half - 1 (42,301,439 in the record):
    bigram   t >= 2: (36313 x_t ^ 27191 x_(t-1)) mod M;   t = 1: the same with M for x_0;   t = 0: row M
    trigram  t >= 2: ((17351 x_t ^ 60961 x_(t-1)) ^ 45259 x_(t-2)) mod M + half;   t < 2: row rows - 1
    signs    bigram (30011 x_(t-1) ^ 48271 x_t) & (pool - 1), 0 at t = 0;
             trigram (26801 x_(t-2) ^ 39779 x_(t-1) ^ 58699 x_t) & (pool - 1), 0 at t < 2
The t = 1 bigram reads M, not x_0, as its previous token (the record fills bigram[0] = M first and
hashes against it); the sign hash at t = 1 does use x_0.

Sharding (model/sharded_rows.py). At the record's size (84,602,880 x 512 bf16 = 87 GB) no rank can
hold the table: rank r owns rows [r rows/W, (r+1) rows/W) (10,575,360 rows, 10.8 GB at W = 8) with
no replica, and zeros at init. The table changes only at the update events (model/row_adam.py), so
every row a cycle reads is fetched once, at the cycle's start: `begin_cycle(the cycle's token
arrays)` pulls the sorted-unique rows of all of them into a local cache (all_to_all of counts, ids
and rows; one rank: a local gather). `embed(tokens)` reads the cache; its backward never builds a
table-sized gradient: each position's row gradient (the incoming gradient times its sign row, in
the table's dtype) is added per cache row into the cycle's fp16 buffer. `end_cycle(step, lr)` is the
event: the per-row sums go back to their owners along the pull's routes in bf16, each owner sums the
entries per row in bf16 (a row read by several ranks arrives several times) and runs the row Adam on
exactly those rows (NgramRowAdam; the 1/world of the rank mean rides its update). These are the
record's dtypes (ngram_table.py GRAD_ACCUM_DTYPE fp16, GRAD_WIRE_DTYPE and GRAD_MERGE_DTYPE bf16).
`lookup(tokens)` is the evaluation read: its own pull, no gradient, the cycle untouched.

Contract for callers: every method that exchanges rows (begin_cycle, end_cycle, lookup) is a
collective: all ranks call it at the same point, each with its own tokens. Call end_cycle exactly at
the cycle's event (is_update_step in training; the record's warm-up updates on every odd step); a
cycle that never ends (the run's last steps) simply drops its gradient, and reset() drops any cycle.
Call loss.backward() (not torch.autograd.grad on other inputs) so the cache's backward runs.

How this differs from the record's GPU code: the record starts every stage asynchronously under the
step's compute, holds the cache and gradient buffers at fixed addresses for CUDA graphs, merges on
the owner through a row -> entry claim map without a sort, and uses Triton kernels for the lookup
and the row update (perf/row_prefetch.py, perf/kernels/ngram_embed.py, perf/kernels/ngram_adam.py).
Here each stage is a synchronous collective, buffers are allocated per cycle, the owner merges with
torch.unique, and the same arithmetic runs in plain torch on any device. The record draws the sign
pool as sign(randn) under the run's seed and broadcasts it from rank 0; here every rank draws it
from one seeded generator (and maps a zero draw to +1, so it is exactly +-1).
"""
from dataclasses import dataclass

import torch
import torch.distributed as dist

from model.row_adam import ADAM_EPS, ADAM_WEIGHT_DECAY, MAX_CYCLE_STEPS, PERIOD4_START, NgramRowAdam
from model.sharded_rows import RowOwners, RowPull, fetch_rows, plan_pull, send_back

# The record's ngram_table.py NGRAM_VOCAB_SIZE: rows [0, rows/2) are the bigram channel, the rest
# the trigram channel. Divisible by 8 (the shards) and < 2**31 (row ids are int32).
NGRAM_ROWS = 84_602_880
# The record's NGRAM_DIM = MODEL_DIM (config.py).
NGRAM_DIM = 512
# The record's NGRAM_SIGN_POOL_ROWS: a power of two, so `& (rows - 1)` is the wrapped hash's
# non-negative remainder.
SIGN_POOL_ROWS = 8192
# Hash multipliers (the record's ngram_table.py; its sign hashes run in perf/kernels/ngram_embed.py).
BIGRAM_ROW_MULS = (36313, 27191)           # x[t], x[t-1]
TRIGRAM_ROW_MULS = (17351, 60961, 45259)   # x[t], x[t-1], x[t-2]
BIGRAM_SIGN_MULS = (48271, 30011)          # x[t], x[t-1]
TRIGRAM_SIGN_MULS = (58699, 39779, 26801)  # x[t], x[t-1], x[t-2]
# A cycle's gradient: summed per cache row in fp16, sent in bf16, summed per row by the owner in
# bf16 (the record's ngram_table.py GRAD_ACCUM_DTYPE, GRAD_WIRE_DTYPE, GRAD_MERGE_DTYPE).
GRAD_ACCUM_DTYPE = torch.float16
GRAD_WIRE_DTYPE = torch.bfloat16
GRAD_MERGE_DTYPE = torch.bfloat16
# The record's tokens per rank of a training step (131,072 / 8) and of a validation batch
# (config.py val_batch_size 4 * 64 * 1024 * 8, / 8): they size its row cache (model/gpt.py ngram_cache).
RECORD_STEP_TOKENS = 16_384
RECORD_EVAL_TOKENS = 262_144


def _check_rows(rows: int, sign_pool_rows: int) -> None:
    if rows < 4 or rows % 2 or rows >= 2 ** 31:
        raise ValueError(f"the n-gram table needs an even row count in [4, 2**31), got {rows}")
    if sign_pool_rows < 1 or sign_pool_rows & (sign_pool_rows - 1):
        raise ValueError(f"the sign pool needs a power-of-two row count, got {sign_pool_rows}")


def _wrap_int32(x: torch.Tensor) -> torch.Tensor:
    """int64 values -> the int32 with the same low 32 bits, as int64 (an int32 product's wrap)."""
    return ((x + 2 ** 31) & 0xFFFFFFFF) - 2 ** 31


def _tokens(tokens) -> torch.Tensor:
    t = torch.as_tensor(tokens)
    if t.ndim != 1 or t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"tokens must be a 1-D integer array, got {t.dtype} of shape {tuple(t.shape)}")
    t = t.long()
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= 2 ** 31):
        raise ValueError(f"token ids must lie in [0, 2**31), got [{int(t.min())}, {int(t.max())}]")
    return t


def ngram_row_ids(tokens, rows: int = NGRAM_ROWS, sign_pool_rows: int = SIGN_POOL_ROWS):
    """Token ids (T,) -> (bigram_row, trigram_row, bigram_sign, trigram_sign), each (T,) int64:
    table rows and sign-pool rows of every position, exactly the record's hashes (module docstring)."""
    _check_rows(rows, sign_pool_rows)
    x = _tokens(tokens)
    n = x.numel()
    half = rows // 2
    bigram_mod, trigram_mod = half - 1, rows - half - 1
    bigram = torch.full_like(x, bigram_mod)
    trigram = torch.full_like(x, half + trigram_mod)
    bigram_sign = torch.zeros_like(x)
    trigram_sign = torch.zeros_like(x)
    mask = sign_pool_rows - 1
    if n >= 2:
        prev = torch.cat([x.new_tensor([bigram_mod]), x[1:-1]])  # t = 1 reads M, not x_0
        hashed = _wrap_int32(BIGRAM_ROW_MULS[0] * x[1:]) ^ _wrap_int32(BIGRAM_ROW_MULS[1] * prev)
        bigram[1:] = torch.remainder(hashed, bigram_mod)
        bigram_sign[1:] = (BIGRAM_SIGN_MULS[1] * x[:-1] ^ BIGRAM_SIGN_MULS[0] * x[1:]) & mask
    if n >= 3:
        hashed = (_wrap_int32(TRIGRAM_ROW_MULS[0] * x[2:]) ^ _wrap_int32(TRIGRAM_ROW_MULS[1] * x[1:-1])
                  ^ _wrap_int32(TRIGRAM_ROW_MULS[2] * x[:-2]))
        trigram[2:] = torch.remainder(hashed, trigram_mod) + half
        trigram_sign[2:] = (TRIGRAM_SIGN_MULS[2] * x[:-2] ^ TRIGRAM_SIGN_MULS[1] * x[1:-1]
                            ^ TRIGRAM_SIGN_MULS[0] * x[2:]) & mask
    return bigram, trigram, bigram_sign, trigram_sign


def make_sign_pool(rows: int = SIGN_POOL_ROWS, dim: int = NGRAM_DIM, seed: int = 0,
                   dtype: torch.dtype = torch.bfloat16, device="cpu") -> torch.Tensor:
    """The shared [rows, dim] pool of +-1 entries, the same on every rank for the same seed."""
    draw = torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed))
    return torch.where(draw >= 0, 1.0, -1.0).to(dtype=dtype, device=device)


def _combine(bigram_rows, trigram_rows, bigram_signs, trigram_signs) -> torch.Tensor:
    """rows * sign + rows * sign in fp32, rounded to the table's dtype once (the record's kernel)."""
    out = bigram_rows.float() * bigram_signs.float() + trigram_rows.float() * trigram_signs.float()
    return out.to(bigram_rows.dtype)


@dataclass
class _Cycle:
    """One update cycle's pulled rows, their cache and their gradient so far."""
    pull: RowPull
    cache: torch.Tensor  # [n, d] table dtype: a leaf that requires grad, so embed's backward runs
    grad: torch.Tensor   # [n, d] fp16: the cycle's gradient per cache row
    used: bool = False   # whether embed() read it (a gradient may be pending)
    open: bool = True


class _CachedRows(torch.autograd.Function):
    """ng from the cycle's cache; the backward adds each position's row gradient into the cycle's
    fp16 buffer and returns nothing: no table- or cache-sized gradient tensor is ever made."""

    @staticmethod
    def forward(ctx, cache, slots, signs, pool, cycle):
        ctx.cycle = cycle
        ctx.save_for_backward(slots, signs, pool)
        return _combine(cache[slots[0]], cache[slots[1]], pool[signs[0]], pool[signs[1]])

    @staticmethod
    def backward(ctx, grad_out):
        cycle = ctx.cycle
        if not cycle.open:
            raise RuntimeError("n-gram backward after its cycle ended: run backward before end_cycle")
        slots, signs, pool = ctx.saved_tensors
        g = grad_out.float()
        for k in range(2):
            rows_grad = (g * pool[signs[k]].float()).to(cycle.cache.dtype)  # the record's bf16 sink gradient
            cycle.grad.index_add_(0, slots[k], rows_grad.to(GRAD_ACCUM_DTYPE))
        return None, None, None, None, None


class NgramTable:
    """This rank's shard of the hashed n-gram table, its row Adam, the sign pool and the current cycle."""

    def __init__(self, rows: int = NGRAM_ROWS, dim: int = NGRAM_DIM, *, world_size: int = 1, rank: int = 0,
                 group=None, seed: int = 0, dtype: torch.dtype = torch.bfloat16, device="cpu",
                 period4_start: int = PERIOD4_START, sign_pool_rows: int = SIGN_POOL_ROWS):
        _check_rows(rows, sign_pool_rows)
        if dim <= 0:
            raise ValueError(f"dim must be > 0, got {dim}")
        if world_size > 1:
            if not (dist.is_available() and dist.is_initialized()):
                raise ValueError(f"world_size {world_size} needs an initialized torch.distributed process group")
            if dist.get_world_size(group) != world_size or dist.get_rank(group) != rank:
                raise ValueError(f"world_size {world_size} / rank {rank} do not match the process group's "
                                 f"{dist.get_world_size(group)} / {dist.get_rank(group)}")
        self.rows, self.dim, self.dtype, self.device = rows, dim, dtype, torch.device(device)
        self.world_size, self.rank, self.group = world_size, rank, group
        self.sign_pool_rows = sign_pool_rows
        self.owners = RowOwners(rows, rank, world_size)
        self.shard = torch.zeros(self.owners.rows_per_rank, dim, dtype=dtype, device=self.device)
        self.adam = NgramRowAdam(self.owners.rows_per_rank, self.device, period4_start)
        self.sign_pool = make_sign_pool(sign_pool_rows, dim, seed, dtype, self.device)
        self.cycle: _Cycle | None = None

    def reset(self) -> None:
        """Back to the initial state, in place: zero rows, no Adam events, no cycle."""
        self.shard.zero_()
        self.adam.reset()
        if self.cycle is not None:
            self.cycle.open = False
        self.cycle = None

    def _ids(self, tokens) -> torch.Tensor:
        """(4, T) int64 on the table's device: bigram row, trigram row, bigram sign, trigram sign."""
        return torch.stack(ngram_row_ids(tokens, self.rows, self.sign_pool_rows)).to(self.device)

    def _pull(self, id_arrays: list[torch.Tensor]) -> tuple[RowPull, torch.Tensor]:
        """Pull the sorted-unique table rows of the given (4, T) id arrays: (routes, rows in want order)."""
        want = torch.unique(torch.cat([ids[:2].reshape(-1) for ids in id_arrays]))
        pull = plan_pull(self.owners, want, self.group)
        return pull, fetch_rows(self.owners, pull, self.shard, self.group)

    @staticmethod
    def _slots(want: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Positions of `rows` in the sorted pull `want`; every row must be there."""
        slots = torch.searchsorted(want, rows).clamp_(max=max(want.numel() - 1, 0))
        if rows.numel() and not torch.equal(want[slots], rows):
            raise ValueError("these tokens read n-gram rows this cycle did not pull: pass every step's tokens "
                             "of the cycle to begin_cycle")
        return slots

    def begin_cycle(self, token_arrays) -> None:
        """Start an update cycle (a collective): pull the rows every step of the cycle reads. The
        previous cycle must have ended (end_cycle) or never been read."""
        arrays = list(token_arrays)
        if not arrays:
            raise ValueError("begin_cycle needs the token arrays of the cycle's steps (at least one)")
        if self.cycle is not None and self.cycle.open and self.cycle.used:
            raise RuntimeError("begin_cycle while the previous cycle's gradient is unapplied: call end_cycle "
                               "at its event, or reset()")
        if self.cycle is not None:
            self.cycle.open = False
        pull, rows = self._pull([self._ids(t) for t in arrays])
        grad = torch.zeros(pull.num_rows, self.dim, dtype=GRAD_ACCUM_DTYPE, device=self.device)
        self.cycle = _Cycle(pull, rows.requires_grad_(True), grad)

    def embed(self, tokens) -> torch.Tensor:
        """ng (T, dim) for one step's tokens of the current cycle, differentiable into the cycle's rows."""
        if self.cycle is None or not self.cycle.open:
            raise RuntimeError("embed needs a cycle: call begin_cycle with the cycle's token arrays first")
        ids = self._ids(tokens)
        slots = self._slots(self.cycle.pull.want, ids[:2].reshape(-1)).view(2, -1)
        self.cycle.used = True
        return _CachedRows.apply(self.cycle.cache, slots, ids[2:], self.sign_pool, self.cycle)

    @torch.no_grad()
    def lookup(self, tokens) -> torch.Tensor:
        """ng (T, dim) for evaluation (a collective): its own pull, no gradient; the cycle is untouched."""
        ids = self._ids(tokens)
        pull, rows = self._pull([ids])
        slots = self._slots(pull.want, ids[:2].reshape(-1)).view(2, -1)
        return _combine(rows[slots[0]], rows[slots[1]], self.sign_pool[ids[2]], self.sign_pool[ids[3]])

    @torch.no_grad()
    def end_cycle(self, step: int, lr: float, weight_decay: float = ADAM_WEIGHT_DECAY,
                  eps: float = ADAM_EPS) -> tuple[torch.Tensor, torch.Tensor]:
        """The cycle's update event at `step` (a collective): return the row gradients to their owners
        and run the row Adam on every row the cycle's ranks read. `lr` is Adam's scheduled base lr
        (0.008 s in the record). Returns this rank's updated rows (global ids) and their summed bf16
        gradient (over ranks, before the 1/world), for inspection."""
        if self.cycle is None or not self.cycle.open:
            raise RuntimeError("end_cycle without a cycle: call begin_cycle first")
        cycle = self.cycle
        own_rows, own_grad, asked_rows, received = send_back(self.owners, cycle.pull, cycle.grad,
                                                             GRAD_WIRE_DTYPE, self.group)
        rows, entry = torch.unique(torch.cat([own_rows, asked_rows]), return_inverse=True)
        merged = torch.zeros(rows.numel(), self.dim, dtype=GRAD_MERGE_DTYPE, device=self.device)
        merged.index_add_(0, entry[:own_rows.numel()], own_grad.to(GRAD_MERGE_DTYPE))
        merged.index_add_(0, entry[own_rows.numel():], received.to(GRAD_MERGE_DTYPE))
        self.adam.event(self.shard, rows, merged, step=step, lr=lr, world_size=self.world_size,
                        weight_decay=weight_decay, eps=eps)
        cycle.open = False
        self.cycle = None
        return rows + self.owners.first_row, merged


def table_bytes_per_rank(rows: int = NGRAM_ROWS, dim: int = NGRAM_DIM, world_size: int = 8, *,
                         step_tokens: int = RECORD_STEP_TOKENS, eval_tokens: int = RECORD_EVAL_TOKENS,
                         dtype_bytes: int = 2, sign_pool_rows: int = SIGN_POOL_ROWS) -> dict[str, int]:
    """Bytes per rank of the n-gram table and its optimizer state, as NgramTable holds them at most:
    the row shard, one fp32 second moment and one int32 event stamp per shard row, the row cache (a
    cycle's two rows per token of MAX_CYCLE_STEPS steps, or an evaluation batch's, whichever is more),
    the cycle's fp16 gradient and the sign pool. At the record's size: 10.83 GB of rows, 11.59 GB in all."""
    _check_rows(rows, sign_pool_rows)
    if world_size < 1 or rows % world_size:
        raise ValueError(f"a table of {rows} rows does not split evenly over world_size {world_size}")
    shard_rows = rows // world_size
    cycle_rows = 2 * MAX_CYCLE_STEPS * step_tokens
    parts = {
        "shard": shard_rows * dim * dtype_bytes,
        "second_moment": 4 * shard_rows,
        "last_event": 4 * shard_rows,
        "row_cache": max(cycle_rows, 2 * eval_tokens) * dim * dtype_bytes,
        "cycle_grad": cycle_rows * dim * torch.finfo(GRAD_ACCUM_DTYPE).bits // 8,
        "sign_pool": sign_pool_rows * dim * dtype_bytes,
    }
    parts["total"] = sum(parts.values())
    return parts
