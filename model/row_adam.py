"""The record's two row-sparse optimizers and their shared update events: the n-gram table's row
Adam (beta1 = 0, one second moment per row, lazily decayed) and value_embeds' Adam.

Events. Both tables change only at their update events (`is_update_step`): every odd step before
PERIOD4_START (160 in the record), then the steps = 3 mod 4 (163, 167, ..., 567 in a 570-step run).
An update cycle is the run of steps up to and including one event. The steps after a run's last
event (568 and 569 in the record) form a cycle that never ends: their gradient is never applied.
From PERIOD4_START one event stands for two steps of the old cadence, so beta2 is squared (both
betas for value_embeds) and the weight-decay multiplier doubles; which pair applies is chosen by the
event's step (the record's `adam_beta2_and_wd_mul(step)` and `value_embed_betas_and_wd_mul(step)`),
so a warm-up that updates on other steps gets the same rule. This repo scales the record's step
constants by N/570 for short runs: the switch step is a parameter everywhere here; every switch
step gives cycles of at most MAX_CYCLE_STEPS (the record asserts 160 % 4 == 0, which this does not
need).

NgramRowAdam (the record's ngram_table.py NgramTable.adam_update and perf/kernels/ngram_adam.py):
the gradient g of a row is the owner's sum over ranks of each rank's cycle sum; the update reads
g / world (the rank mean), so with e = events since reset and b2 this event's beta2:
    v <- b2 v + (1 - b2) mean_dims((g / world)^2)        one fp32 v per row
    u  = lr' sqrt(1 - b2^e) (g / world) / (sqrt(v) + eps),   lr' = 49 lr
    u += decay p where u p > 0,   decay = lr'^2 wd wd_mul  (cautious decay, ~ lr^2)
    p <- p - u                                           fp32 math, stored in the table's dtype
A row no event touches does not move: with beta1 = 0 its update is exactly 0, and the decay is gated
on the update. Only its v owes b2 per missed event. That decay is applied lazily: each row records
the event its v is current to, a history keeps every event's b2, and the next event that touches the
row multiplies the missed factors in, one at a time and in order -- the same fp32 multiplies as
decaying every row at every event, so the same bits (tests/test_ngram_table.py checks it against an
eager dense reference). An event therefore costs only the rows it touches.

ValueEmbedAdam (the record's perf/value_embed_pull.py and optim/anvil.py's Adam): value_embeds is a
model parameter (4 planes x padded vocab rows x d; the model core owns it). Each step's gradient is
added into one fp16 buffer (the record's GRAD_DTYPE); at an event the cycle's sum is reduced over
ranks, divided by world in fp16, and plain Adam (with bias correction, t = events, cautious decay)
runs on this rank's row shard -- on EVERY row of the shard: momentum and decay move rows the cycle
never read, unlike the n-gram table. In the record each rank owns 25,152 rows (201,216 / 8), the
cycle's rows travel to their owners along the row pulls' routes, the owner rebuilds its dense
gradient shard from them, and after the update each replica pulls only the rows its next cycle reads
(a stale replica row is never read before it is pulled again). Here the same math runs with a plain
exchange: an all-reduce (sum) of the fp16 cycle gradient, each rank updates its own shard, and an
all-gather makes every replica whole. Each step's gradient enters as the dense gradient autograd made
(summed within the step in the parameter's dtype), where the record's backward adds every token's rows
straight into the fp16 buffer (perf/kernels/value_embed.py).

Constants: the record's ngram_table.py (NGRAM_LR_MUL 49, NGRAM_WD_MUL 5 / 10, NGRAM_ADAM_BETA2 0.95,
NGRAM_ADAM_PERIOD4_START 160, MAX_CYCLE_STEPS 4), training.py (VALUE_EMBED_LR_MUL 70, betas (0.75,
0.95), wd_mul 5 / 10, and Adam's defaults: eps 1e-10, weight decay 0.005).
"""
import torch
import torch.distributed as dist

# The record's ngram_table.py NGRAM_ADAM_PERIOD4_START: from this step the tables update every 4th step.
PERIOD4_START = 160
# The record's ngram_table.py: the longest cycle in steps (the row cache holds one cycle's rows).
MAX_CYCLE_STEPS = 4
# Adam's defaults in the record's training.py: the tables take the same base lr, weight decay and eps.
ADAM_EPS = 1e-10
ADAM_WEIGHT_DECAY = 0.005
# The n-gram table's row Adam (the record's ngram_table.py).
NGRAM_LR_MUL = 49.0
NGRAM_BETA2 = 0.95
NGRAM_WD_MUL = 5.0
NGRAM_WD_MUL_PERIOD4 = 10.0
# value_embeds' Adam (the record's training.py).
VALUE_EMBED_LR_MUL = 70.0
VALUE_EMBED_BETAS = (0.75, 0.95)
VALUE_EMBED_WD_MUL = 5.0
VALUE_EMBED_WD_MUL_PERIOD4 = 10.0
# The cycle's value_embeds gradient is summed in fp16 (the record's perf/kernels/value_embed.py GRAD_DTYPE).
VALUE_EMBED_GRAD_DTYPE = torch.float16

# torch >= 2.12 names the flat all-gather all_gather_single; 2.11 has all_gather_into_tensor (model/collectives.py).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _check_step(step: int, period4_start: int) -> None:
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if period4_start < 0:
        raise ValueError(f"period4_start must be >= 0, got {period4_start}")


def is_update_step(step: int, period4_start: int = PERIOD4_START) -> bool:
    """Whether the tables update at `step`: odd steps before period4_start, then steps = 3 mod 4."""
    _check_step(step, period4_start)
    if step >= period4_start:
        return step % 4 == 3
    return step % 2 == 1


def ngram_beta2_and_wd_mul(step: int, period4_start: int = PERIOD4_START) -> tuple[float, float]:
    """The n-gram table's (beta2, wd_mul) for an event at `step`."""
    _check_step(step, period4_start)
    if step >= period4_start:
        return NGRAM_BETA2 ** 2, NGRAM_WD_MUL_PERIOD4
    return NGRAM_BETA2, NGRAM_WD_MUL


def value_embed_betas_and_wd_mul(step: int, period4_start: int = PERIOD4_START) -> tuple[tuple[float, float], float]:
    """value_embeds' ((beta1, beta2), wd_mul) for an event at `step`."""
    _check_step(step, period4_start)
    if step >= period4_start:
        return (VALUE_EMBED_BETAS[0] ** 2, VALUE_EMBED_BETAS[1] ** 2), VALUE_EMBED_WD_MUL_PERIOD4
    return VALUE_EMBED_BETAS, VALUE_EMBED_WD_MUL


class NgramRowAdam:
    """The row Adam state of one rank's shard of the n-gram table: one fp32 second moment per row,
    the event each is current to, and every event's beta2."""

    def __init__(self, num_rows: int, device="cpu", period4_start: int = PERIOD4_START):
        if num_rows <= 0:
            raise ValueError(f"num_rows must be > 0, got {num_rows}")
        self.period4_start = period4_start
        self.exp_avg_sq = torch.zeros(num_rows, dtype=torch.float32, device=device)
        self.last_event = torch.zeros(num_rows, dtype=torch.int32, device=device)
        self.reset()

    def reset(self) -> None:
        """Back to no events, in place."""
        self.exp_avg_sq.zero_()
        self.last_event.zero_()
        self.events = 0
        self.beta2_history: list[float] = []  # [e - 1]: event e's beta2

    def _replayed(self, rows: torch.Tensor, upto: int) -> torch.Tensor:
        """The second moments of `rows` with the decays of their missed events up to `upto` applied,
        one event at a time (the eager order), without writing them back."""
        v = self.exp_avg_sq[rows]
        last = self.last_event[rows].long()
        missed = upto - last
        most = int(missed.max()) if missed.numel() else 0
        if most > 0:
            history = torch.tensor(self.beta2_history, dtype=torch.float32, device=v.device)
            for k in range(most):
                behind = missed > k
                factor = history[torch.where(behind, last + k, 0)]  # event last+1+k sits at last+k
                v = torch.where(behind, v * factor, v)
        return v

    def second_moment(self) -> torch.Tensor:
        """Every row's second moment as of the latest event (a copy; the state stays lazy)."""
        rows = torch.arange(self.exp_avg_sq.numel(), device=self.exp_avg_sq.device)
        return self._replayed(rows, self.events)

    @torch.no_grad()
    def event(self, weights: torch.Tensor, rows: torch.Tensor, grad: torch.Tensor, *, step: int, lr: float,
              world_size: int, weight_decay: float = ADAM_WEIGHT_DECAY, eps: float = ADAM_EPS) -> None:
        """One update event at `step` on `weights` (this rank's shard, in place): `rows` are distinct
        local row indices, `grad` [len(rows), D] their gradient summed over ranks, `lr` Adam's
        scheduled base lr (0.008 s in the record; the table multiplies it by NGRAM_LR_MUL)."""
        if rows.ndim != 1 or grad.shape != (rows.numel(), weights.shape[1]):
            raise ValueError(f"rows {tuple(rows.shape)} and grad {tuple(grad.shape)} do not match weights "
                             f"{tuple(weights.shape)}: expected rows (n,) and grad (n, {weights.shape[1]})")
        beta2, wd_mul = ngram_beta2_and_wd_mul(step, self.period4_start)
        lr = lr * NGRAM_LR_MUL
        self.events += 1
        self.beta2_history.append(beta2)
        event = self.events
        # The same scalars, in the same order, as the record's adam_update (Python doubles, fp32 on use).
        step_size = lr * (1 - beta2 ** event) ** 0.5  # beta1 = 0: no first-moment bias correction
        decay = lr * lr * weight_decay * wd_mul
        grad_mul, sq_mul = 1 / world_size, (1 - beta2) / world_size ** 2
        rows = rows.long()
        v = self._replayed(rows, event - 1)  # this event's own decay is part of the update below
        g = grad.float()
        v = v * beta2 + ((g * g).sum(1) / g.shape[1]) * sq_mul
        u = ((g * grad_mul) / (v.sqrt() + eps)[:, None]) * step_size
        p = weights[rows].float()
        u = u + torch.where(u * p > 0, p * decay, torch.zeros_like(p))
        weights[rows] = (p - u).to(weights.dtype)
        self.exp_avg_sq[rows] = v
        self.last_event[rows] = event


class ValueEmbedAdam:
    """value_embeds' Adam on the n-gram events: the cycle's fp16 gradient sum, this rank's row shard of
    the moments, and the exchange that keeps every rank's copy of the parameter whole."""

    def __init__(self, param: torch.Tensor, *, world_size: int = 1, rank: int = 0, group=None,
                 period4_start: int = PERIOD4_START):
        if param.ndim != 2:
            raise ValueError(f"value_embeds must be 2-D (planes * vocab, d), got shape {tuple(param.shape)}")
        if not 0 <= rank < world_size or param.shape[0] % world_size:
            raise ValueError(f"value_embeds has {param.shape[0]} rows: need rows % world_size == 0 and "
                             f"0 <= rank < world_size, got world_size {world_size}, rank {rank}")
        self.param = param
        self.world_size, self.rank, self.group = world_size, rank, group
        self.period4_start = period4_start
        self.rows_per_rank = param.shape[0] // world_size
        self.own = slice(rank * self.rows_per_rank, (rank + 1) * self.rows_per_rank)
        shard = (self.rows_per_rank, param.shape[1])
        self.exp_avg = torch.zeros(shard, dtype=torch.float32, device=param.device)
        self.exp_avg_sq = torch.zeros(shard, dtype=torch.float32, device=param.device)
        self.grad_sum = torch.zeros(param.shape, dtype=VALUE_EMBED_GRAD_DTYPE, device=param.device)
        self.reset()

    def reset(self) -> None:
        """Back to no events and no gradient, in place (the post-warm-up reset)."""
        self.exp_avg.zero_()
        self.exp_avg_sq.zero_()
        self.grad_sum.zero_()
        self.events = 0

    @torch.no_grad()
    def accumulate(self, grad: torch.Tensor) -> None:
        """Add one step's gradient of value_embeds (dense, the parameter's shape) to the cycle's fp16 sum."""
        if grad.shape != self.param.shape:
            raise ValueError(f"value_embeds gradient has shape {tuple(grad.shape)}, expected {tuple(self.param.shape)}")
        self.grad_sum += grad.to(VALUE_EMBED_GRAD_DTYPE)

    @torch.no_grad()
    def update(self, step: int, lr: float, weight_decay: float = ADAM_WEIGHT_DECAY, eps: float = ADAM_EPS) -> None:
        """The event at `step` (a collective): rank-mean the cycle's gradient, Adam on this rank's shard,
        gather the shards into every rank's parameter, clear the sum. `lr` is Adam's scheduled base lr."""
        grad = self.grad_sum
        if self.world_size > 1:
            dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=self.group)
        g = grad[self.own].mul_(1.0 / self.world_size).float()  # / world in fp16, as the record's owner merge
        (beta1, beta2), wd_mul = value_embed_betas_and_wd_mul(step, self.period4_start)
        lr = lr * VALUE_EMBED_LR_MUL
        self.events += 1
        t = self.events
        # The record's AnvilAndAdam._adam_update: step size and decay in Python doubles, fp32 on use.
        step_size = lr * ((1 - beta2 ** t) ** 0.5 / (1 - beta1 ** t))
        decay = lr * lr * weight_decay * wd_mul
        m, v = self.exp_avg, self.exp_avg_sq
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        update = m.div(v.sqrt().add_(eps)).mul_(step_size)
        p = self.param.data[self.own]
        pf = p.float()
        update.addcmul_(pf, (update * pf > 0).float(), value=decay)
        p.copy_(pf - update)
        if self.world_size > 1:
            _all_gather(self.param.data, self.param.data[self.own].clone(), group=self.group)
        self.grad_sum.zero_()


def value_embed_adam_bytes_per_rank(rows: int, dim: int, world_size: int) -> dict[str, int]:
    """Per-rank bytes of value_embeds' optimizer state as ValueEmbedAdam holds it (fp32 moments of the
    shard, the fp16 cycle gradient of the whole table); the parameter itself is the model's."""
    shard = rows // world_size * dim
    return {"exp_avg": 4 * shard, "exp_avg_sq": 4 * shard, "grad_sum": 2 * rows * dim,
            "total": 8 * shard + 2 * rows * dim}
