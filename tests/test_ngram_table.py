"""The record's hashed n-gram table and its row-sparse optimizers (model/ngram_table.py,
model/sharded_rows.py, model/row_adam.py).

The references here are written from the record's formulas (the module docstrings give them) and never
call the code they check: a plain-Python hash with explicit int32 wrap, and a dense table in plain
torch that decays every row's second moment at every event. The table runs a short schedule (the
cadence switch scaled to step 6) on one rank and on two gloo ranks; the loss weights are small
integers, so every gradient sum is exact in fp16 and bf16 and the comparisons are bit for bit.
"""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from model.ngram_table import NGRAM_ROWS, NgramTable, ngram_row_ids, table_bytes_per_rank
from model.row_adam import (NgramRowAdam, ValueEmbedAdam, is_update_step, ngram_beta2_and_wd_mul,
                            value_embed_betas_and_wd_mul)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROWS, DIM, POOL = 40, 16, 8      # a small table: 20 bigram rows, 20 trigram rows, an 8-row sign pool
PERIOD4, STEPS, T = 6, 14, 12    # events 1, 3, 5, then 7, 11; steps 12-13 never update
LR = 0.008 * 0.75                # Adam's base lr times a schedule multiplier
VE_VOCAB, VE_PLANES = 8, 4       # value_embeds: 4 planes x 8 tokens


# ---- references ------------------------------------------------------------------------------

def ref_wrap32(v):
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def ref_row_ids(x, rows, pool):
    """The sheet's hashes in plain Python: (bigram row, trigram row, bigram sign, trigram sign) lists."""
    half = rows // 2
    m, tm = half - 1, rows - half - 1
    out = ([], [], [], [])
    for t in range(len(x)):
        if t == 0:
            bi = m
        else:
            prev = m if t == 1 else x[t - 1]  # the t = 1 rule: M, not x_0
            bi = (ref_wrap32(36313 * x[t]) ^ ref_wrap32(27191 * prev)) % m
        if t < 2:
            tri = rows - 1
        else:
            tri = (ref_wrap32(17351 * x[t]) ^ ref_wrap32(60961 * x[t - 1]) ^ ref_wrap32(45259 * x[t - 2])) % tm + half
        sb = (30011 * x[t - 1] ^ 48271 * x[t]) & (pool - 1) if t >= 1 else 0
        st = (26801 * x[t - 2] ^ 39779 * x[t - 1] ^ 58699 * x[t]) & (pool - 1) if t >= 2 else 0
        for lst, v in zip(out, (bi, tri, sb, st)):
            lst.append(v)
    return out


def cycles(steps, period4):
    """Steps grouped into update cycles, each ending at an event (the last may not); the sheet's cadence."""
    out, cur = [], []
    for s in range(steps):
        cur.append(s)
        if (s % 4 == 3) if s >= period4 else (s % 2 == 1):
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def step_tokens(rank, step):
    """Token ids of a rank's step: even cycles draw from 0..5, odd ones from 6..11, so rows go
    untouched for a cycle and come back (the lazy decay's case); both ranks share rows."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    lo = 0 if (step // 4) % 2 == 0 else 6
    return torch.randint(lo, lo + 6, (T,), generator=g)


def step_weights(rank, step):
    g = torch.Generator().manual_seed(5000 + 1000 * rank + step)
    return torch.randint(-2, 3, (T, DIM), generator=g).float()


class DenseTable:
    """The whole table in plain torch: row Adam with beta1 0 and every row's v decayed at every event."""

    def __init__(self, pool):
        self.pool, self.table = pool, torch.zeros(ROWS, DIM, dtype=torch.bfloat16)
        self.v, self.events = torch.zeros(ROWS), 0

    def forward(self, tokens):
        bi, tri, sb, st = (torch.tensor(a) for a in ref_row_ids(tokens.tolist(), ROWS, POOL))
        out = self.table[bi].float() * self.pool[sb].float() + self.table[tri].float() * self.pool[st].float()
        return out.to(torch.bfloat16)

    def grad(self, tokens, w):
        bi, tri, sb, st = (torch.tensor(a) for a in ref_row_ids(tokens.tolist(), ROWS, POOL))
        g = torch.zeros(ROWS, DIM, dtype=torch.float64)
        g.index_add_(0, bi, (w * self.pool[sb].float()).double())
        g.index_add_(0, tri, (w * self.pool[st].float()).double())
        return g

    def event(self, grad_mean, step, lr):
        beta2, wd_mul = (0.95 ** 2, 10.0) if step >= PERIOD4 else (0.95, 5.0)
        lr = 49 * lr
        self.events += 1
        g = grad_mean.float()
        self.v = self.v * beta2 + (g * g).sum(1) / DIM * (1 - beta2)
        u = g / (self.v.sqrt() + 1e-10)[:, None] * (lr * (1 - beta2 ** self.events) ** 0.5)
        p = self.table.float()
        u = u + torch.where(u * p > 0, p * (lr * lr * 0.005 * wd_mul), torch.zeros_like(p))
        self.table = (p - u).to(torch.bfloat16)


def dense_run(ranks, pool):
    """The reference over the schedule: ng per (rank, step), and per event the summed gradient,
    the rows any rank read, the table and v after it."""
    ref, ng, events = DenseTable(pool), {}, []
    for steps in cycles(STEPS, PERIOD4):
        grad, read = torch.zeros(ROWS, DIM, dtype=torch.float64), set()
        for s in steps:
            for r in ranks:
                ng[r, s] = ref.forward(step_tokens(r, s))
                grad += ref.grad(step_tokens(r, s), step_weights(r, s))
                bi, tri, _, _ = ref_row_ids(step_tokens(r, s).tolist(), ROWS, POOL)
                read |= set(bi) | set(tri)
        if is_event(steps[-1]):
            ref.event(grad / len(ranks), steps[-1], LR)
            events.append(dict(grad=grad, read=sorted(read), table=ref.table.clone(), v=ref.v.clone()))
    return ng, events, ref


def is_event(step):
    return (step % 4 == 3) if step >= PERIOD4 else (step % 2 == 1)


def drive_table(table, ranks, scale=1.0):
    """Run the schedule on an NgramTable: each step embeds every given rank's tokens; returns ng per
    (rank, step) and per event the returned rows and gradient, the shard and its second moments."""
    ng, events = {}, []
    for steps in cycles(STEPS, PERIOD4):
        table.begin_cycle([step_tokens(r, s) for s in steps for r in ranks])
        for s in steps:
            for r in ranks:
                out = table.embed(step_tokens(r, s))
                ng[r, s] = out.detach().clone()
                (out.float() * step_weights(r, s) * scale).sum().backward()
        if is_update_step(steps[-1], PERIOD4):
            rows, grad = table.end_cycle(steps[-1], LR)
            events.append(dict(rows=rows, grad=grad, shard=table.shard.clone(), v=table.adam.second_moment()))
    return ng, events


def ve_grad(rank, step):
    """A sparse value_embeds gradient: this step's tokens' rows of each plane, multiples of 1/16."""
    g = torch.zeros(VE_PLANES * VE_VOCAB, DIM)
    w = step_weights(rank, step) / 16
    for p in range(VE_PLANES):
        g.index_add_(0, step_tokens(rank, step) % VE_VOCAB + p * VE_VOCAB, w * (p + 1))
    return g


def ve_init():
    return (0.01 * torch.randn(VE_PLANES * VE_VOCAB, DIM, generator=torch.Generator().manual_seed(7))).bfloat16()


def drive_value_embeds(opt, ranks):
    """The parameter after each event (and, last, this rank's first moments)."""
    out = []
    for s in range(STEPS):
        for r in ranks:
            opt.accumulate(ve_grad(r, s))
        if is_update_step(s, PERIOD4):
            opt.update(s, LR)
            out.append(opt.param.detach().clone())
    return out + [opt.exp_avg.clone()]


def dense_value_embeds(ranks):
    """value_embeds' Adam on the whole table, every row at every event, from the sheet's formula: the
    parameter after each event, then the first moments."""
    w, m, v = ve_init().float(), torch.zeros(VE_PLANES * VE_VOCAB, DIM), torch.zeros(VE_PLANES * VE_VOCAB, DIM)
    t, out, grad = 0, [], 0
    for s in range(STEPS):
        grad = grad + sum(ve_grad(r, s) for r in ranks)
        if is_event(s):
            (b1, b2), wd_mul = ((0.75 ** 2, 0.95 ** 2), 10.0) if s >= PERIOD4 else ((0.75, 0.95), 5.0)
            t += 1
            g, grad = grad / len(ranks), 0
            m = m * b1 + (1 - b1) * g
            v = v * b2 + (1 - b2) * g * g
            lr = 70 * LR
            u = m / (v.sqrt() + 1e-10) * (lr * (1 - b2 ** t) ** 0.5 / (1 - b1 ** t))
            u = u + torch.where(u * w > 0, w * (lr * lr * 0.005 * wd_mul), torch.zeros_like(w))
            w = (w - u).bfloat16().float()
            out.append(w.bfloat16())
    return out + [m]


# ---- tests -----------------------------------------------------------------------------------

def test_row_ids_match_plain_python_reference():
    toy = [50256, 11, 50303, 0, 1, 318, 50256, 262, 50303, 50303, 7, 7]
    g = torch.Generator().manual_seed(0)
    long = torch.randint(0, 50304, (400,), generator=g).tolist() + [2 ** 31 - 1, 123456789, 2 ** 30]
    wrapped = 0
    for x in (toy, long, [5], [5, 9], []):
        for rows, pool in ((NGRAM_ROWS, 8192), (ROWS, POOL), (1000, 64)):
            got = [a.tolist() for a in ngram_row_ids(torch.tensor(x, dtype=torch.int64), rows, pool)]
            assert got == [list(a) for a in ref_row_ids(x, rows, pool)], (x[:5], rows)
        # the reference's int32 wrap changes rows on this sequence: the wrap is exercised
        half = NGRAM_ROWS // 2
        wrapped += sum((36313 * x[t] ^ 27191 * x[t - 1]) % (half - 1) != b
                       for t, b in enumerate(ref_row_ids(x, NGRAM_ROWS, 8192)[0]) if t >= 2)
    assert wrapped > 0
    bi, tri, sb, st = ngram_row_ids(torch.tensor(toy))
    m = NGRAM_ROWS // 2 - 1  # 42,301,439
    assert bi[0] == m and (tri[:2] == NGRAM_ROWS - 1).all() and sb[0] == 0 and (st[:2] == 0).all()
    assert bi[1] == (ref_wrap32(36313 * toy[1]) ^ ref_wrap32(27191 * m)) % m  # t = 1 hashes M, not x_0 ...
    assert bi[1] != (ref_wrap32(36313 * toy[1]) ^ ref_wrap32(27191 * toy[0])) % m
    assert sb[1] == (30011 * toy[0] ^ 48271 * toy[1]) & 8191  # ... while the sign hash reads x_0
    assert (bi < NGRAM_ROWS // 2).all() and (tri >= NGRAM_ROWS // 2).all()


def test_update_events_and_their_constants():
    events = [s for s in range(570) if is_update_step(s)]
    assert events == list(range(1, 160, 2)) + list(range(163, 568, 4))  # last event 567: 568-569 never apply
    assert len(events) == 80 + 102
    for switch in range(0, 40):  # a scaled switch step never makes a cycle longer than 4 steps
        ends = [-1] + [s for s in range(80) if is_update_step(s, switch)]
        assert max(b - a for a, b in zip(ends, ends[1:])) <= 4, switch
    assert ngram_beta2_and_wd_mul(159) == (0.95, 5.0) and ngram_beta2_and_wd_mul(163) == (0.95 ** 2, 10.0)
    assert value_embed_betas_and_wd_mul(159) == ((0.75, 0.95), 5.0)
    assert value_embed_betas_and_wd_mul(160) == ((0.5625, 0.9025), 10.0)
    with pytest.raises(ValueError, match="step"):
        is_update_step(-1)


def check_against_dense(got_ng, ranks, ref_ng, ref_events, shards):
    assert got_ng.keys() == {(r, s) for r in ranks for s in range(STEPS)}
    for key, ng in got_ng.items():
        assert torch.equal(ng, ref_ng[key]), key
    assert len(ref_events) == 5
    for k, ref in enumerate(ref_events):
        table = torch.cat([shards[r][k]["shard"] for r in sorted(shards)])
        assert torch.equal(table, ref["table"]), f"event {k}"
        assert torch.equal(torch.cat([shards[r][k]["v"] for r in sorted(shards)]), ref["v"]), f"event {k}"
        rows = torch.cat([shards[r][k]["rows"] for r in sorted(shards)])
        assert rows.tolist() == ref["read"]  # exactly the rows some rank read this cycle
        grad = torch.cat([shards[r][k]["grad"] for r in sorted(shards)])
        assert torch.equal(grad.double(), ref["grad"][rows])


def lazy_rows_exercised(ref_events):
    """Rows read at an event, not at the next, read again at the one after: their v was replayed."""
    return [row for a, b, c in zip(ref_events, ref_events[1:], ref_events[2:])
            for row in set(a["read"]) & set(c["read"]) - set(b["read"])]


def test_one_rank_cycles_match_the_dense_reference():
    table = NgramTable(ROWS, DIM, seed=3, period4_start=PERIOD4, sign_pool_rows=POOL)
    got_ng, got_events = drive_table(table, ranks=(0,))
    ref_ng, ref_events, ref = dense_run((0,), table.sign_pool)
    check_against_dense(got_ng, (0,), ref_ng, ref_events, {0: got_events})
    assert lazy_rows_exercised(ref_events)
    # a row an event does not touch keeps its weights exactly (its v decays, lazily)
    for before, after in zip(ref_events, ref_events[1:]):
        untouched = sorted(set(range(ROWS)) - set(after["read"]))
        assert torch.equal(before["table"][untouched], after["table"][untouched])
        assert (after["v"][untouched] < before["v"][untouched]).any()
    tokens = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    assert torch.equal(table.lookup(tokens), ref.forward(tokens))  # the evaluation read, post-update


def test_lazy_second_moment_equals_eager_decay_bit_for_bit():
    """NgramRowAdam alone, rows touched at random events with random gradients: every row's v and
    weight against a dense table that decays every row every event."""
    g = torch.Generator().manual_seed(11)
    adam, w = NgramRowAdam(24, period4_start=PERIOD4), torch.randn(24, DIM, generator=g).bfloat16()
    ref_w, ref_v = w.clone().float(), torch.zeros(24)
    for e, step in enumerate(s for s in range(40) if is_event(s)):
        rows = torch.randperm(24, generator=g)[:int(torch.randint(1, 6, (1,), generator=g))]
        grad = torch.randn(rows.numel(), DIM, generator=g).bfloat16()
        adam.event(w, rows, grad, step=step, lr=LR, world_size=2)
        beta2, wd_mul = (0.9025, 10.0) if step >= PERIOD4 else (0.95, 5.0)
        dense = torch.zeros(24, DIM)
        dense[rows] = grad.float() / 2
        ref_v = ref_v * beta2 + (dense * dense).sum(1) / DIM * (1 - beta2)
        u = dense / (ref_v.sqrt() + 1e-10)[:, None] * (49 * LR * (1 - beta2 ** (e + 1)) ** 0.5)
        u = u + torch.where(u * ref_w > 0, ref_w * ((49 * LR) ** 2 * 0.005 * wd_mul), torch.zeros_like(u))
        ref_w = (ref_w - u).bfloat16().float()
        assert torch.equal(adam.second_moment(), ref_v)
        assert torch.equal(w.float(), ref_w)
    assert adam.events > 10 and (adam.last_event < adam.events).any()  # some rows are behind: replayed


def test_value_embed_adam_matches_dense_adam_on_every_row():
    param = ve_init()
    got = drive_value_embeds(ValueEmbedAdam(param, period4_start=PERIOD4), ranks=(0,))
    ref = dense_value_embeds((0,))
    assert len(got) == 5 + 1
    for k, (a, b) in enumerate(zip(got, ref)):
        assert torch.equal(a, b), f"event {k}"
    got, ref = got[:-1], ref[:-1]
    # rows no gradient touched in the last cycle still move (momentum and decay): unlike the n-gram table
    last = sum(ve_grad(0, s) for s in range(8, 12)).abs().sum(1) == 0
    assert last.any() and (got[-1][last] != got[-2][last]).any()


def _gloo_worker(rank, world, init_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        table = NgramTable(ROWS, DIM, world_size=world, rank=rank, seed=3, period4_start=PERIOD4,
                           sign_pool_rows=POOL)
        ng, events = drive_table(table, ranks=(rank,))
        looked = table.lookup(step_tokens(rank, 99))
        ve = drive_value_embeds(ValueEmbedAdam(ve_init(), world_size=world, rank=rank, period4_start=PERIOD4),
                                ranks=(rank,))
        torch.save(dict(ng=ng, events=events, lookup=looked, pool=table.sign_pool, ve=ve),
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_equal_one_unsharded_table_and_the_dense_reference(tmp_path):
    mp.spawn(_gloo_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    ref_ng, ref_events, ref = dense_run((0, 1), got[0]["pool"])
    check_against_dense({**got[0]["ng"], **got[1]["ng"]}, (0, 1), ref_ng, ref_events,
                        {r: got[r]["events"] for r in range(2)})
    assert lazy_rows_exercised(ref_events)
    shared = set(ref_events[0]["read"]) & {int(r) for r in got[1]["events"][0]["rows"]}  # rows on the wire
    assert shared and all(len(got[r]["events"][0]["rows"]) for r in range(2))
    for r in range(2):
        assert torch.equal(got[r]["lookup"], ref.forward(step_tokens(r, 99)))
    # one unsharded table over both ranks' batches (the loss halved: the rank mean) gives the same
    one = NgramTable(ROWS, DIM, seed=3, period4_start=PERIOD4, sign_pool_rows=POOL)
    one_ng, one_events = drive_table(one, ranks=(0, 1), scale=0.5)
    assert all(torch.equal(one_ng[k], v) for g in got for k, v in g["ng"].items())
    for k, e in enumerate(one_events):
        assert torch.equal(e["shard"], torch.cat([got[r]["events"][k]["shard"] for r in range(2)]))
        assert torch.equal(e["grad"], torch.cat([got[r]["events"][k]["grad"] for r in range(2)]) / 2)
    # value_embeds: both replicas whole and equal to dense Adam on the rank-mean gradient
    ve_ref = dense_value_embeds((0, 1))
    for k, want in enumerate(ve_ref[:-1]):
        assert torch.equal(got[0]["ve"][k], want) and torch.equal(got[1]["ve"][k], want), f"event {k}"
    assert torch.equal(torch.cat([got[0]["ve"][-1], got[1]["ve"][-1]]), ve_ref[-1])  # each rank's shard of m


def test_bytes_per_rank_at_the_record_size():
    b = table_bytes_per_rank()  # 84,602,880 rows x 512 over 8 ranks
    assert b["shard"] == 10_575_360 * 512 * 2 and round(b["shard"] / 1e9, 1) == 10.8  # the sheet's 10.8 GB
    assert b["second_moment"] == 4 * 10_575_360 and b["last_event"] == 4 * 10_575_360
    assert b["row_cache"] == 2 * 262_144 * 512 * 2 and b["cycle_grad"] == 2 * 4 * 16_384 * 512 * 2
    assert b["total"] == sum(v for k, v in b.items() if k != "total")
    assert table_bytes_per_rank(world_size=1)["shard"] == 84_602_880 * 512 * 2  # 87 GB: no rank holds it
    with pytest.raises(ValueError, match="world_size 7"):
        table_bytes_per_rank(world_size=7)


def test_misuse_gets_clear_errors():
    table = NgramTable(ROWS, DIM, sign_pool_rows=POOL)
    with pytest.raises(RuntimeError, match="begin_cycle"):
        table.embed(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="1-D integer"):
        table.begin_cycle([torch.tensor([[1, 2]])])
    with pytest.raises(ValueError, match=r"\[0, 2\*\*31\)"):
        ngram_row_ids(torch.tensor([3, -1]))
    with pytest.raises(ValueError, match="even row count"):
        NgramTable(41, DIM)
    table.begin_cycle([torch.tensor([1, 2, 3])])
    with pytest.raises(ValueError, match="did not pull"):
        table.embed(torch.tensor([4, 5, 6, 7]))
    ng = table.embed(torch.tensor([1, 2, 3]))
    with pytest.raises(RuntimeError, match="unapplied"):
        table.begin_cycle([torch.tensor([1, 2, 3])])
    table.end_cycle(1, LR)
    with pytest.raises(RuntimeError, match="after its cycle ended"):
        ng.float().sum().backward()
    table.begin_cycle([torch.tensor([1, 2, 3])])
    table.embed(torch.tensor([1, 2, 3])).float().sum().backward()
    table.reset()  # drops the unapplied cycle (the run's last steps, or the post-warm-up reset)
    assert not table.shard.any() and table.adam.events == 0
    table.begin_cycle([torch.tensor([1, 2, 3])])
