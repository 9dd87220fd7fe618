"""Tests for data/loader.py: determinism, rank layout, global batches, resume, wrap-around,
document alignment, and the plain readers."""

import json

import numpy as np
import pytest

from data.loader import DistributedDataLoader, TokenStream, iter_tokens, read_tokens
from data.manifest import write_manifest
from data.shards import write_shard
from data.tokenizer import EOT_TOKEN

SHARD_SIZES = [1000, 37, 0, 1500, 463]  # uneven, with an empty shard: batches cross shard boundaries


def make_shards(tmp_path, sizes=SHARD_SIZES, seed=0, eot_every=None):
    rng = np.random.default_rng(seed)
    stream = rng.integers(0, 50000, size=sum(sizes), dtype=np.int64)
    if eot_every:
        stream[rng.random(stream.size) < 1 / eot_every] = EOT_TOKEN
    paths, pos = [], 0
    for i, n in enumerate(sizes):
        paths.append(write_shard(tmp_path / f"train_{i:06d}.bin", stream[pos:pos + n]))
        pos += n
    write_manifest(tmp_path)  # the set, recorded as its writer would (data/manifest.py)
    return str(tmp_path / "train_*.bin"), stream.astype(np.uint16)


def loaders(pattern, B, T, W, **kw):
    return [DistributedDataLoader(pattern, B, T, rank=r, world_size=W, log=None, **kw) for r in range(W)]


@pytest.mark.parametrize("W", [1, 2, 4])
def test_ranks_cover_global_batch(tmp_path, W):
    pattern, stream = make_shards(tmp_path)
    B, T = 2, 16
    G = W * B * T
    ls = loaders(pattern, B, T, W)
    for step in range(12):
        batches = [l.next_batch() for l in ls]
        start = step * G
        want = stream[start:start + G + 1].astype(np.int64)
        for r, b in enumerate(batches):
            assert b.x.shape == b.y.shape == (B, T) and b.x.dtype == np.int64
            mine = want[r * B * T:(r + 1) * B * T + 1]
            np.testing.assert_array_equal(b.x.ravel(), mine[:-1])
            np.testing.assert_array_equal(b.y.ravel(), mine[1:])
            np.testing.assert_array_equal(b.global_tokens, batches[0].global_tokens)
            assert b.global_tokens.dtype == np.uint16
        all_x = np.concatenate([b.x.ravel() for b in batches])  # rank inputs in rank order
        np.testing.assert_array_equal(all_x, want[:-1])  # disjoint and covering
        np.testing.assert_array_equal(batches[0].global_tokens, all_x)
    assert ls[0].step == 12 and ls[0].epoch == 0


def test_deterministic(tmp_path):
    pattern, _ = make_shards(tmp_path)
    a, b = loaders(pattern, 3, 8, 1)[0], loaders(pattern, 3, 8, 1)[0]
    for _ in range(20):
        ba, bb = a.next_batch(), b.next_batch()
        for u, v in zip(ba, bb):
            np.testing.assert_array_equal(u, v)


def test_file_list_is_sorted(tmp_path):
    pattern, _ = make_shards(tmp_path)
    files = sorted(tmp_path.glob("train_*.bin"))
    a = DistributedDataLoader([str(f) for f in reversed(files)], 2, 8, log=None)
    b = DistributedDataLoader(pattern, 2, 8, log=None)
    np.testing.assert_array_equal(a.next_batch().x, b.next_batch().x)


def test_uint16_dtype(tmp_path):
    pattern, stream = make_shards(tmp_path)
    b = DistributedDataLoader(pattern, 2, 8, dtype=np.uint16, log=None).next_batch()
    assert b.x.dtype == b.y.dtype == np.uint16
    np.testing.assert_array_equal(b.x.ravel(), stream[:16])


@pytest.mark.parametrize("align", [False, True])
def test_resume_reproduces_batches(tmp_path, align):
    pattern, _ = make_shards(tmp_path, eot_every=20)
    W, B, T = 2, 2, 48  # 192 tokens a step: the 3000-token stream wraps within the test
    ref = loaders(pattern, B, T, W, align_to_documents=align)
    for _ in range(7):
        for l in ref:
            l.next_batch()
    states = [json.loads(json.dumps(l.state_dict())) for l in ref]  # state survives JSON
    assert states[0]["step"] == 7
    resumed = loaders(pattern, B, T, W, align_to_documents=align)
    for l, s in zip(resumed, states):
        l.load_state_dict(s)
    for _ in range(15):  # long enough to wrap around
        for l0, l1 in zip(ref, resumed):
            b0, b1 = l0.next_batch(), l1.next_batch()
            for u, v in zip(b0, b1):
                np.testing.assert_array_equal(u, v)
            assert (l0.step, l0.epoch) == (l1.step, l1.epoch)
    assert ref[0].epoch >= 1


def test_load_state_checks_geometry(tmp_path):
    pattern, _ = make_shards(tmp_path)
    a = DistributedDataLoader(pattern, 2, 8, log=None)
    a.next_batch()
    b = DistributedDataLoader(pattern, 2, 16, log=None)
    with pytest.raises(ValueError, match="global_batch_tokens"):
        b.load_state_dict(a.state_dict())
    bad = dict(a.state_dict(), shard=99)
    with pytest.raises(ValueError, match="shard is 99"):
        a.load_state_dict(bad)


def test_wrap_around(tmp_path):
    pattern, stream = make_shards(tmp_path, sizes=[100, 60])
    B, T = 2, 16  # 32 tokens a step: 160 tokens give 4 steps (4*32 + 1 <= 160), then wrap
    msgs = []
    l = DistributedDataLoader(pattern, B, T, log=msgs.append)
    first = l.next_batch()
    for _ in range(3):
        l.next_batch()
    assert l.epoch == 0 and not msgs
    again = l.next_batch()
    assert l.epoch == 1 and len(msgs) == 1 and "epoch 1" in msgs[0]
    np.testing.assert_array_equal(again.x, first.x)
    np.testing.assert_array_equal(again.y, first.y)
    np.testing.assert_array_equal(again.global_tokens, stream[:32])
    assert l.step == 5


def test_default_log_only_rank0(tmp_path, capsys):
    pattern, _ = make_shards(tmp_path, sizes=[70])
    for r in range(2):
        l = DistributedDataLoader(pattern, 1, 16, rank=r, world_size=2)
        for _ in range(3):
            l.next_batch()
    out = capsys.readouterr().out
    assert out.count("wrapping around") == 1


def test_align_to_documents(tmp_path):
    pattern, stream = make_shards(tmp_path, eot_every=15)
    W, B, T = 2, 3, 20
    ls = loaders(pattern, B, T, W, align_to_documents=True)
    cursor, n_aligned, n_rows = 0, 0, 0
    for _ in range(6):  # 36 rows of <= 39 tokens each: no wrap-around in 3000 tokens
        batches = [l.next_batch() for l in ls]
        rows = np.concatenate([b.x for b in batches])  # row k of rank r is sequence r*B + k
        np.testing.assert_array_equal(batches[0].global_tokens, rows.ravel().astype(np.uint16))
        for b in batches:
            np.testing.assert_array_equal(b.x[:, 1:], b.y[:, :-1])
        for row in rows:
            window = stream[cursor:cursor + T]
            hits = np.flatnonzero(window == EOT_TOKEN)
            start = cursor + int(hits[0]) if hits.size else cursor  # the documented rule
            np.testing.assert_array_equal(row, stream[start:start + T])
            n_aligned += int(hits.size > 0)
            n_rows += 1
            cursor = start + T  # the next row starts after this one: rows never overlap
        y_last = batches[-1].y[-1, -1]
        assert y_last == stream[cursor]
    assert 0 < n_aligned < n_rows


def test_too_few_tokens(tmp_path):
    pattern, _ = make_shards(tmp_path, sizes=[50])
    with pytest.raises(ValueError, match="hold 50 tokens, need at least 65"):
        DistributedDataLoader(pattern, 4, 16, log=None)
    with pytest.raises(ValueError, match="rank"):
        DistributedDataLoader(pattern, 1, 8, rank=2, world_size=2, log=None)
    with pytest.raises(FileNotFoundError, match="nothing"):
        DistributedDataLoader(str(tmp_path / "nothing*.bin"), 1, 8)


def test_token_stream_read(tmp_path):
    pattern, stream = make_shards(tmp_path)
    ts = TokenStream(pattern)
    assert ts.total == stream.size
    for a, b in [(0, 0), (0, 1000), (990, 1040), (1030, 1040), (0, stream.size), (2999, 3000)]:
        np.testing.assert_array_equal(ts.read(a, b), stream[a:b])
    with pytest.raises(IndexError):
        ts.read(0, stream.size + 1)


def test_iter_tokens(tmp_path):
    pattern, stream = make_shards(tmp_path)
    chunks = list(iter_tokens(pattern, chunk_tokens=300))
    assert all(0 < len(c) <= 300 and c.dtype == np.uint16 for c in chunks)
    np.testing.assert_array_equal(np.concatenate(chunks), stream)
    capped = list(iter_tokens(pattern, max_tokens=1100, chunk_tokens=300))
    np.testing.assert_array_equal(np.concatenate(capped), stream[:1100])
    assert list(iter_tokens(pattern, max_tokens=0)) == []


def test_read_tokens(tmp_path):
    pattern, stream = make_shards(tmp_path)
    np.testing.assert_array_equal(read_tokens(pattern), stream)
    np.testing.assert_array_equal(read_tokens(pattern, 1234), stream[:1234])
    with pytest.raises(ValueError, match="fewer than the 99999"):
        read_tokens(pattern, 99999)
    np.testing.assert_array_equal(read_tokens(pattern, 99999, strict=False), stream)
