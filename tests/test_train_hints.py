"""The trainer's hint preparation and validation pieces (train/), tested directly (no training run):
training-time hints are causal (step s sees only steps < s), rank slices get full n-grams at
their starts, the prep thread stays within its limit and re-raises its errors, validation
hints are cached per index state, and the background-index fallback picks the right index."""
import signal
import time

import numpy as np
import pytest
import torch

from data.loader import Batch, DistributedDataLoader
from data.shards import write_shard
from data.tokenizer import EOT_TOKEN
from hints import Geometry, HintIndex
from hints.index.reference import reference_reach
from train.data import val_split
from train.evaluate import ValHintCache, val_hint_arrays
from train.val_hints import pick_val_index
from train.hint_prep import HintPrep

GEOM = Geometry(2, 8, 32, (6, 10, 20))  # 4 x 256 x 32 slots: ample for a few thousand tokens
B, T, WORLD = 2, 32, 2
G = WORLD * B * T  # 128 tokens per step
NGRAM = np.arange(100, 120, dtype=np.uint16)  # a 20-gram that random filler never contains
FOLLOW = 7  # the token that follows it, first seen in step 1


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def deadline():
    """A hung prep thread must fail the test, not the whole suite."""
    def boom(*_):
        raise TimeoutError("test took longer than 60 s")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def planted_stream(steps=6, seed=0):
    """Random filler (ids >= 1000) with NGRAM -> FOLLOW planted at chosen places:
    step 1: inside rank 0's slice (first occurrence: no hint may exist yet);
    step 3: ending at rank 1's first input position (the n-gram spans the rank boundary);
    step 4: ending at rank 0's first position (the n-gram spans the step boundary)."""
    rng = np.random.default_rng(seed)
    s = rng.integers(1000, 50000, size=steps * G + 1).astype(np.uint16)
    ends = {1: 1 * G + 40, 3: 3 * G + B * T, 4: 4 * G}
    for end in ends.values():
        s[end - 19:end + 1] = NGRAM
        s[end + 1] = FOLLOW
    return s, ends


def prep_for(path, rank, world, batch, align=False):
    loader = DistributedDataLoader(path, batch, T, rank=rank, world_size=world, log=None, align_to_documents=align)
    return HintPrep(loader, HintIndex(GEOM), rank=rank, world_size=world)


def global_hints(preps):
    """One step of every rank, concatenated back into global stream order: (G, K) tokens, kinds."""
    items = [p.prepare() for p in preps]
    tok = torch.cat([it.hint_tokens.reshape(-1, 3) for it in items]).numpy()
    kind = torch.cat([it.hint_kinds.reshape(-1, 3) for it in items]).numpy()
    return items, tok, kind


def test_training_hints_are_causal_and_span_rank_and_step_boundaries(tmp_path):
    stream, ends = planted_stream()
    path = write_shard(tmp_path / "train_000000.bin", stream)
    preps = [prep_for(path, r, WORLD, B) for r in range(WORLD)]
    for step in range(6):
        items, tok, kind = global_hints(preps)
        assert items[0].hint_tokens.shape == (B, T, 3) and items[0].hint_tokens.dtype == torch.int64
        assert (tok < 0).sum() == (kind < 0).sum()  # absent hints are absent in both
        # Causality: the hints of this step equal those of an index built from exactly the
        # tokens of the earlier steps (nothing of this step or later).
        ref = HintIndex(GEOM)
        ref.add(stream[:step * G])
        want_tok, want_kind = in_documents(ref.lookup(stream[:(step + 1) * G]), stream[:(step + 1) * G], skip=step * G)
        np.testing.assert_array_equal(tok, want_tok.T)
        np.testing.assert_array_equal(kind, want_kind.T)
        if step == 1:  # first occurrence: the continuation is in this very batch, not in the index
            assert (tok[ends[1] - G] == -1).all()
        if step in (3, 4):  # seen at step 1: hinted now, all three lengths, full n-grams at slice starts
            assert (tok[ends[step] - step * G] == FOLLOW).all()
        if step == 0:
            assert (tok == -1).all()  # an empty index hints nothing
    for p in preps:
        assert p.index.tokens_added == 6 * G  # every rank's index holds the whole global stream


def test_document_aligned_batches_keep_hints_causal(tmp_path):
    """With rows starting at end-of-text tokens (gaps skipped), the hints of every step still
    equal those of an index holding exactly the earlier steps' rows, on every rank, and a planted
    n-gram's first occurrence has no hint while its next one does."""
    rng = np.random.default_rng(5)
    stream = rng.integers(1000, 50000, size=12 * G).astype(np.uint16)
    stream[rng.random(stream.size) < 1 / 25] = EOT_TOKEN  # documents of ~25 tokens
    for end in range(200, 1500, 130):  # NGRAM -> FOLLOW planted ten times (some fall in skipped gaps)
        stream[end - 19:end + 1], stream[end + 1] = NGRAM, FOLLOW
    path = write_shard(tmp_path / "train_000000.bin", stream)
    preps = [prep_for(path, r, WORLD, B, align=True) for r in range(WORLD)]
    ref, seen_rows, hinted = HintIndex(GEOM), [], 0
    for step in range(6):
        items, tok, kind = global_hints(preps)
        rows = np.concatenate([it.x.numpy().reshape(-1) for it in items]).astype(np.uint16)
        seen = np.concatenate(seen_rows + [rows])
        want_tok, want_kind = in_documents(ref.lookup(seen), seen, skip=seen.size - rows.size)  # earlier steps' rows only
        np.testing.assert_array_equal(tok, want_tok.T)
        np.testing.assert_array_equal(kind, want_kind.T)
        ref.add(rows)
        seen_rows.append(rows)
        hinted += int((tok[:, 0] == FOLLOW).sum())
    assert hinted >= 1  # a later occurrence of the planted n-gram was hinted from an earlier step


def in_documents(h, tokens, skip=0):
    """Reference hints h (K, n) over tokens[skip:] with documents as boundaries, by the plain-Python
    reach: a length whose n-gram would reach back past a BOS or the stream's start is absent."""
    r = np.array(reference_reach(tokens))[skip:]
    cut = r[None, :] < np.array(GEOM.lengths)[:, None]
    return np.where(cut, -1, h.token[:, skip:]), np.where(cut, -1, h.kind[:, skip:])


# 20 tokens that end a document and start the next: the n-grams ending at its last token are
# whole within the second document for lengths 6 and 10 (the 10-gram starts at the BOS), and
# cross into the first document for length 20.
SPANNING = np.concatenate([np.arange(200, 209), [EOT_TOKEN], np.arange(300, 310)]).astype(np.uint16)


def test_training_and_validation_hints_restart_at_documents(tmp_path):
    """An n-gram that crosses a BOS is never looked up, in training (HintPrep) and in validation
    and generation (val_hint_arrays), though the index holds it: the 6- and 10-gram ending in the
    second document are hinted, the 20-gram reaching into the first is not."""
    stream, _ = planted_stream(seed=2)
    ends = (G + 30, 3 * G + B * T + 5)  # step 1 (rank 0), step 3 (rank 1, its n-grams spanning the rank boundary)
    for end in ends:
        stream[end - 19:end + 1], stream[end + 1] = SPANNING, FOLLOW
    path = write_shard(tmp_path / "train_000000.bin", stream)
    preps = [prep_for(path, r, WORLD, B) for r in range(WORLD)]
    for step in range(5):
        _, tok, kind = global_hints(preps)
        ref = HintIndex(GEOM)
        ref.add(stream[:step * G])
        want_tok, want_kind = in_documents(ref.lookup(stream[:(step + 1) * G]), stream[:(step + 1) * G], skip=step * G)
        np.testing.assert_array_equal(tok, want_tok.T)
        np.testing.assert_array_equal(kind, want_kind.T)
        if step == 3:
            assert tok[ends[1] - step * G].tolist() == [FOLLOW, FOLLOW, -1]
    # validation and generation: the same rule over a stream the index has seen whole
    assert (ref.lookup(stream).token[:, ends[1]] == FOLLOW).all()  # the index itself hints all three lengths
    for start in (0, ends[1] - 3, ends[1]):
        tok, kind = val_hint_arrays(ref, stream, start, ends[1] + 1)
        assert tok[-1].tolist() == [FOLLOW, FOLLOW, -1]
        want_tok, want_kind = in_documents(ref.lookup(stream[:ends[1] + 1]), stream[:ends[1] + 1], skip=start)
        np.testing.assert_array_equal(tok, want_tok.T)
        np.testing.assert_array_equal(kind, want_kind.T)


def test_two_ranks_give_the_hints_of_one_rank_with_the_whole_batch(tmp_path):
    stream, _ = planted_stream(seed=1)
    path = write_shard(tmp_path / "train_000000.bin", stream)
    two = [prep_for(path, r, WORLD, B) for r in range(WORLD)]
    one = [prep_for(path, 0, 1, WORLD * B)]
    for _ in range(5):
        _, tok2, kind2 = global_hints(two)
        items1, tok1, kind1 = global_hints(one)
        np.testing.assert_array_equal(tok1, tok2)
        np.testing.assert_array_equal(kind1, kind2)


def test_no_hints_mode_gives_no_hint_tensors(tmp_path):
    stream, _ = planted_stream()
    path = write_shard(tmp_path / "train_000000.bin", stream)
    loader = DistributedDataLoader(path, B, T, log=None)
    item = HintPrep(loader, None).prepare()
    assert item.hint_tokens is None and item.hint_kinds is None
    np.testing.assert_array_equal(item.x.numpy().reshape(-1), stream[:B * T])
    np.testing.assert_array_equal(item.y.numpy().reshape(-1), stream[1:B * T + 1])


def test_prep_thread_runs_ahead_up_to_its_limit_only(tmp_path):
    stream, _ = planted_stream()
    path = write_shard(tmp_path / "train_000000.bin", stream)
    prep = prep_for(path, 0, 1, B).start(limit=2)
    try:
        prep.wait_idle()
        time.sleep(0.05)
        assert prep.next_step == 2 and prep.index.tokens_added == 2 * B * T  # stopped at the limit
        for step in range(2):
            item, waited = prep.get()
            assert item.step == step
        prep.set_limit(5)
        prep.wait_filled()
        assert prep.next_step == 5  # three more steps prepared, none past the new limit
        assert [prep.get()[0].step for _ in range(3)] == [2, 3, 4]
    finally:
        prep.close()


class FailingLoader:
    """A loader whose third batch fails, as a corrupt shard would."""

    B, T, step = 1, 4, 0

    def next_batch(self):
        self.step += 1
        if self.step == 3:
            raise ValueError("shard data/broken.bin: magic is 0, expected 20240520")
        x = np.arange(4, dtype=np.int64).reshape(1, 4)
        return Batch(x, x, x.reshape(-1).astype(np.uint16))


def test_prep_thread_error_is_reraised_with_its_traceback():
    prep = HintPrep(FailingLoader(), None).start(limit=10)
    try:
        assert prep.get()[0].step == 0
        assert prep.get()[0].step == 1
        with pytest.raises(RuntimeError, match="hint preparation thread") as err:
            prep.get()
        text = str(err.value)
        assert "magic is 0" in text and "Traceback" in text and "next_batch" in text
        assert isinstance(err.value.__cause__, ValueError)
    finally:
        prep.close()


def test_val_split_is_even_and_whole_batches():
    for world in (1, 2, 3):
        spans = [val_split(10_001, 100, 8, r, world) for r in range(world)]
        firsts, counts, bss = zip(*spans)
        assert len(set(counts)) == 1 and counts[0] % bss[0] == 0
        assert firsts == tuple(r * counts[0] for r in range(world))
        assert counts[0] * world <= 100


def test_val_hints_cached_per_index_state(tmp_path):
    rng = np.random.default_rng(3)
    val = rng.integers(0, 300, size=5000).astype(np.uint16)
    idx = HintIndex(GEOM)
    idx.add(val[:2000])
    cache = ValHintCache()
    a = cache.get(idx, val, 1000, 3000)
    assert cache.get(idx, val, 1000, 3000)[0] is a[0]  # same index state: cached
    want_tok, _ = in_documents(idx.lookup(val[:3000]), val[:3000], skip=1000)
    np.testing.assert_array_equal(a[0], want_tok.T)  # the prefix gives full n-grams
    idx.add(val[2000:4000])
    b = cache.get(idx, val, 1000, 3000)
    assert b[0] is not a[0]  # the index grew: looked up again
    assert (b[0] >= 0).sum() >= (a[0] >= 0).sum()


@pytest.mark.parametrize("ready, have_val_index, have_train_index, kind", [
    ([True], False, True, "background"),              # ready: the background index
    ([True, True, True, True], True, True, "background"),
    ([True, False, True, True], True, True, "val-index"),  # one rank not ready: nobody uses it
    ([True, False], False, True, "training"),
    ([False], True, True, "val-index"),               # not ready: --val-index next
    ([False], False, True, "training"),               # then the training index
    ([], True, True, "val-index"),                    # no background index in the run
    ([], False, True, "training"),
    ([], False, False, None),                         # --no-hints and nothing else: no hinted loss
    ([False, False], False, False, None),
])
def test_pick_val_index_every_fallback(ready, have_val_index, have_train_index, kind):
    source = pick_val_index(ready, "running", have_val_index, have_train_index)
    assert source.kind == kind
    if ready and not all(ready):
        assert ("not ready on every rank" in source.reason) == any(ready)
