"""The record's optimizers, tail averages and model on two gloo ranks against one process, bitwise:
ANVIL's reduce-scatter / own units / all-gather, Adam's all-reduce and lm_head / embed reduce-scatter /
all-gather with the untie's moment gather, the tail averages' per-shard accumulators and the ship's
gather (one process fed the ranks' mean gradient, exact: the gradients are dyadic), and RecordGPT trained
with ANVIL and Adam (one process fed what the collectives compute; tests/test_record_gpt.py). One spawn
runs every part (each module's gloo_part); torch.distributed's gloo has reduce_scatter on the torch
versions this repo supports, so nothing is emulated."""
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests import test_record_adam, test_record_anvil, test_record_gpt, test_record_tail_average
from tests.record_params import init_gloo

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WORLD = 2
PARTS = {"anvil": test_record_anvil.gloo_part, "adam": test_record_adam.gloo_part,
         "tail": test_record_tail_average.gloo_part, "model": test_record_gpt.gloo_part}


def _rank(rank, init_file, out):
    init_gloo(rank, WORLD, init_file)
    try:
        torch.save({name: part(rank, WORLD) for name, part in PARTS.items()}, f"{out}/rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("gloo")
    mp.spawn(_rank, args=(str(out / "init"), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


@pytest.mark.parametrize("part", PARTS)
def test_two_gloo_ranks_equal_one_process(ranks, part):
    expect = PARTS[part]()
    for r, got in enumerate(ranks):
        assert got[part].keys() == expect.keys()
        for key, value in expect.items():
            same = torch.equal(got[part][key], value) if isinstance(value, torch.Tensor) else got[part][key] == value
            assert same, (part, key, r)
