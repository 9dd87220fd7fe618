"""model/ optimizers and gradient sync: Muon orthogonalises, parameter groups are complete, the
schedules, Muon's balanced ownership, and on gloo ranks: the synced gradients of a trained model,
before any optimizer, are the means over the ranks (a sum is off by 2, not hidden by Adam or
Muon's normalisation), and the overlapped sync with sharded Muon matches the single-process
optimizer while moving fewer bytes than the blocking all-reduce."""
import collections
import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hints import n_kinds
from model import (GPT, GPTConfig, GradSync, Muon, allreduce_grads, attention_window_blocks, build_optimizers,
                   lr_multiplier, muon_momentum)
from model.optim import GRAD_SYNCS
from model.collectives import COMM_BYTES
from model.muon import MUON_BUCKETS, assign_owners, newton_schulz_cost, split_buckets


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_config(arch):
    return GPTConfig(vocab_size=256, n_layer=2, n_head=2, n_embd=32, arch=arch, max_seq_len=16, n_hint_kinds=n_kinds(3))


@pytest.mark.parametrize("shape", [(48, 24), (24, 48), (32, 32)])
def test_muon_update_is_orthogonalised(shape):
    torch.manual_seed(0)
    rows, cols = shape
    k = min(shape)
    u, _ = torch.linalg.qr(torch.randn(rows, k))
    v, _ = torch.linalg.qr(torch.randn(cols, k))
    grad = u @ torch.diag(torch.logspace(0, -2, k)) @ v.T  # condition number 100
    weight = torch.nn.Parameter(torch.randn(shape))
    before = weight.detach().clone()
    weight.grad = grad
    lr = 0.1
    Muon([weight], lr=lr).step()
    update = (before - weight.detach()) / (lr * max(1.0, rows / cols) ** 0.5)
    singular = torch.linalg.svdvals(update)
    # quintic Newton-Schulz maps every singular value into roughly [0.7, 1.2]
    assert singular.min() > 0.6 and singular.max() < 1.3


def test_muon_zero_grad_is_a_no_op():
    weight = torch.nn.Parameter(torch.randn(8, 4))
    before = weight.detach().clone()
    weight.grad = torch.zeros(8, 4)
    Muon([weight]).step()
    assert torch.equal(weight.detach(), before)


def test_muon_rejects_vectors():
    with pytest.raises(ValueError):
        Muon([torch.nn.Parameter(torch.zeros(4))])


@pytest.mark.parametrize("arch", ["speedrun", "gpt2"])
def test_build_optimizers_covers_every_parameter_once(arch):
    model = GPT(tiny_config(arch))
    optimizers = build_optimizers(model, arch=arch, lr_scale=0.5)
    seen = [id(p) for opt in optimizers for group in opt.param_groups for p in group["params"]]
    assert sorted(seen) == sorted(id(p) for p in model.parameters())
    for opt in optimizers:
        for group in opt.param_groups:
            assert group["lr"] == group["initial_lr"] > 0
    if arch == "speedrun":
        (muon,) = [opt for opt in optimizers if isinstance(opt, Muon)]
        muon_params = {id(p) for group in muon.param_groups for p in group["params"]}
        assert muon_params == {id(p) for p in model.blocks.parameters() if p.ndim == 2}


def test_lr_multiplier():
    assert [lr_multiplier(s, 100, 0, 0.4) for s in (0, 59, 60, 80, 100)] == [1.0, 1.0, 1.0, 0.5, 0.0]
    assert lr_multiplier(0, 100, warmup_steps=10, cooldown_frac=1.0) == 0.1
    assert lr_multiplier(9, 100, warmup_steps=10, cooldown_frac=1.0) == 1.0
    # llm.c's cosine decay: a quarter of the way down it is cos^2(pi/8), not the linear 0.75
    assert lr_multiplier(25, 100, cooldown_frac=1.0, shape="cosine") == pytest.approx(math.cos(math.pi / 8) ** 2)
    assert lr_multiplier(50, 100, cooldown_frac=1.0, shape="cosine") == pytest.approx(0.5)
    assert lr_multiplier(100, 100, cooldown_frac=1.0, shape="cosine") == 0.0
    assert lr_multiplier(55, 100, warmup_steps=10, cooldown_frac=1.0) == 0.5
    assert lr_multiplier(99, 100) == 1.0


def test_muon_momentum_warmup():
    assert muon_momentum(0) == pytest.approx(0.85)
    assert muon_momentum(150) == pytest.approx(0.90)
    assert muon_momentum(300) == muon_momentum(1000) == pytest.approx(0.95)
    assert muon_momentum(5, warmup_steps=0) == pytest.approx(0.95)


def test_attention_window_schedule():
    # the record of 2025-01-04: 128 -> 1856 tokens over the run, in whole blocks of 128
    assert attention_window_blocks(0, 1390) == 1
    assert attention_window_blocks(695, 1390) == 7
    assert attention_window_blocks(1390, 1390) == 14
    blocks = [attention_window_blocks(s, 1390) for s in range(1391)]
    assert blocks == sorted(blocks)


def test_muon_owners_balance_the_record_buckets():
    # 12 layers x (4 square 768x768 + fc 3072x768 + proj 768x3072), 8 ranks, 3 buckets: every rank
    # gets the same Newton-Schulz work and the same number of elements in every bucket
    shapes = [s for _ in range(12) for s in [(768, 768)] * 4 + [(3072, 768), (768, 3072)]]
    buckets = split_buckets([a * b for a, b in shapes], MUON_BUCKETS)
    assert len(buckets) == 3
    for members in buckets:
        bucket_shapes = [shapes[i] for i in members]
        owners = assign_owners(bucket_shapes, 8)
        cost = [sum(newton_schulz_cost(s) for s, o in zip(bucket_shapes, owners) if o == r) for r in range(8)]
        numel = [sum(a * b for (a, b), o in zip(bucket_shapes, owners) if o == r) for r in range(8)]
        assert len(set(cost)) == 1 and len(set(numel)) == 1, (cost, numel)
    # uneven: 5 matrices on 2 ranks, the big one alone
    owners = assign_owners([(64, 64), (8, 8), (8, 8), (8, 8), (8, 8)], 2)
    assert owners[0] != owners[1] and owners.count(owners[0]) == 1


# ---------------------------------------------------------------------------------------------
# Distributed: the overlapped sync + sharded Muon against the blocking all-reduce path and the
# single-process optimizer, on gloo ranks.

WORLD_SIZE = 2            # uneven shares: 5 matrices, and the GPT's 3 buckets of 2-5 matrices
STEPS = 3
MATRIX_SHAPES = [(16, 8), (16, 8), (16, 8), (8, 16), (12, 12)]
# bf16 tolerance: the distributed Muon updates travel in bf16 (8 bits of mantissa, ~0.4%)
BF16_RTOL, BF16_ATOL = 2e-2, 1e-3


def tiny_backbone():
    """A speedrun GPT with every later-record feature on, small enough for a test."""
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=256, n_layer=4, n_head=2, n_embd=32, max_seq_len=16, unet_skips=True,
                         embed_skips=True, value_embeds=1, window_attn=True, attn_block_size=4, bos_id=7,
                         no_attn_layers=(2,), rope="half", n_hint_kinds=n_kinds(3)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def matrices():
    torch.manual_seed(0)
    return torch.nn.ParameterList(torch.nn.Parameter(torch.randn(shape)) for shape in MATRIX_SHAPES)


def matrix_grads(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(shape, generator=g) for shape in MATRIX_SHAPES]


def gpt_batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    idx = torch.randint(0, 256, (2, 16), generator=g)
    hints = torch.randint(-1, 256, (2, 16, 3), generator=g)
    kinds = torch.randint(0, n_kinds(3), (2, 16, 3), generator=g).masked_fill(hints < 0, -1)
    return idx, idx.roll(-1, 1), hints, kinds


def set_schedules(model, optimizers, step):
    model.set_window_blocks(attention_window_blocks(step, STEPS, block_size=4, start_tokens=4, end_tokens=16))
    for opt in optimizers:
        if isinstance(opt, Muon):
            for group in opt.param_groups:
                group["momentum"] = muon_momentum(step, warmup_steps=STEPS)


def tiny_gpt2():
    torch.manual_seed(0)
    return GPT(tiny_config("gpt2"))


def train_distributed(rank, grad_sync, arch="speedrun", bf16_tables=False):
    """STEPS steps of the tiny backbone on this rank's batches; (state, bytes this rank sent).
    bf16_tables: the GPU path's bf16 embedding tables (GPT.cast_embeddings), forwards under CPU
    bf16 autocast as the GPU's are."""
    model = tiny_backbone() if arch == "speedrun" else tiny_gpt2()
    if bf16_tables:
        model.cast_embeddings(torch.bfloat16)
    optimizers = build_optimizers(model, arch=arch, rank=rank, world_size=WORLD_SIZE, grad_sync=grad_sync)
    sync = GradSync(model, optimizers) if grad_sync == "overlap" else None
    COMM_BYTES.reset()
    launched_in_backward = []
    for step in range(STEPS):
        if arch == "speedrun":
            set_schedules(model, optimizers, step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16_tables):
            loss = model(*gpt_batch(rank, step))
        loss.backward()
        if sync is not None:
            # the hooks started every bucket during backward (all of them: every parameter has a
            # gradient); on the first step in the guessed order, then in the observed one
            launched_in_backward.append([b.state for b in sync.buckets].count("launched") == len(sync.buckets))
            sync.wait()
        else:
            allreduce_grads(model)
        for opt in optimizers:
            opt.step()
        if sync is not None:
            sync.zero_grad()
        else:
            model.zero_grad(set_to_none=True)
    assert all(launched_in_backward), launched_in_backward
    return {k: v.clone() for k, v in model.state_dict().items()}, dict(COMM_BYTES.bytes)


def trained_backbone_state(steps=3):
    """tiny_backbone()'s weights after `steps` single-process steps on batches no rank uses: the head,
    the projections and the mixes are nonzero, so every gradient carries signal (at init the zero
    head and projections leave most of them exactly zero)."""
    model = tiny_backbone()
    optimizers = build_optimizers(model, arch="speedrun")
    for step in range(steps):
        model(*gpt_batch(WORLD_SIZE, step)).backward()
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
    return model.state_dict()


def backbone_from(state, bf16_tables=False):
    model = tiny_backbone()
    model.load_state_dict(state)
    if bf16_tables:
        model.cast_embeddings(torch.bfloat16)
    model.set_window_blocks(2)
    return model


def reduced_grads(rank, state, grad_sync, bf16_tables=False):
    """{name: gradient} after one backward on this rank's batch and the sync, before any optimizer
    step. allreduce: every gradient averaged. overlap: the all-reduce buckets waited for, and Muon's
    reduce-scatters too (its step() would wait for them): this rank's own matrices averaged, the
    others left as this rank computed them."""
    model = backbone_from(state, bf16_tables)
    optimizers = build_optimizers(model, arch="speedrun", rank=rank, world_size=WORLD_SIZE, grad_sync=grad_sync)
    sync = GradSync(model, optimizers) if grad_sync == "overlap" else None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16_tables):
        loss = model(*gpt_batch(rank, 0))
    loss.backward()
    if sync is None:
        allreduce_grads(model)
    else:
        sync.wait()
        for bucket in sync.sharded:
            bucket.wait()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def distributed_worker(rank, port, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    try:
        state = torch.load(os.path.join(out_dir, "trained.pt"))
        results = {f"reduced_{grad_sync}": reduced_grads(rank, state, grad_sync) for grad_sync in GRAD_SYNCS}
        results["reduced_bf16_tables"] = reduced_grads(rank, state, "overlap", bf16_tables=True)
        # plain matrices, sharded Muon without a GradSync: step() reduce-scatters by itself
        params = matrices()
        muon = Muon(list(params), lr=0.05, rank=rank, world_size=WORLD_SIZE)
        for step in range(STEPS):
            for p, g in zip(params, matrix_grads(rank, step)):
                p.grad = g
            muon.step()
        results["matrices"] = [p.detach().clone() for p in params]
        for grad_sync in ("allreduce", "overlap"):
            results[grad_sync], results[grad_sync + "_bytes"] = train_distributed(rank, grad_sync)
            # gpt2: tied embedding and head, AdamW only; the hooks' buckets against the blocking path
            results["gpt2_" + grad_sync], _ = train_distributed(rank, grad_sync, arch="gpt2")
        results["bf16_tables"], results["bf16_tables_bytes"] = train_distributed(rank, "overlap", bf16_tables=True)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def single_process_reference():
    """The same STEPS steps on one process, each gradient the mean over the ranks' batches."""
    model = tiny_backbone()
    optimizers = build_optimizers(model, arch="speedrun")
    for step in range(STEPS):
        set_schedules(model, optimizers, step)
        loss = sum(model(*gpt_batch(r, step)) for r in range(WORLD_SIZE)) / WORLD_SIZE
        loss.backward()
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
    return model


def blocking_path_bytes_before_this_change(model):
    """What the step sent before GradSync (computed from tensor sizes, per rank): one all-reduce
    of every float32 gradient, then float32 all-gathers of Muon updates in chunks of world_size
    same-shape matrices (a short chunk still sends a full one)."""
    W = WORLD_SIZE
    n_all = sum(p.numel() for p in model.parameters())
    by_shape = collections.Counter(tuple(p.shape) for n, p in model.named_parameters()
                                   if n.startswith("blocks.") and p.ndim == 2)
    gathered = sum(math.ceil(count / W) * W * math.prod(shape) for shape, count in by_shape.items())
    return 2 * (W - 1) / W * 4 * n_all + (W - 1) / W * 4 * gathered


def assert_synced_gradients_are_the_mean(results, state, path):
    """Before any optimizer: after the sync every gradient a rank holds reduced is the mean of the
    ranks' own gradients (computed here, one backward per rank's batch), so a sum would be off by a
    factor of 2, not by an optimizer's eps. On the overlap path Muon's matrices are reduce-scattered:
    exactly one rank (the owner) holds each one's mean, the others their own gradient."""
    bf16 = path == "reduced_bf16_tables"
    own = []
    for r in range(WORLD_SIZE):
        model = backbone_from(state, bf16)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(*gpt_batch(r, 0))
        loss.backward()
        own.append({name: p.grad.detach().float() for name, p in model.named_parameters()})
    tol = dict(rtol=2e-2, atol=1e-6) if bf16 else dict(rtol=1e-5, atol=1e-8)
    sharded = {n for n, p in backbone_from(state).named_parameters() if n.startswith("blocks.") and p.ndim == 2}
    assert sharded and len(sharded) < len(own[0])
    for name in own[0]:
        mean = sum(g[name] for g in own) / WORLD_SIZE
        assert (mean != 0).any() and not torch.allclose(mean, 2 * mean, **tol), name  # a sum would be seen
        got = [results[r][path][name].float() for r in range(WORLD_SIZE)]
        if path == "reduced_allreduce" or name not in sharded:
            for r in range(WORLD_SIZE):
                torch.testing.assert_close(got[r], mean, **tol, msg=lambda m: f"{path} rank {r} {name}: {m}")
        else:
            holders = [r for r in range(WORLD_SIZE) if torch.allclose(got[r], mean, **tol)]
            assert len(holders) == 1, (path, name, holders)
            for r in set(range(WORLD_SIZE)) - set(holders):
                torch.testing.assert_close(got[r], own[r][name], **tol, msg=lambda m: f"{path} rank {r} {name}: {m}")


def test_distributed_paths_match_single_process_and_overlap_moves_fewer_bytes(tmp_path):
    state = trained_backbone_state()
    torch.save(state, tmp_path / "trained.pt")
    mp.spawn(distributed_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD_SIZE)]
    # the synced gradients of a trained model, before any optimizer, are the means over the ranks
    for path in ("reduced_allreduce", "reduced_overlap", "reduced_bf16_tables"):
        assert_synced_gradients_are_the_mean(results, state, path)
    # every rank holds the same weights, on both paths
    for r in range(1, WORLD_SIZE):
        for a, b in zip(results[0]["matrices"], results[r]["matrices"]):
            assert torch.equal(a, b)
        for path in ("allreduce", "overlap", "gpt2_allreduce", "gpt2_overlap", "bf16_tables"):
            for name, tensor in results[0][path].items():
                assert torch.equal(tensor, results[r][path][name]), (path, name)
    # the sharded Muon on its own equals the single-process Muon on the averaged gradients
    params = matrices()
    muon = Muon(list(params), lr=0.05)
    for step in range(STEPS):
        per_rank = [matrix_grads(r, step) for r in range(WORLD_SIZE)]
        for i, p in enumerate(params):
            p.grad = sum(g[i] for g in per_rank) / WORLD_SIZE
        muon.step()
    for local, distributed in zip(params, results[0]["matrices"]):
        torch.testing.assert_close(local.detach(), distributed, rtol=BF16_RTOL, atol=BF16_ATOL)
    assert not torch.equal(results[0]["matrices"][0], matrices()[0].detach())  # and they moved
    # both GPT paths equal the single-process optimizer
    reference = single_process_reference()
    initial = tiny_backbone().state_dict()
    for name, tensor in reference.state_dict().items():
        for path in ("allreduce", "overlap"):
            torch.testing.assert_close(results[0][path][name], tensor, rtol=BF16_RTOL, atol=BF16_ATOL,
                                       msg=lambda m: f"{path} {name}: {m}")
    moved = [n for n, t in reference.state_dict().items() if not torch.equal(t, initial[n])]
    assert len(moved) > len(initial) // 2
    # gpt2 (every gradient averaged the same way on both paths): bitwise the same weights
    for name, tensor in results[0]["gpt2_allreduce"].items():
        assert torch.equal(tensor, results[0]["gpt2_overlap"][name]), name
    assert not torch.equal(results[0]["gpt2_overlap"]["wte.weight"], tiny_gpt2().state_dict()["wte.weight"])
    # bytes: overlap (reduce-scatter fp32 + all-gather bf16 for Muon) < blocking all-reduce path
    overlap, blocking = results[0]["overlap_bytes"], results[0]["allreduce_bytes"]
    assert set(overlap) == {"all_reduce", "reduce_scatter", "all_gather"}
    assert sum(overlap.values()) < sum(blocking.values())
    assert sum(overlap.values()) < STEPS * blocking_path_bytes_before_this_change(reference)
    # bf16 tables (the GPU path): their gradients are all-reduced in bf16, half the bytes; they train
    tables = ["wte.weight", "value_embeds.0.weight"]
    bf16 = results[0]["bf16_tables"]
    assert all(bf16[name].dtype == torch.bfloat16 for name in tables)
    table_elements = sum(initial[name].numel() for name in tables)
    saved = overlap["all_reduce"] - results[0]["bf16_tables_bytes"]["all_reduce"]
    assert saved == STEPS * 2 * (WORLD_SIZE - 1) / WORLD_SIZE * 2 * table_elements  # 2 bytes less per element
    assert all(not torch.equal(bf16[name].float(), initial[name]) for name in tables)
