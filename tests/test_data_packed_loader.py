"""Tests for data/packed_loader.py against plain statements of the record's rules on small corpora
the tests write: packing (BOS-aligned rows, cut lengths, dropped remainders, exactly T inputs,
shifted targets, rank order, dropped shard leftovers), world sizes 1 and 2 agreeing on one stream,
attention segments with and without splits, the unaligned validation reader, resume, bad input."""
import json

import numpy as np
import pytest

from data.manifest import write_manifest
from data.packed_loader import (VIRTUAL_SEQ_CAP, PackedLoader, ValidationReader, record_split,
                                segment_starts)
from data.shards import write_shard
from data.tokenizer import EOT_TOKEN as BOS

T, W = 64, 2


def random_docs(rng, n, lo=1, hi=150, vocab=(0, 50000)):
    """n documents: a BOS then lo-1..hi-1 tokens without BOS (a length-1 document is a lone BOS)."""
    return [np.concatenate([[BOS], rng.integers(*vocab, size=rng.integers(lo, hi) - 1)]) for _ in range(n)]


def write_corpus(folder, shards_docs, junk=()):
    """One shard per document list, in order; shard i starts with junk[i] tokens before its first BOS."""
    paths = []
    for i, docs in enumerate(shards_docs):
        head = np.asarray(junk[i] if i < len(junk) else [], dtype=np.int64)
        paths.append(str(write_shard(folder / f"train_{i:06d}.bin", np.concatenate([head, *docs]))))
    write_manifest(folder)
    return paths


def reference_steps(shards_docs, cuts, T=T, W=W):
    """The packing rule, stated plainly over the documents as written: for each step, cut every
    remaining document of the current shard at the step's cut length and pour them in order into
    W rows of T + 1 tokens (the last one cut to fit); if the shard cannot fill all W, drop the rest
    of it and pour the step from the next shard. Yields (shard, rows)."""
    shard, used = 0, 0
    for cut in cuts:
        while True:
            if shard == len(shards_docs):
                return
            rows, row, taken = [], [], 0
            for doc in shards_docs[shard][used:]:
                taken += 1
                row.extend(doc[:cut][:T + 1 - len(row)])
                if len(row) == T + 1:
                    rows.append(np.array(row))
                    row = []
                    if len(rows) == W:
                        break
            if len(rows) == W:
                used += taken
                yield shard, rows
                break
            shard, used = shard + 1, 0


def cuts_of(step):
    return (24, 40, 100)[min(step // 4, 2)]  # three stages: cut lengths below, near and above the row


def test_rows_follow_the_packing_rule(tmp_path):
    rng = np.random.default_rng(0)
    shards_docs = [random_docs(rng, 60), random_docs(rng, 2, hi=50), random_docs(rng, 80)]  # the middle one: < 130 tokens
    junk = [rng.integers(0, 50000, 7), [], rng.integers(0, 50000, 3)]  # tokens before a shard's first BOS
    paths = write_corpus(tmp_path, shards_docs, junk)
    ref = list(reference_steps(shards_docs, [cuts_of(s) for s in range(1000)]))
    assert {shard for shard, _ in ref} == {0, 2} and len(ref) > 12  # shard 1 never fills a step
    ranks = [PackedLoader(paths, cuts_of, T, rank=r, world_size=W) for r in range(W)]
    for step, (shard, rows) in enumerate(ref):
        batches = [ld.next_batch() for ld in ranks]
        want_global = np.concatenate([row[:T] for row in rows])
        for r, b in enumerate(batches):
            assert b.step == step and b.shard == shard and b.cut_length == cuts_of(step)
            assert b.inputs.shape == (T,) and b.targets.shape == (T,) and b.inputs.dtype == np.int64
            np.testing.assert_array_equal(b.inputs, rows[r][:T])
            np.testing.assert_array_equal(b.targets, rows[r][1:])  # targets = inputs shifted by one
            np.testing.assert_array_equal(b.global_tokens, want_global)  # every rank's inputs, rank order
            assert b.global_tokens.dtype == np.uint16
            assert b.inputs[0] == BOS  # every row starts at a document's start
            np.testing.assert_array_equal(b.doc_starts, np.flatnonzero(b.inputs == BOS))
            pieces = np.diff(np.append(b.doc_starts, T))
            assert pieces.max() <= b.cut_length  # cut lengths respected
    with pytest.raises(ValueError, match=r"train_000000\.bin \.\.\. .*train_000002\.bin.*run out of documents"):
        ranks[0].next_batch()


def test_documents_are_cut_and_their_remainders_dropped(tmp_path):
    """Documents of 30 tokens cut at 20: every row is 20-token pieces, each a document's start."""
    docs = [np.concatenate([[BOS], np.full(29, 1000 + i)]) for i in range(40)]  # document i is BOS, then i's marker
    paths = write_corpus(tmp_path, [docs])
    ld = PackedLoader(paths, 20, T, rank=0, world_size=1)
    b = ld.next_batch()
    np.testing.assert_array_equal(b.doc_starts, [0, 20, 40, 60])
    # T + 1 = 65 = 3 x 20 + 5: documents 0-3, the last cut to 5 tokens, its remainder dropped too
    np.testing.assert_array_equal(b.inputs, np.concatenate([docs[i][:20] for i in range(3)] + [docs[3][:4]]))
    assert b.targets[-1] == 1003
    np.testing.assert_array_equal(b.documents, [[0, 20], [30, 50], [60, 80], [90, 95]])
    assert ld.next_batch().inputs[1] == 1004  # the next step starts at document 4, not at 3's rest


def test_a_shards_leftover_documents_are_dropped_with_the_step(tmp_path):
    """Shard 0 holds 2 steps and 6 documents more: enough to fill rank 0 of step 2, not rank 1. Step 2
    is then taken whole from shard 1 and those 6 documents are never read."""
    docs0 = [np.concatenate([[BOS], np.full(12, 2000 + i)]) for i in range(26)]  # 13 tokens: 5 fill a row of 65
    docs1 = [np.concatenate([[BOS], np.full(12, 3000 + i)]) for i in range(30)]
    paths = write_corpus(tmp_path, [docs0, docs1])
    lds = [PackedLoader(paths, 896, T, rank=r, world_size=W) for r in range(W)]
    steps = [[ld.next_batch() for ld in lds] for _ in range(4)]
    assert [s[0].shard for s in steps] == [0, 0, 1, 1]
    seen = np.concatenate([b.global_tokens for s in steps for b in s])
    assert not np.isin(np.arange(2020, 2026), seen).any()  # shard 0's leftover documents 20-25
    assert np.isin(np.arange(2000, 2020), seen).all()
    assert steps[2][0].inputs[1] == 3000 and steps[2][0].documents[0, 0] == 0  # step 2 from shard 1's start


def test_world_sizes_1_and_2_give_one_stream(tmp_path):
    """World 2's step k is world 1's steps 2k, 2k+1 (same cut), rank r being step 2k + r: within one shard."""
    rng = np.random.default_rng(1)
    paths = write_corpus(tmp_path, [random_docs(rng, 120)])
    two = [PackedLoader(paths, lambda s: (24, 48)[s >= 3], T, rank=r, world_size=2) for r in range(2)]
    one = PackedLoader(paths, lambda s: (24, 48)[s // 2 >= 3], T, rank=0, world_size=1)
    for k in range(6):
        b0, b1 = (ld.next_batch() for ld in two)
        a0, a1 = one.next_batch(), one.next_batch()
        np.testing.assert_array_equal(b0.global_tokens, np.concatenate([a0.global_tokens, a1.global_tokens]))
        np.testing.assert_array_equal(b0.global_tokens, b1.global_tokens)
        for b, a in ((b0, a0), (b1, a1)):
            np.testing.assert_array_equal(b.inputs, a.inputs)
            np.testing.assert_array_equal(b.targets, a.targets)
            np.testing.assert_array_equal(b.doc_starts, a.doc_starts)
    # the same again from a fresh loader: deterministic
    again = PackedLoader(paths, lambda s: (24, 48)[s >= 3], T, rank=1, world_size=2)
    again.skip(5)
    np.testing.assert_array_equal(again.next_batch().inputs, b1.inputs)


def plain_segments(doc_starts, T, split):
    """Document starts and a start every `split` tokens after each, before the next document: a loop."""
    out, bounds = [], list(doc_starts) + [T]
    for a, b in zip(bounds, bounds[1:]):
        p = a
        while p < b:
            out.append(p)
            p += split if split else b - a
    return out + [T]


def test_segment_starts():
    np.testing.assert_array_equal(segment_starts([0, 5, 30], 40), [0, 5, 30, 40])
    np.testing.assert_array_equal(segment_starts([0, 5, 30], 40, split_every=10), [0, 5, 15, 25, 30, 40])
    np.testing.assert_array_equal(segment_starts([0], 25, split_every=10), [0, 10, 20, 25])
    np.testing.assert_array_equal(segment_starts([0, 10], 20, split_every=10), [0, 10, 20])  # no empty segments
    assert segment_starts([0, 3], 8).dtype == np.int32
    rng = np.random.default_rng(2)
    for _ in range(50):
        n = int(rng.integers(1, 400))
        starts = np.union1d([0], rng.choice(n, size=rng.integers(0, 9))) if n > 1 else np.array([0])
        split = [None, 1, 7, 16][rng.integers(4)]
        np.testing.assert_array_equal(segment_starts(starts, n, split), plain_segments(starts, n, split))
    for bad in ([], [1, 5], [0, 5, 5], [0, 40]):
        with pytest.raises(ValueError, match="doc_starts"):
            segment_starts(bad, 40)
    with pytest.raises(ValueError, match="split_every"):
        segment_starts([0], 40, split_every=0)
    # the record's rule: split at 2560 only where documents can outrun it (its 3072 stages)
    assert VIRTUAL_SEQ_CAP == 2560
    assert record_split(3072) == 2560 and record_split(2560) is None and record_split(896) is None


def test_segments_of_a_packed_row(tmp_path):
    rng = np.random.default_rng(3)
    paths = write_corpus(tmp_path, [random_docs(rng, 40, lo=20, hi=60)])
    b = PackedLoader(paths, 48, T).next_batch()
    cu = segment_starts(b.doc_starts, T, split_every=16)
    assert cu[0] == 0 and cu[-1] == T and np.all(np.diff(cu) > 0) and np.diff(cu).max() <= 16
    assert set(b.doc_starts) <= set(cu.tolist())
    assert any(c not in b.doc_starts for c in cu[:-1])  # some document outran 16 tokens and was split


def test_validation_reader_positions(tmp_path):
    rng = np.random.default_rng(4)
    tokens = rng.integers(0, 50000, 500)
    tokens[rng.random(500) < 0.05] = BOS
    tokens[64] = BOS  # a BOS at a rank's first input
    path = str(write_shard(tmp_path / "val_000000.bin", tokens))
    Tv, budget = 32, 4 * 2 * 32  # 4 batches of W * Tv = 64
    for r in range(2):
        reader = ValidationReader(path, Tv, rank=r, world_size=2, val_tokens=budget)
        assert len(reader) == 4
        for b, batch in enumerate(reader):
            at = b * 64 + r * Tv  # rank r of batch b reads Tv + 1 tokens at pos + Tv * r
            np.testing.assert_array_equal(batch.inputs, tokens[at:at + Tv])
            np.testing.assert_array_equal(batch.targets, tokens[at + 1:at + Tv + 1])
            bos = [i for i in range(Tv) if tokens[at + i] == BOS]
            np.testing.assert_array_equal(batch.doc_starts, sorted({0, *bos}))  # unaligned: 0 and every BOS
    with pytest.raises(ValueError, match="whole number of batches"):
        ValidationReader(path, Tv, world_size=2, val_tokens=100)
    with pytest.raises(ValueError, match=r"val_000000\.bin.*hold 500 tokens"):
        ValidationReader(path, Tv, world_size=2, val_tokens=8 * 64)
    with pytest.raises(IndexError):
        ValidationReader(path, Tv, world_size=2, val_tokens=budget).batch(4)


@pytest.mark.parametrize("how", ["state", "skip"])
def test_resume_equals_an_uninterrupted_run(tmp_path, how):
    rng = np.random.default_rng(5)
    paths = write_corpus(tmp_path, [random_docs(rng, 30), random_docs(rng, 200)])
    run = [PackedLoader(paths, cuts_of, T, rank=r, world_size=W) for r in range(W)]
    want = [[ld.next_batch() for ld in run] for _ in range(12)]
    assert want[2][0].shard == 0 and want[-1][0].shard == 1  # the run crosses a shard boundary
    first = PackedLoader(paths, cuts_of, T, rank=0, world_size=W)
    for _ in range(5):
        first.next_batch()
    state = json.loads(json.dumps(first.state_dict()))  # plain data, as a checkpoint holds it
    for r in range(W):
        resumed = PackedLoader(paths, cuts_of, T, rank=r, world_size=W)
        if how == "state":
            resumed.load_state_dict(state)  # rank 0's state serves every rank
        else:
            resumed.skip(5)
        assert resumed.step == 5
        for step in range(5, 12):
            got = resumed.next_batch()
            np.testing.assert_array_equal(got.inputs, want[step][r].inputs)
            np.testing.assert_array_equal(got.targets, want[step][r].targets)
            np.testing.assert_array_equal(got.doc_starts, want[step][r].doc_starts)
            np.testing.assert_array_equal(got.global_tokens, want[step][r].global_tokens)


def test_load_state_refuses_what_does_not_fit(tmp_path):
    rng = np.random.default_rng(6)
    docs = random_docs(rng, 100)
    paths = write_corpus(tmp_path, [docs])
    ld = PackedLoader(paths, 40, T, world_size=W)
    ld.next_batch()
    state = ld.state_dict()
    with pytest.raises(ValueError, match="tokens_per_rank is 64 in the state, 32"):
        PackedLoader(paths, 40, 32, world_size=W).load_state_dict(state)
    with pytest.raises(ValueError, match="world_size is 2 in the state, 1"):
        PackedLoader(paths, 40, T, world_size=1).load_state_dict(state)
    with pytest.raises(ValueError, match="not a PackedLoader"):
        ld.load_state_dict({"step": 1, "shard": 0, "offset": 0})
    with pytest.raises(ValueError, match="document is 9999"):
        ld.load_state_dict(dict(state, document=9999))
    docs[0] = np.concatenate([docs[0], [7, 7]])  # the shard changes under the state: documents move
    paths = write_corpus(tmp_path, [docs])
    with pytest.raises(ValueError, match=r"train_000000\.bin starts at .* the state says"):
        PackedLoader(paths, 40, T, world_size=W).load_state_dict(state)


def test_bad_input_names_the_file(tmp_path):
    rng = np.random.default_rng(7)
    good = random_docs(rng, 20)
    paths = write_corpus(tmp_path, [good, [rng.integers(0, 50000, 300)]])  # shard 1 has no BOS
    ld = PackedLoader(paths, 40, T, world_size=W)
    with pytest.raises(ValueError, match=r"train_000001\.bin has no BOS token"):
        for _ in range(100):
            ld.next_batch()
    with pytest.raises(ValueError, match=r"cut_length\(0\) is 0"):
        PackedLoader(paths, lambda s: 0, T).next_batch()
    np.testing.assert_array_equal(PackedLoader(paths, np.array([40, 40]), T).next_batch().inputs,
                                  PackedLoader(paths, 40, T).next_batch().inputs)  # a NumPy array of cut lengths
    ld = PackedLoader(paths, [40, 40], T)
    ld.skip(2)
    with pytest.raises(ValueError, match="gives 2 steps' cut lengths, step 2 has none"):
        ld.next_batch()
    with pytest.raises(ValueError, match="rank is 2"):
        PackedLoader(paths, 40, T, rank=2, world_size=2)
    with pytest.raises(ValueError, match="tokens_per_rank is 0"):
        PackedLoader(paths, 40, 0)
