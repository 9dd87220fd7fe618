"""Training-time hints stay causal with the record's packed loader (data/packed_loader.py): the node's
positional index (train/positional_hints.py, built from a packed loader of its own) is over exactly
the ranks' packed inputs, step after step, and a step's hints come only from earlier steps' tokens.

The corpus has documents of 32 tokens, so the packing is plain arithmetic: at cut 24 (steps 0-3) a
row of T + 1 = 65 tokens is pieces of 24, 24 and 17 tokens; at cut 40 of 32, 32 and 1 (the third
document lends only its BOS, as the last target). Either way a step takes 6 documents, rank r's
k-th piece being document 6*step + 3*r + k of its shard. Shard 0 holds 20 steps and 2 documents
more, which the loader drops; step 20 starts shard 1. N-grams planted in chosen documents check
causality across ranks, steps and the shard boundary."""
import signal

import numpy as np
import pytest

from data.manifest import write_manifest
from data.packed_loader import PackedLoader
from data.shards import write_shard
from hints.cells import BOS
from hints.positional import PositionalIndex
from streams import phrase_stream  # tests/streams.py
from train.positional_hints import PositionalHints, loader_stream

T, W = 64, 2
G = W * T          # 128 tokens a step
STEPS = 40         # past the phases at steps 8 and 32, and the shard boundary at step 20
DOC = 32           # tokens a document (its BOS included)
SHARD0_STEPS = 20  # shard 0 holds this many steps' documents, and LEFTOVER more
LEFTOVER = 2


def cut(step):
    return 24 if step < 4 else 40  # two stages' cut lengths


def piece_offset(step, slot):
    """Where a rank's slot-th document (0 or 1) starts in its row."""
    return slot * min(cut(step), DOC)


def doc_at(step, rank, slot):
    """(shard, document) of rank's slot-th piece at step (the module docstring's arithmetic)."""
    if step < SHARD0_STEPS:
        return 0, 6 * step + 3 * rank + slot
    return 1, 6 * (step - SHARD0_STEPS) + 3 * rank + slot


# planted n-grams (tokens no filler holds): where they are planted and what each lookup must see
PLANTS = {  # name: (first token, follower, [(step, rank, slot) of each occurrence])
    "A": (40000, 40100, [(2, 1, 0), (3, 0, 1)]),             # rank 1 of step 2, then rank 0 of step 3
    "B": (40200, 40300, [(5, 0, 0), (5, 1, 1), (6, 1, 0)]),  # twice in step 5 (not hinted there), then step 6
    "C": (40400, 40500, [(19, 1, 1), (20, 0, 0)]),           # the last step of shard 0, the first of shard 1
}
DROPPED = (40600, 40700, (0, SHARD0_STEPS * 6), (22, 1, 0))  # in a leftover document of shard 0, then step 22


def plant(doc, first, follower):
    doc[1:21] = np.arange(first, first + 20)  # a 20-gram after the BOS, then its follower
    doc[21] = follower


def write_corpus(folder):
    n = [SHARD0_STEPS * 6 + LEFTOVER, (STEPS - SHARD0_STEPS) * 6 + 6]
    filler = phrase_stream(0, sum(n) * DOC, 300, 40, 12).astype(np.int64) + 1000  # n-grams repeat: many hints
    docs = filler.reshape(-1, DOC)
    docs[:, 0] = BOS
    shards = [docs[:n[0]], docs[n[0]:]]
    for first, follower, where in PLANTS.values():
        for step, rank, slot in where:
            shard, d = doc_at(step, rank, slot)
            plant(shards[shard][d], first, follower)
    first, follower, (shard, d), later = DROPPED
    plant(shards[shard][d], first, follower)
    plant(shards[doc_at(*later)[0]][doc_at(*later)[1]], first, follower)
    paths = [str(write_shard(folder / f"train_{i:06d}.bin", s.reshape(-1))) for i, s in enumerate(shards)]
    write_manifest(folder)
    return paths


@pytest.fixture(autouse=True)
def deadline():
    def boom(*_):
        raise TimeoutError("test took longer than 900 s")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(900)  # generous: the first call compiles the Numba kernels (minutes on a busy 2-core box)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_packed_stream_hints_are_causal(tmp_path):
    paths = write_corpus(tmp_path)
    directory = str(tmp_path / "idx")
    hints = [PositionalHints(directory, 1, T, r, W, (6, 10, 20)) for r in range(W)]
    hints[0].start_build(None, STEPS, loader=PackedLoader(paths, cut, T, rank=0, world_size=W))
    ranks = [PackedLoader(paths, cut, T, rank=r, world_size=W) for r in range(W)]
    stream = np.zeros(0, np.uint16)  # what the ranks train on, in step and rank order, as they get it
    depth, follower, count, hinted = {}, {}, {}, 0
    for step in range(STEPS):
        batches = [ld.next_batch() for ld in ranks]
        assert [b.shard for b in batches] == [int(step >= SHARD0_STEPS)] * W
        cells = [h.lookup_cells(b.inputs, step) for h, b in zip(hints, batches)]
        if step == 0:
            assert all((c.depth == -1).all() and (c.followers == -1).all() for c in cells)  # step 0: no hints
        else:  # the same hints as an index over exactly the ranks' inputs of the earlier steps
            ref = PositionalIndex.build(stream, segment=T)
            for b, c in zip(batches, cells):
                want = ref.lookup_cells(b.inputs, step * G)
                for field in want._fields:
                    np.testing.assert_array_equal(getattr(c, field), getattr(want, field))
        for r, c in enumerate(cells):
            depth[step, r], follower[step, r], count[step, r] = c.depth, c.followers[:, 0], c.count
            hinted += int((c.depth >= 0).sum())
        stream = np.concatenate([stream, *(b.inputs.astype(np.uint16) for b in batches)])
    assert hinted > STEPS * G // 4  # the filler's phrases repeat: hints are common, not only the planted ones

    def at(step, rank, slot):  # the planted 20-gram's last token in rank's inputs
        return step, rank, piece_offset(step, slot) + 20

    for first, fol, where in PLANTS.values():
        for i, (step, rank, slot) in enumerate(where):
            s, r, p = at(step, rank, slot)
            assert stream[s * G + r * T + p - 19:s * G + r * T + p + 2].tolist() == [*range(first, first + 20), fol]
            earlier = sum(w[0] < step for w in where)  # occurrences in earlier steps, on any rank
            if earlier == 0:  # first seen in this step (perhaps twice): its follower is not known yet
                assert (depth[s, r][p - 19:p + 1] == -1).all()
            else:
                assert depth[s, r][p] == 2 and follower[s, r][p] == fol and count[s, r][p] == earlier
    first, fol, _, later = DROPPED  # a dropped document is never trained on, so never hinted from
    s, r, p = at(*later)
    assert not np.isin(np.arange(first, first + 20), stream[:s * G]).any()
    assert (depth[s, r][p - 19:p + 1] == -1).all()
    hints[0].wait_built()
    assert [e for e, _ in hints[0].phases] == [8 * G, 32 * G, STEPS * G]
    assert hints[1].builder is None  # only the builder reads the stream; the others map its phases


def test_the_stream_loader_must_fit_the_hints(tmp_path):
    paths = write_corpus(tmp_path)
    used = PackedLoader(paths, cut, T, world_size=W)
    used.next_batch()
    with pytest.raises(ValueError, match="at step 1; the index covers the run from step 0"):
        PositionalHints(str(tmp_path / "idx"), 1, T, 0, W, (6, 10, 20)).start_build(None, 4, loader=used)
    with pytest.raises(ValueError, match="step 0 has 64 global tokens, the hints expect G = 128"):
        loader_stream(PackedLoader(paths, cut, T, world_size=1), 2, G)
