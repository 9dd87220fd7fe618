"""Exactness of the hint index: lookups, of a growing index and of a sealed one, equal exact
n-gram counting (hints.index.reference.ReferenceIndex) on real text (GPT-2 tokens of Python's stdlib source) and on random streams, and the table equals
the plain-Python slot-level replay (hints.index.reference.reference_slots) byte for byte, drops included.

How exactness is made checkable. docs/design.md promises equality with exact counting "when nothing
was dropped and no checksum collided". So every test here first checks that nothing was dropped,
and then maps every n-gram to the key the index compares (per length index k: the partition and
the nested key ``slot >> geom.key_shifts[k]``, computed independently by ``hints.index.reference.slot_of``):

* the shortest length (k = 0) gets partition bits + 26..48 checksum bits, so a big enough geometry
  makes it collision-free: the tests assert that distinct n-grams never share a k = 0 key;
* a longer length only adds CHECKSUM_BITS[k] bits (12 and 10 for the 10- and 20-gram, 6 for the
  13-gram of (3, 5, 8, 13)), whatever the geometry, so on real text a few distinct n-grams that
  end in the same shorter n-gram do share a key (by design: "a collision of a longer length only
  changes how much it is trusted"). Those positions are found exactly, their share is bounded,
  and there the lookup must equal exact counting over the *key* (the union of the colliding
  n-grams' followers, a slot-level model built here); everywhere else it must equal
  ReferenceIndex exactly. Cases built to have no collision at all assert that there is none.
"""
import os
from collections import Counter, defaultdict


import numpy as np
import pytest

from hints import Geometry, HintIndex, ReferenceIndex
from hints.index.lookup import GROUP_BLOCK
from hints.kinds import N_COUNT_BUCKETS, N_PURITY_BUCKETS, kind_parts
from hints.index.reference import reference_kind, reference_slots, slot_of

STDLIB = os.path.dirname(os.__file__)

# Training files (~91k tokens) and held-out files (~20k tokens) for the default lengths; the
# other length sets use the smaller SMALL_* lists (the plain-Python references cost ~10 us a token).
TRAIN_FILES = ["textwrap.py", "shlex.py", "fractions.py", "heapq.py", "bisect.py", "string.py",
               "calendar.py", "statistics.py", "ipaddress.py", "pprint.py", "glob.py", "fnmatch.py",
               "colorsys.py", "queue.py", "tokenize.py"]
HELDOUT_FILES = ["dataclasses.py", "base64.py"]
SMALL_TRAIN_FILES = ["textwrap.py", "shlex.py", "fractions.py", "heapq.py", "string.py",
                     "calendar.py", "pprint.py", "queue.py"]
SMALL_HELDOUT_FILES = ["base64.py"]

FIELDS = ("token", "count", "purity", "kind")


def normalize(text):
    """Collapse runs of whitespace within each line (newlines kept). GPT-2 encodes every space of
    an indentation as its own token (220), so raw code has 6-grams of spaces repeated ~30,000
    times in 170k tokens, far beyond any small test geometry's two buckets; collapsed, the
    hottest 6-gram of these files occurs ~100 times and the text is still real code."""
    return "\n".join(" ".join(line.split()) for line in text.splitlines())


@pytest.fixture(scope="module")
def stdlib_docs():
    """{file name: uint16 tokens (EOT first, as data.tokenizer.encode_document does)}."""
    from data.tokenizer import encode_document

    out = {}
    for name in sorted(set(TRAIN_FILES + HELDOUT_FILES + SMALL_TRAIN_FILES + SMALL_HELDOUT_FILES)):
        with open(os.path.join(STDLIB, name), encoding="utf-8") as f:
            out[name] = np.array(encode_document(normalize(f.read())), dtype=np.uint16)
    return out


# ---- the slot-level model -------------------------------------------------------------------

def stream_keys(geom, stream, j_hi):
    """[(partition, slot word)] of stream positions lengths[0]..j_hi (inclusive; the slot word's
    token field is ignored by the keys, so position len(stream) uses a dummy next token)."""
    ext = [int(x) for x in stream] + [0]
    return [slot_of(geom, ext, j)[::3] for j in range(geom.lengths[0], j_hi + 1)]


class KeyModel:
    """Exact follower counting per index key (partition, slot >> key_shifts[k]) of one training
    stream, plus the set of distinct n-grams behind every key (to find checksum collisions)."""

    def __init__(self, geom, train):
        self.geom = geom
        self.train = [int(x) for x in train]
        n = len(self.train)
        self.train_keys = stream_keys(geom, self.train, n)  # positions L0..n (n: to query the train stream)
        self.counts = [defaultdict(Counter) for _ in geom.lengths]
        self.grams = [defaultdict(set) for _ in geom.lengths]
        L0 = geom.lengths[0]
        for j in range(L0, n):
            part, word = self.train_keys[j - L0]
            for k, L in enumerate(geom.lengths):
                if j < L:
                    break
                key = (part, word >> geom.key_shifts[k])
                self.counts[k][key][self.train[j]] += 1
                self.grams[k][key].add(tuple(self.train[j - L:j]))

    def collided_keys(self, k):
        """Keys of length index k that distinct n-grams of the training stream share."""
        return {key for key, grams in self.grams[k].items() if len(grams) > 1}

    def lookup(self, query, keys=None):
        """(expected token, count, purity, kind) arrays and a bool mask of the positions whose
        n-gram shares its key with a different training n-gram (a checksum collision)."""
        g = self.geom
        q = [int(x) for x in query]
        K, n, L0 = g.n_lengths, len(q), g.lengths[0]
        keys = stream_keys(g, q, n) if keys is None else keys
        token = np.full((K, n), -1, dtype=np.int32)
        count = np.zeros((K, n), dtype=np.int32)
        purity = np.zeros((K, n), dtype=np.float32)
        kind = np.full((K, n), -1, dtype=np.int16)
        collided = np.zeros((K, n), dtype=bool)
        for t in range(L0 - 1, n):
            j = t + 1
            part, word = keys[j - L0]
            for k, L in enumerate(g.lengths):
                if j < L:
                    break
                key = (part, word >> g.key_shifts[k])
                grams = self.grams[k].get(key, set())
                collided[k, t] = len(grams | {tuple(q[j - L:j])}) > 1
                c = self.counts[k].get(key)
                if not c:
                    continue
                best = min(c, key=lambda x: (-c[x], x))
                total = sum(c.values())
                token[k, t], count[k, t] = best, total
                purity[k, t] = np.float32(c[best] / total)
                kind[k, t] = reference_kind(k, total, c[best])
        return dict(token=token, count=count, purity=purity, kind=kind), collided


def assert_hints_equal(got, expected, where=None, what=""):
    for f in FIELDS:
        a, b = getattr(got, f), expected[f] if isinstance(expected, dict) else getattr(expected, f)
        assert a.dtype == b.dtype and a.shape == b.shape, (what, f, a.dtype, b.dtype, a.shape, b.shape)
        if where is not None:
            a, b = a[where], b[where]
        bad = np.flatnonzero(a != b)
        assert bad.size == 0, f"{what}: {f} differs at {bad.size} positions, first {bad[:5]}: {a.flat[bad[:5]]} vs {b.flat[bad[:5]]}"


def check_exact(geom, train_parts, queries, max_collided_share=0.0, workers=2):
    """Build the index and ReferenceIndex from train_parts (successive add() calls), then check
    every query (name -> tokens; None means the training stream itself) as the module doc says."""
    idx = HintIndex(geom, workers=workers)
    ref = ReferenceIndex(geom.lengths)
    for part in train_parts:
        idx.add(part)
        ref.add(part)
    train = np.concatenate(train_parts)
    assert idx.tokens_added == ref.tokens_added == train.size
    assert idx.dropped == 0, f"precondition: nothing dropped ({idx.dropped} were); use a bigger geometry"
    assert idx.hints_stored == train.size - geom.lengths[0]

    model = KeyModel(geom, train)
    assert not model.collided_keys(0), "precondition: no shortest-length checksum collision; use more partition bits"
    shares = {}
    sealed = HintIndex(geom, workers=workers)
    for part in train_parts:
        sealed.add(part)
    sealed.seal()
    for name, q in queries.items():
        keys = model.train_keys if q is None else None
        q = train if q is None else q
        expected, collided = model.lookup(q, keys)
        assert not collided[0].any()
        exact = ref.lookup(q)
        for what, index in (("scan", idx), ("sealed", sealed)):
            got = index.lookup(q)
            # 1. the index is exactly the slot-level model everywhere (collisions included)
            assert_hints_equal(got, expected, what=f"{name} vs slot-level model ({what})")
            # 2. ... and exactly ReferenceIndex wherever no checksum collided
            assert_hints_equal(got, exact, where=~collided, what=f"{name} vs ReferenceIndex ({what})")
        got = idx.lookup(q)
        for k in range(geom.n_lengths):
            share = collided[k].mean()
            shares[name, geom.lengths[k]] = share
            assert share <= max_collided_share, (name, geom.lengths[k], share)
        if name == "train":  # every n-gram of the training stream with a follower was seen
            for k, L in enumerate(geom.lengths):
                assert (got.count[k, L - 1:-1] >= 1).all()
                assert (got.token[k, :L - 1] == -1).all()
    return idx, shares


# ---- real text --------------------------------------------------------------------------------

REAL_CASES = {
    # lengths: (geometry, train files, held-out files, allowed share of collided positions)
    (6, 10, 20): (Geometry(12, 1, 256, (6, 10, 20)), TRAIN_FILES, HELDOUT_FILES, 0.002),
    (2, 3): (Geometry(6, 1, 2048, (2, 3)), SMALL_TRAIN_FILES, SMALL_HELDOUT_FILES, 0.002),
    (4,): (Geometry(4, 4, 512, (4,)), SMALL_TRAIN_FILES, SMALL_HELDOUT_FILES, 0.0),
    (3, 5, 8, 13): (Geometry(12, 1, 256, (3, 5, 8, 13)), SMALL_TRAIN_FILES, SMALL_HELDOUT_FILES, 0.01),
}


@pytest.mark.parametrize("lengths", list(REAL_CASES), ids=str)
def test_exact_on_stdlib_text(stdlib_docs, lengths):
    geom, train_files, heldout_files, max_share = REAL_CASES[lengths]
    train_parts = [stdlib_docs[f] for f in train_files]
    heldout = np.concatenate([stdlib_docs[f] for f in heldout_files])
    idx, shares = check_exact(geom, train_parts, {"train": None, "heldout": heldout}, max_share)
    # the held-out text really exercises hits and misses
    h = idx.lookup(heldout)
    hit = (h.count[0] > 0).mean()
    assert 0.01 < hit < 1.0, hit  # 2% for 6-grams, 46% for 2-grams
    assert (h.count[0] > 1).any() and (h.purity[0] < 1).any()


def test_real_text_table_equals_slot_replay(stdlib_docs):
    geom = REAL_CASES[(6, 10, 20)][0]
    stream = np.concatenate([stdlib_docs[f] for f in SMALL_TRAIN_FILES])
    idx = HintIndex(geom, workers=2).add(stream)
    fill, table, dropped = reference_slots(geom, stream)
    assert idx.fill.tobytes() == fill.tobytes()
    assert idx.table.tobytes() == table.tobytes()
    assert idx.dropped == dropped == 0


# ---- random streams ---------------------------------------------------------------------------

def iid_stream(seed, n, vocab, low=0):
    return np.random.default_rng(seed).integers(low, low + vocab, n).astype(np.uint16)


def phrase_stream(seed, n, vocab, n_phrases, max_len, pick_seed=0):
    """Random phrases (1..max_len tokens of a small vocabulary) strung together with Zipf-like
    weights: long n-grams repeat with varied followers, short ones repeat a lot. Another
    pick_seed gives another stream of the same phrases (a held-out text)."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(0, vocab, rng.integers(1, max_len + 1)) for _ in range(n_phrases)]
    w = 1.0 / np.arange(1, n_phrases + 1)
    picks = np.random.default_rng([seed, pick_seed]).choice(n_phrases, size=n, p=w / w.sum())
    out, total = [], 0
    for i in picks:
        out.append(phrases[i])
        total += phrases[i].size
        if total >= n:
            break
    return np.concatenate(out)[:n].astype(np.uint16)


RANDOM_CASES = [
    # (id, geometry, make(seed) -> stream, allowed share of collided positions; 0: none may collide)
    ("iid-v4-6.10.20", Geometry(8, 4, 128, (6, 10, 20)), lambda i: iid_stream(1 + i, 12000, 4), 0.005),
    ("phrases-6.10.20", Geometry(10, 2, 512, (6, 10, 20)),
     lambda i: phrase_stream(2, 20000, 12, 300, 12, pick_seed=i), 0.03),
    ("iid-v3-2.3-max-ids", Geometry(0, 2, 8192, (2, 3)), lambda i: iid_stream(3 + i, 5000, 3, low=65533), 0.0),
    ("iid-v20-2.3", Geometry(6, 4, 256, (2, 3)), lambda i: iid_stream(4 + i, 12000, 20, low=65500), 0.0),
    ("phrases-4", Geometry(4, 4, 512, (4,)), lambda i: phrase_stream(5, 20000, 30, 200, 8, pick_seed=i), 0.0),
    ("phrases-3.5.8.13", Geometry(10, 2, 512, (3, 5, 8, 13)),
     lambda i: phrase_stream(6, 12000, 20, 150, 10, pick_seed=i), 0.15),
    ("iid-v3-1.2", Geometry(0, 2, 2048, (1, 2)), lambda i: iid_stream(7 + i, 3000, 3), 0.0),
]


@pytest.mark.parametrize("case", RANDOM_CASES, ids=[c[0] for c in RANDOM_CASES])
def test_exact_on_random_streams(case):
    name, geom, make, max_share = case
    stream = make(0)
    rng = np.random.default_rng(7)
    cut = sorted(rng.integers(0, stream.size, 5))  # added in 6 calls: the stream continues across them
    parts = np.split(stream, cut)
    queries = {"train": None, "other": make(100), "train-slice": stream[123:4567]}
    _, shares = check_exact(geom, parts, queries, max_collided_share=max_share)
    if max_share > 0:
        assert max(shares.values()) > 0  # this case is here to exercise collided positions


def test_exact_across_sort_blocks():
    """The growing index's lookup sorts and groups positions in blocks of GROUP_BLOCK: a query of
    more than two blocks, whose frequent n-grams recur in every block, is exact everywhere."""
    train = phrase_stream(21, 30000, 12, 200, 12)
    query = phrase_stream(21, 2 * GROUP_BLOCK + 3000, 12, 200, 12, pick_seed=1)
    idx, _ = check_exact(Geometry(10, 2, 256, (6, 10, 20)), [train], {"long": query}, 0.05)
    assert (idx.lookup(query).count[0] > 1).mean() > 0.5  # most positions share their n-gram with others

def test_exact_counts_cover_kinds_and_ties():
    """The random cases are not vacuous: counts of every count bucket and ties occur."""
    geom = Geometry(10, 2, 512, (6, 10, 20))
    stream = phrase_stream(2, 20000, 12, 300, 12)
    h = HintIndex(geom).add(stream).lookup(stream)
    _, count_bucket, purity_bucket = kind_parts(h.kind[h.kind >= 0])
    assert h.count.max() >= 33 and set(np.unique(count_bucket)) == set(range(N_COUNT_BUCKETS))
    assert set(np.unique(purity_bucket)) == set(range(N_PURITY_BUCKETS))


# ---- table bytes vs the slot-level replay -----------------------------------------------------

def constant_stream(n, tok=7):
    return np.full(n, tok, dtype=np.uint16)


def periodic_stream(n, period=(5, 9, 5, 65535)):
    return np.resize(np.array(period, dtype=np.uint16), n)


def hot_plus_noise(seed, n):
    """A random stream in which one 6-gram recurs every ~10 tokens."""
    rng = np.random.default_rng(seed)
    s = rng.integers(100, 50000, n).astype(np.uint16)
    for i in range(0, n - 7, 10):
        s[i:i + 6] = [11, 12, 13, 14, 15, 16]
    return s


SLOT_CASES = [
    # (id, geometry, stream, expect drops)
    ("iid-v3-overflow", Geometry(4, 8, 16, (6, 10, 20)), lambda: iid_stream(11, 20000, 3), True),
    ("iid-v50-no-overflow", Geometry(4, 8, 16, (6, 10, 20)), lambda: iid_stream(12, 20000, 50), False),
    ("constant", Geometry(4, 8, 16, (6, 10, 20)), lambda: constant_stream(3000), True),
    ("periodic-max-id", Geometry(2, 4, 8, (6, 10, 20)), lambda: periodic_stream(3000), True),
    ("hot-6gram", Geometry(6, 10, 64, (6, 10, 20)), lambda: hot_plus_noise(13, 20000), True),
    ("phrases-3.5.8.13", Geometry(2, 6, 8, (3, 5, 8, 13)), lambda: phrase_stream(14, 15000, 20, 150, 10), True),
    ("P0-len4", Geometry(0, 3, 8, (4,)), lambda: iid_stream(15, 3000, 40), True),
    ("len1.2", Geometry(3, 3, 8, (1, 2)), lambda: iid_stream(16, 3000, 300), True),
    ("len2.33", Geometry(3, 5, 16, (2, 33)), lambda: phrase_stream(17, 8000, 10, 50, 40), True),
    ("wide-buckets", Geometry(1, 1, 1024, (6, 10, 20)), lambda: phrase_stream(18, 8000, 8, 40, 10), True),
]


@pytest.mark.parametrize("case", SLOT_CASES, ids=[c[0] for c in SLOT_CASES])
def test_table_bytes_equal_reference_slots(case):
    name, geom, make, expect_drops = case
    stream = make()
    fill, table, dropped = reference_slots(geom, stream)
    assert (dropped > 0) == expect_drops, dropped  # the case exercises what it claims to
    assert int(fill.sum()) + dropped == max(0, stream.size - geom.lengths[0])
    for workers, chunks in ((1, 1), (3, 7)):
        idx = HintIndex(geom, workers=workers)
        for part in np.array_split(stream, chunks):
            idx.add(part)
        assert idx.fill.dtype == np.uint16 and idx.table.dtype == np.uint64
        assert idx.fill.shape == fill.shape and idx.table.shape == table.shape
        assert idx.fill.tobytes() == fill.tobytes(), (name, workers)
        assert idx.table.tobytes() == table.tobytes(), (name, workers)
        assert idx.dropped == dropped, (name, workers)
        assert idx.hints_stored == int(fill.sum())


def test_slot_of_matches_table_positions():
    """slot_of's (partition, b1, b2, word) is where the index put position j: in b1 while b1 had
    room, in stream order (a hand check of the placement rule, independent of reference_slots)."""
    geom = Geometry(2, 3, 8, (6, 10, 20))
    stream = iid_stream(21, 600, 4)
    idx = HintIndex(geom).add(stream)
    fill = np.zeros((geom.n_partitions, geom.n_buckets), dtype=np.int64)
    seen_b2 = seen_drop = 0
    for j in range(6, stream.size):
        p, b1, b2, word = slot_of(geom, [int(x) for x in stream], j)
        assert b1 != b2 and 0 <= p < geom.n_partitions
        assert word & 0xFFFF == stream[j]
        if fill[p, b1] < geom.slots:
            b = b1
        else:
            b, seen_b2 = b2, seen_b2 + 1
        if fill[p, b] == geom.slots:
            seen_drop += 1
            continue
        assert int(idx.table[p, b, fill[p, b]]) == word, j
        fill[p, b] += 1
    assert (fill == idx.fill).all()
    assert seen_b2 > 0 and seen_drop > 0 and seen_drop == idx.dropped
