"""RecordGPT with its optimizers on two gloo ranks: each rank trains on its own packed batch (banks padded
for two ranks, ANVIL's reduce-scatter / own units / all-gather, RecordAdam's all-reduce and the sharded,
tied then untied lm_head / embed), and after four steps both ranks hold bitwise the same weights as one
process fed what the collectives compute: ANVIL the mean of the ranks' gradients each step, Adam on odd
steps the mean of each rank's two-step sum (with embed's sum, transposed, added into lm_head's per rank
while tied), zeros on even steps. (value_embeds' Adam and the n-gram table have their own two-rank
tests: tests/test_ngram_table.py.)"""
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from model.anvil import Anvil
from model.record_adam import RecordAdam
from model.record_gpt import RecordGPT
from tests.record_params import init_gloo
from tests.test_record_gpt import WINDOWS, batch, cell_hints, cu_seqlens, tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WORLD, STEPS, UNTIE = 2, 4, 1


def make_model():
    torch.manual_seed(11)
    return RecordGPT(tiny_config(), world_size=WORLD)


def rank_loss(m, rank):
    idx, targets, ng, prefix = batch(seed=20 + rank)
    return m(idx, targets, cu_seqlens(), ng, windows=WINDOWS, mtp_weights=(1.0, 0.5), prefix_targets=prefix,
             prefix_weight=0.2, hints=cell_hints(seed=20 + rank))


def train(rank=0, world=1):
    """The weights after STEPS steps: on `world` ranks each its own batch; on one process both ranks'."""
    m = make_model()
    labelled = m.labelled_params()
    anvil = Anvil(labelled, rank=rank, world_size=world)
    adam = RecordAdam(labelled, untie_step=UNTIE, rank=rank, world_size=world)
    names = [name for name, _ in m.named_parameters()]
    params = dict(m.named_parameters())
    banks = {"qk_bank", "vo_bank", "mlp_bank"}
    sums = [dict.fromkeys(names, 0.0) for _ in range(WORLD)]  # each rank's two-step Adam sums
    for step in range(STEPS):
        if world > 1:
            rank_loss(m, rank).backward()
        else:
            for r in range(WORLD):
                grads = torch.autograd.grad(rank_loss(m, r), list(params.values()))
                for name, g in zip(names, grads):
                    sums[r][name] = sums[r][name] + g if step % 2 else g  # 0 + g is g, bit for bit
                    if name in banks:
                        params[name].grad = g if r == 0 else (params[name].grad + g) / WORLD
            for name in names:
                if name not in banks:
                    params[name].grad = torch.zeros_like(params[name])
            if step % 2:
                for name in names:
                    if name not in banks:
                        params[name].grad = (sums[0][name] + sums[1][name]) / WORLD
                if step <= UNTIE:  # tied: each rank adds embed's sum, transposed, into lm_head's first
                    params["lm_head"].grad = sum(sums[r]["lm_head"] + sums[r]["embed.weight"].T
                                                 for r in range(WORLD)) / WORLD
                    params["embed.weight"].grad = torch.zeros_like(params["embed.weight"])
        m.value_embeds.grad = None  # its Adam is not part of this test
        anvil.step(lr_scale=1.0, rail_beta=0.9, engaged=step >= 2)
        adam.step(step, 1.0)
    return {name: p.detach().clone() for name, p in m.named_parameters()}


def _rank(rank, init_file, out):
    init_gloo(rank, WORLD, init_file)
    try:
        torch.save(train(rank, WORLD), f"{out}/rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_equal_one_process(tmp_path):
    mp.spawn(_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    expect = train()
    start = {name: p.detach() for name, p in make_model().named_parameters()}
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for name, value in expect.items():
        assert torch.equal(ranks[0][name], ranks[1][name]), name  # in sync
        assert torch.equal(ranks[0][name], value), name
    moved = [name for name in expect if name != "value_embeds" and not torch.equal(expect[name], start[name])]
    assert len(moved) == len(expect) - 1, sorted(set(expect) - set(moved))
