"""Training-time hints of the record's representation (train/positional_hints.py through HintPrep):
step 0 has none; step s's hints are those of an index over exactly the tokens before step s;
n-grams restart at BOS and at each rank's slice; and with 2-3 gloo ranks every rank sees the hints
one index gives for its positions while only local rank 0 builds it."""
import os
import signal

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from data.loader import DistributedDataLoader
from data.shards import write_shard
from hints.cells import BOS
from hints.positional import PositionalIndex, phase_ends
from streams import phrase_stream  # tests/streams.py
from train.evaluate import ValHintCache
from train.hint_prep import HintPrep
from train.positional_hints import BUILD_PHASES, PositionalHints, training_stream
from train.val_hints import open_val_index

B, T, WORLD = 2, 32, 2
G = WORLD * B * T  # 128 tokens a step
STEPS = 40         # past the phases at steps 8 and 32
NGRAM = np.arange(100, 120, dtype=np.uint16)
FOLLOW = 7

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def deadline():
    def boom(*_):
        raise TimeoutError("test took longer than 900 s")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(900)  # generous: the first call compiles the Numba kernels (minutes on a busy 2-core box)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def planted_stream(seed=0):
    """Phrases strung together (so n-grams repeat with varied followers), documents of ~40 tokens, and NGRAM -> FOLLOW
    planted inside rank 0's slice of step 1 and again inside slices of steps 3 and 4."""
    rng = np.random.default_rng(seed)
    s = phrase_stream(seed, STEPS * 4 * B * T + 1, 300, 30, 12) + 1000  # up to 4 ranks; phrases repeat
    s[rng.random(s.size) < 1 / 40] = BOS
    ends = {1: 1 * G + 40, 3: 3 * G + B * T + 30, 4: 4 * G + 25}
    for end in ends.values():
        s[end - 19:end + 1] = NGRAM
        s[end + 1] = FOLLOW
    return s, ends


def make_hints(path, directory, rank, world, build):
    h = PositionalHints(str(directory), B, T, rank, world, (6, 10, 20))
    if build:
        h.start_build(path, STEPS)
    return h


def test_record_hints_step0_causal_and_restarting(tmp_path):
    stream, ends = planted_stream()
    path = str(write_shard(tmp_path / "train_000000.bin", stream))
    np.testing.assert_array_equal(training_stream(path, B, T, WORLD, STEPS), stream[:STEPS * G])
    builder = make_hints(path, tmp_path / "idx", 0, WORLD, build=True)
    ranks = [builder] + [make_hints(path, tmp_path / "idx", r, WORLD, build=False) for r in range(1, WORLD)]
    preps = [HintPrep(DistributedDataLoader(path, B, T, rank=r, world_size=WORLD, log=None), None, r, WORLD,
                      positional=h) for r, h in enumerate(ranks)]
    for step in range(STEPS):
        items = [p.prepare() for p in preps]
        assert items[0].hint_tokens.shape == (B, T, 2) and items[0].hint_kinds.shape == (B, T)
        assert items[0].hint_weights.shape == (B, T, 2) and items[0].hint_weights.dtype == torch.float32
        cells = torch.cat([it.hint_kinds.reshape(-1) for it in items]).numpy()
        followers = torch.cat([it.hint_tokens.reshape(-1, 2) for it in items]).numpy()
        if step == 0:
            assert (cells == -1).all() and (followers == -1).all()  # step 0 has no hints
            continue
        # causality: an index over exactly the tokens before this step gives the same hints
        ref = PositionalIndex.build(stream[:step * G], segment=B * T)
        for r in range(WORLD):
            want = ref.lookup_cells(stream[step * G + r * B * T:step * G + (r + 1) * B * T], step * G)
            np.testing.assert_array_equal(items[r].hint_kinds.reshape(-1).numpy(), want.kind)
            np.testing.assert_array_equal(items[r].hint_tokens.reshape(-1, 2).numpy(), want.followers)
            np.testing.assert_array_equal(items[r].hint_weights.reshape(-1, 2).numpy(), want.follower_counts)
        if step == 1:  # first occurrence of the planted n-gram: its follower is not known yet
            assert followers[ends[1] - G, 0] != FOLLOW
        if step in (3, 4):  # seen at step 1, hinted now at the deepest length
            assert followers[ends[step] - step * G, 0] == FOLLOW and cells[ends[step] - step * G] >= 2 * 42
    assert (cells >= 0).mean() > 0.2  # the filler's n-grams repeat: most late positions are hinted
    builder.wait_built()
    assert [e for e, _ in builder.phases] == phase_ends(STEPS, G, BUILD_PHASES) == [8 * G, 32 * G, STEPS * G]
    assert all(h.builder is None for h in ranks[1:])
    # a document boundary restarts n-grams: right after a BOS only the BOS-started n-gram can match
    bos_at = np.flatnonzero(stream[G:STEPS * G] == BOS) + G
    step = STEPS - 1
    late = [p for p in bos_at if step * G <= p < (step + 1) * G - 5 and (p - step * G) % (B * T) < B * T - 5]
    assert late
    full = PositionalIndex.load(sorted((tmp_path / "idx").glob("*.idx"))[-1])
    ref = PositionalIndex.build(stream[:step * G], segment=B * T)
    for p in late:
        r = (p - step * G) // (B * T)
        q = stream[step * G + r * B * T:step * G + (r + 1) * B * T]
        got = full.lookup_cells(q, step * G)
        k = p - step * G - r * B * T
        assert (got.depth[k:k + 5] == -1).all()  # fewer than 6 tokens since the BOS: no 6-gram yet
        np.testing.assert_array_equal(got.kind, ref.lookup_cells(q, step * G).kind)


def _gloo_rank(rank, world, path, directory, init_file, out):
    os.environ.update(OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        local_rank = rank  # one node
        h = make_hints(path, directory, rank, world, build=local_rank == 0)
        prep = HintPrep(DistributedDataLoader(path, B, T, rank=rank,
                                              world_size=world, log=None), None, rank, world, positional=h)
        got = [prep.prepare() for _ in range(12)]
        np.savez(os.path.join(out, f"rank{rank}.npz"), builder=h.builder is not None,
                 kinds=np.stack([g.hint_kinds.numpy() for g in got]),
                 followers=np.stack([g.hint_tokens.numpy() for g in got]),
                 weights=np.stack([g.hint_weights.numpy() for g in got]), pid=os.getpid())
        dist.barrier()
        if h.builder is not None:
            h.wait_built()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_gloo_ranks_share_one_index_built_by_local_rank_0(tmp_path, world):
    stream, _ = planted_stream(seed=world)
    path = str(write_shard(tmp_path / "train_000000.bin", stream))
    mp.spawn(_gloo_rank, args=(world, path, str(tmp_path / "idx"), str(tmp_path / "init"), str(tmp_path)),
             nprocs=world, join=True)
    got = [np.load(tmp_path / f"rank{r}.npz") for r in range(world)]
    assert [bool(g["builder"]) for g in got] == [True] + [False] * (world - 1)  # only local rank 0 builds
    Gw = world * B * T
    full = PositionalIndex.build(stream[:STEPS * Gw], segment=B * T)  # one index, asked for every slice
    hinted = 0
    for step in range(12):
        for r in range(world):
            q = stream[step * Gw + r * B * T:step * Gw + (r + 1) * B * T]
            want = full.lookup_cells(q, step * Gw)
            np.testing.assert_array_equal(got[r]["kinds"][step].reshape(-1), want.kind)
            np.testing.assert_array_equal(got[r]["followers"][step].reshape(-1, 2), want.followers)
            np.testing.assert_array_equal(got[r]["weights"][step].reshape(-1, 2), want.follower_counts)
            hinted += int((want.kind >= 0).sum())
    assert hinted > 0


def test_validation_cells_from_a_saved_positional_index(tmp_path):
    """--val-index with a saved PositionalIndex (the record's representation): the val span's Cells
    with 8 followers from every occurrence it holds, cached per span, as evaluate() feeds them."""
    stream, _ = planted_stream(seed=7)
    train, val = stream[:4000], stream[4000:5000]
    path = PositionalIndex.build(train).save(str(tmp_path / "val.pidx"))
    idx = open_val_index(path, (6, 10, 20), log=lambda *_: None, record=True)
    assert idx.tokens_added == 4000
    cache = ValHintCache()
    followers, cells, weights = cache.get(idx, val, 100, 612, record=True)
    assert followers.shape == (512, 8) and cells.shape == (512,) and weights.dtype == np.float32
    want = PositionalIndex.build(train).lookup_cells(val[100:612], 4000, max_followers=8)
    np.testing.assert_array_equal(cells, want.kind)
    np.testing.assert_array_equal(followers, want.followers)
    assert (cells >= 0).any()
    assert cache.get(idx, val, 100, 612, record=True)[0] is followers  # cached
    with pytest.raises(SystemExit, match="lengths"):
        open_val_index(path, (5, 6, 10, 20), log=lambda *_: None, record=True)
