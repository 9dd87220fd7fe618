"""model/ optimizers: Muon orthogonalises, parameter groups are complete, distributed Muon agrees."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hints import n_kinds
from model import GPT, GPTConfig, Muon, allreduce_grads, build_optimizers, lr_multiplier

WORLD_SIZE = 2
MATRIX_SHAPES = [(16, 8), (16, 8), (16, 8), (8, 16), (12, 12)]  # uneven chunks: some ranks idle
STEPS = 3


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
        assert muon_params == {id(p) for p in model.blocks.parameters()}


def test_lr_multiplier():
    assert [lr_multiplier(s, 100, 0, 0.4) for s in (0, 59, 60, 80, 100)] == [1.0, 1.0, 1.0, 0.5, 0.0]
    assert lr_multiplier(0, 100, warmup_steps=10, cooldown_frac=1.0) == 0.1
    assert lr_multiplier(9, 100, warmup_steps=10, cooldown_frac=1.0) == 1.0
    assert lr_multiplier(55, 100, warmup_steps=10, cooldown_frac=1.0) == 0.5
    assert lr_multiplier(99, 100) == 1.0


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


def distributed_worker(rank, port, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    try:
        # plain matrices: rank-dependent grads, averaged, then a distributed Muon step
        params = matrices()
        muon = Muon(list(params), lr=0.05, rank=rank, world_size=WORLD_SIZE)
        for step in range(STEPS):
            for p, g in zip(params, matrix_grads(rank, step)):
                p.grad = g
            allreduce_grads(params)
            muon.step()
        # a tiny speedrun GPT with the full optimizer set and rank-dependent hinted batches
        torch.manual_seed(0)
        model = GPT(tiny_config("speedrun"))
        optimizers = build_optimizers(model, arch="speedrun", rank=rank, world_size=WORLD_SIZE)
        for step in range(STEPS):
            model(*gpt_batch(rank, step)).backward()
            allreduce_grads(model)
            for opt in optimizers:
                opt.step()
            model.zero_grad(set_to_none=True)
        torch.save({"matrices": [p.detach() for p in params], "gpt": model.state_dict()},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_distributed_muon_keeps_ranks_identical(tmp_path):
    mp.spawn(distributed_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD_SIZE)]
    for a, b in zip(results[0]["matrices"], results[1]["matrices"]):
        assert torch.equal(a, b)
    for name, tensor in results[0]["gpt"].items():
        assert torch.equal(tensor, results[1]["gpt"][name]), name
    # the same run on one process, with the rank-averaged gradients, gives the same matrices
    params = matrices()
    muon = Muon(list(params), lr=0.05)
    for step in range(STEPS):
        per_rank = [matrix_grads(r, step) for r in range(WORLD_SIZE)]
        for i, p in enumerate(params):
            p.grad = sum(g[i] for g in per_rank) / WORLD_SIZE
        muon.step()
    for local, distributed in zip(params, results[0]["matrices"]):
        torch.testing.assert_close(local.detach(), distributed, rtol=1e-5, atol=1e-6)
    # and the matrices moved
    assert not torch.equal(results[0]["matrices"][0], matrices()[0].detach())
