"""Sealed indexes and the growing index's scan: a sealed index (sorted buckets, bucket summaries,
side table) returns exactly what the growing index returns, for any geometry, overflow or not,
after save/load, and whatever the worker count; add() unseals; the scan follows adds.
(Exactness against hints.index.reference.ReferenceIndex is checked in test_hints_exact.py, for both.)"""
import numpy as np
import pytest

from hints import Geometry, HintIndex
from hints.index import hint_index, lookup, sealed, store
from hints.index.reference import slot_of
from hints.index.sealed import SIDE_MIN_COUNT, summary_words

FIELDS = ("token", "count", "purity", "kind")


def phrase_stream(seed, n, vocab, n_phrases, max_len, pick_seed=0):
    """Random phrases of a small vocabulary strung together (Zipf-like): n-grams of every length
    repeat, with varied followers. Another pick_seed strings the same phrases another way."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(0, vocab, rng.integers(1, max_len + 1)) for _ in range(n_phrases)]
    w = 1.0 / np.arange(1, n_phrases + 1)
    picks = np.random.default_rng([seed, pick_seed]).choice(n_phrases, size=n, p=w / w.sum())
    return np.concatenate([phrases[i] for i in picks])[:n].astype(np.uint16)


def assert_same_hints(a, b, what=""):
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and x.shape == y.shape, (what, f)
        bad = np.argwhere(x != y)
        assert bad.size == 0, f"{what}: {f} differs at {bad[:5].tolist()}"


CASES = [
    # (id, geometry, stream seed/vocab/phrases/max phrase length); all have side-table entries
    ("overflow-6.10.20", Geometry(4, 6, 16, (6, 10, 20)), (1, 16, 200, 12)),
    ("roomy-6.10.20", Geometry(6, 8, 176, (6, 10, 20)), (2, 12, 300, 12)),
    ("two-summary-lines", Geometry(2, 3, 512, (6, 10, 20)), (3, 10, 100, 10)),  # S > 184: summary of 2 lines
    ("len-1.2.3.4", Geometry(3, 5, 64, (1, 2, 3, 4)), (4, 40, 200, 6)),
    ("len-2.3", Geometry(4, 6, 32, (2, 3)), (5, 30, 300, 8)),
    ("len-4", Geometry(0, 4, 128, (4,)), (6, 20, 100, 8)),
    ("len-3.5.8.13", Geometry(5, 6, 64, (3, 5, 8, 13)), (7, 20, 150, 10)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_sealed_equals_scan(case):
    _, geom, (seed, vocab, n_phrases, max_len) = case
    train = phrase_stream(seed, 30000, vocab, n_phrases, max_len)
    queries = [train, phrase_stream(seed, 8000, vocab, n_phrases, max_len, pick_seed=1),
               np.random.default_rng(seed).integers(0, 65536, 3000).astype(np.uint16)]
    idx = HintIndex(geom, workers=2).add(train)
    before = [idx.lookup(q) for q in queries]
    fill = idx.fill.copy()
    stored = np.sort(idx.table, axis=2)
    idx.seal()
    assert idx.sealed and idx.side_capacity > 0  # the case exercises the side table
    assert (idx.fill == fill).all()
    assert (np.sort(idx.table, axis=2) == stored).all()  # sealing reorders slots, changes none
    for i, (q, b) in enumerate(zip(queries, before)):
        assert_same_hints(idx.lookup(q), b, f"query {i}")
    summary = idx._side[0]
    assert summary.shape[2] == summary_words(geom.slots)
    assert (summary[:, :, 0] == idx.fill).all()
    # the presence filter: a bit per distinct shortest key, so no more bits than slots (an
    # all-ones filter would reject nothing), and one at least in every non-empty bucket
    base = 1 + geom.slots // 8
    bits = np.unpackbits(summary[:, :, base:base + sealed.FILTER_WORDS].copy().view(np.uint8), axis=-1).sum(-1)
    assert (bits <= idx.fill).all() and ((bits > 0) == (idx.fill > 0)).all()
    # the sealed lookup reads long runs' top followers from the side table: counts >= the threshold occur
    assert (before[0].count >= SIDE_MIN_COUNT).any() and (before[0].count[:, 20:] == 1).any()


@pytest.mark.parametrize("block", [1000, None])
def test_sealed_lookup_in_claimed_blocks_equals_scan(monkeypatch, block):
    """A sealed lookup's workers claim blocks of positions (sealed.search_claimed): with any worker
    count, blocks that do not divide the query (a short last one), and many blocks or few of the
    real size, the hints are the growing index's scan's."""
    if block:
        monkeypatch.setattr(hint_index, "search_blocks",  # many blocks of one size in a short query
                            lambda n, workers: np.append(np.arange(0, n, block), n))
    geom = CASES[1][1]
    train = phrase_stream(2, 30000, 12, 300, 12)
    q = phrase_stream(2, 2 * sealed.SEARCH_BLOCK + 777 if block is None else 10_500, 12, 300, 12, pick_seed=1)
    want = HintIndex(geom, workers=1).add(train).lookup(q)
    idx = HintIndex(geom, workers=1).add(train).seal()
    for w in (1, 2, 3):
        idx.workers = w
        assert_same_hints(idx.lookup(q), want, f"{w} workers")
        tok, cnt, top = idx.lookup_counts(q)
        assert (tok == want.token).all() and (cnt == want.count).all()


@pytest.mark.parametrize("n", [0, 1, 4095, 4097, 32_768, 115_985, 904_837])
def test_search_blocks_cover_the_query_and_shrink(n):
    """The blocks a sealed lookup's workers claim: all n positions once, in order; one block for one
    worker; for more, blocks that never grow, at most one sort block and (but the last) at least
    SEARCH_MIN_BLOCK, the first a 1/(SEARCH_SHARE x workers) share of the query."""
    assert sealed.search_blocks(n, 1).tolist() == ([0, n] if n else [0])
    for workers in (2, 3, 8):
        starts = sealed.search_blocks(n, workers)
        sizes = np.diff(starts)
        assert starts[0] == 0 and starts[-1] == n and (sizes > 0).all(), workers
        assert (sizes <= sealed.SEARCH_BLOCK).all() and (sizes[:-1] >= sealed.SEARCH_MIN_BLOCK).all()
        assert (np.diff(sizes[:-1]) <= 0).all()
        if sizes.size > 2 and sizes[0] > sealed.SEARCH_MIN_BLOCK:  # they shrink to the least by the end
            assert sizes[-2] == sealed.SEARCH_MIN_BLOCK
        if n:
            want = min(n, sealed.SEARCH_BLOCK, max(sealed.SEARCH_MIN_BLOCK, -(-n // (sealed.SEARCH_SHARE * workers))))
            assert sizes[0] == want


def test_seal_bytes_do_not_depend_on_workers():
    geom = Geometry(4, 6, 32, (6, 10, 20))
    stream = phrase_stream(8, 20000, 16, 200, 12)
    sealed = [HintIndex(geom, workers=w).add(stream).seal() for w in (1, 3)]
    a, b = sealed
    assert a.table.tobytes() == b.table.tobytes()
    for x, y in zip(a._side, b._side):
        assert x.tobytes() == y.tobytes()
    assert a.data_checksum() == b.data_checksum()
    assert a.data_checksum() != HintIndex(geom).add(stream).data_checksum()


def test_sealed_save_and_load(tmp_path):
    geom = Geometry(4, 6, 32, (6, 10, 20))
    stream = phrase_stream(9, 20000, 16, 200, 12)
    q = phrase_stream(9, 4000, 16, 200, 12, pick_seed=2)
    idx = HintIndex(geom, workers=2).add(stream).seal()
    want = idx.lookup(q)
    path = str(tmp_path / "sealed.idx")
    idx.save(path)
    hdr = store.read_header(path)
    assert hdr["sealed"] and hdr["version"] == store.VERSION and hdr["side_capacity"] == idx.side_capacity
    for mmap in (True, False):
        got = HintIndex.load(path, mmap=mmap, verify=True)
        assert got.sealed
        assert_same_hints(got.lookup(q), want, f"mmap={mmap}")
    with pytest.raises(RuntimeError, match="read-only"):
        HintIndex.load(path, mmap=True).add(stream[:100])
    # a corrupt side table is caught by the data checksum
    lay = store.layout(geom, idx.side_capacity)
    with open(path, "r+b") as f:
        f.seek(lay["side"] + 8)
        f.write(b"\xff" * 8)
    with pytest.raises(ValueError, match="checksum mismatch"):
        HintIndex.load(path, mmap=False)


def test_file_backed_index_seals_in_place(tmp_path):
    geom = Geometry(3, 5, 32, (6, 10, 20))
    stream = phrase_stream(10, 15000, 16, 200, 12)
    path = str(tmp_path / "in_place.idx")
    idx = HintIndex(geom, path=path).add(stream)
    want = idx.lookup(stream)
    idx.seal().save()
    assert store.read_header(path)["sealed"]
    assert_same_hints(HintIndex.load(path).lookup(stream), want, "sealed in place")
    idx.add(stream[:500]).save()  # unsealed again: the file shrinks back to the table
    assert not store.read_header(path)["sealed"]
    assert_same_hints(HintIndex.load(path).lookup(stream),
                      HintIndex(geom).add(stream).add(stream[:500]).lookup(stream), "unsealed in place")


def test_add_after_seal_unseals_and_stays_exact():
    geom = Geometry(4, 6, 32, (6, 10, 20))
    stream = phrase_stream(11, 24000, 16, 200, 12)
    idx = HintIndex(geom).add(stream[:12000]).seal()
    idx.add(stream[12000:])
    assert not idx.sealed
    plain = HintIndex(geom).add(stream[:12000]).add(stream[12000:])
    assert_same_hints(idx.lookup(stream), plain.lookup(stream), "added after seal")
    assert_same_hints(idx.seal().lookup(stream), plain.lookup(stream), "sealed again")


@pytest.mark.parametrize("version", [1, 2, 3])
def test_file_of_an_earlier_hash_is_refused(tmp_path, version):
    """A file made before format version 4 changed the n-gram hash holds every slot where this
    code would not look for it: loading it fails with a message that names the file, its version
    and what to do, and leaves the file as it was."""
    geom = Geometry(3, 5, 32, (6, 10, 20))
    idx = HintIndex(geom).add(phrase_stream(12, 10000, 16, 200, 12))
    path = str(tmp_path / f"v{version}.idx")
    idx.save(path)
    header = bytearray(idx._header())
    header[8:12] = version.to_bytes(4, "little")
    store.write_header(path, bytes(header))
    with open(path, "rb") as f:
        before = f.read()
    for mmap in (True, False):
        with pytest.raises(ValueError, match=rf"v{version}\.idx: format version is {version}, made before version 4 "
                                             rf"changed the n-gram hash.*build it again"):
            HintIndex.load(path, mmap=mmap)
    with open(path, "rb") as f:
        assert f.read() == before


def test_scan_follows_adds():
    """Lookups between adds of a growing index see exactly the slots added so far, also once
    buckets are full and n-grams spill into their second bucket (the scan reads it only then)."""
    geom = Geometry(0, 2, 512, (6, 10, 20))  # 4 buckets: frequent n-grams fill both of theirs
    stream = phrase_stream(13, 2000, 8, 40, 8)
    q = stream[:1000]
    idx = HintIndex(geom)
    last = None
    changed = 0
    for a, b in [(0, 400), (400, 401), (401, 900), (900, 1500), (1500, 2000)]:
        idx.add(stream[a:b])
        got = idx.lookup(q)
        fresh = HintIndex(geom).add(stream[:b]).lookup(q)
        assert_same_hints(got, fresh, f"after adding up to {b}")
        assert_same_hints(idx.lookup(q), got, "a second lookup")
        if last is not None:
            changed += int((got.count != last.count).sum())
        last = got
    assert changed > 1000  # the adds did change results
    assert (idx.fill == geom.slots).sum() >= 2  # full first buckets: second buckets were read



@pytest.mark.parametrize("entries, run_slots, full", [(lookup.FROZEN_ENTRIES, lookup.FROZEN_RUN_SLOTS, False),
                                                      (2, 1 << 10, True), (64, 40, True)],
                         ids=["room", "table-full", "runs-full"])
def test_frozen_runs_follow_adds(monkeypatch, entries, run_slots, full):
    """A growing index's lookups keep the sorted runs of n-grams whose two buckets are full
    (hints.index.lookup.frozen_run) across calls. Lookups between adds stay equal to a sealed index of
    the tokens added so far: with room for every run, and with room for 2 runs or for 40 slots,
    where the kept runs are dropped and gathered again many times in one lookup."""
    monkeypatch.setattr(lookup, "FROZEN_ENTRIES", entries)  # they size the scratch made from here on
    monkeypatch.setattr(lookup, "FROZEN_RUN_SLOTS", run_slots)
    geom = Geometry(1, 2, 16, (2, 3, 5))  # 8 buckets of 16: frequent n-grams fill both of theirs
    stream = phrase_stream(17, 6000, 4, 30, 6)
    idx = HintIndex(geom, workers=1)
    frozen_positions = 0
    for a, b in [(0, 300), (300, 301), (301, 2000), (2000, 6000)]:
        idx.add(stream[a:b])
        for q in (stream[:3000], stream[3000:]):
            assert_same_hints(idx.lookup(q), HintIndex(geom).add(stream[:b]).seal().lookup(q), f"after {b}")
        ext = [int(x) for x in stream[3000:]] + [0]
        buckets = [slot_of(geom, ext, j)[:3] for j in range(geom.lengths[0], len(ext))]
        frozen_positions += sum(idx.fill[p, b1] >= geom.slots and idx.fill[p, b2] >= geom.slots for p, b1, b2 in buckets)
    entries_kept, _, dropped_all = idx._scratch_free[0]["frozen_used"]
    assert frozen_positions > 1000 and entries_kept > 0  # the kept runs were used
    assert (dropped_all > 10) == full  # ... and dropped when full


def test_frozen_runs_of_partitions_past_2_15():
    """A kept frozen run is found by its partition and shortest checksum together, at any
    partition count the geometry allows. The 3-grams a and b were found by a search over random
    3-grams: at 2^16 partitions their shortest checksums are equal and their partitions differ
    only in the top bit (asserted), so a key that kept 15 bits of the partition gave one n-gram
    the other's kept run. (The hash is linear in the tokens before its top bits are taken, so
    whether two n-grams collide so depends only on their difference: no two 2-grams do.)"""
    geom = Geometry(16, 1, 8, (3, 4, 6))
    a, b = (30992, 60105, 30617), (16074, 18263, 39937)
    (pa, a1, a2, ka), (pb, b1, b2, kb) = (slot_of(geom, [*g, 0], 3) for g in (a, b))
    shift = geom.key_shifts[0]
    assert pa ^ pb == 1 << 15 and ka >> shift == kb >> shift and (a1, a2) == (b1, b2)
    stream = np.array([*a, 1] * 20 + [*b, 2] * 20, dtype=np.uint16)  # each fills both its buckets
    idx = HintIndex(geom).add(stream)
    assert idx.fill[pa, a1] == idx.fill[pa, a2] == idx.fill[pb, b1] == idx.fill[pb, b2] == geom.slots
    got = idx.lookup(stream)
    assert_same_hints(got, HintIndex(geom).add(stream).seal().lookup(stream), "scan vs sealed")
    assert got.token[0, 2] == 1 and got.token[0, 82] == 2  # each 3-gram's own follower


def test_compile_kernels_covers_a_runs_lookups(tmp_path):
    """compile_kernels (what train_gpt.py runs before its clock starts) leaves nothing for a
    run's hint work to compile: a training-time index (add, scan lookup) and a background index
    (sealed, saved, mapped read-only) of other geometries and workers reuse its signatures."""
    from hints.index import build, compile_kernels
    lengths = (6, 10, 20)
    compile_kernels(lengths)
    dispatchers = [lookup.lookup_scan, sealed.search_sealed, sealed.lookup_sorted, sealed.seal_partitions,
                   build.stage1_worker, build.stage2_place]
    before = [len(f.signatures) for f in dispatchers]
    stream = phrase_stream(7, 5000, 30, 100, 12)
    train = HintIndex(Geometry(2, 6, 16, lengths), workers=2).add(stream[:3000])
    train.lookup(stream[3000:])
    bg = HintIndex(Geometry(3, 5, 32, lengths)).add(stream).seal()
    HintIndex.load(bg.save(str(tmp_path / "bg.idx")), mmap=True, workers=2).lookup(stream[:2000])
    assert [len(f.signatures) for f in dispatchers] == before


def test_compile_kernels_needs_no_writable_temp_dir(monkeypatch, tmp_path):
    """compile_kernels builds its tiny background-style index in a memfd, as the background
    builder does: a run whose temporary directory is missing or read-only still starts."""
    import tempfile
    from hints.index import compile_kernels
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    assert compile_kernels((6, 10, 20)) > 0
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("seal", [True, False])
def test_lookups_reuse_output_memory_only_once_no_result_refers_to_it(seal):
    """An index hands a lookup the memory of an earlier result's outputs (no page faults on the
    clock) only when no array views it any more: a result a caller holds is never written again."""
    geom = Geometry(4, 6, 16, (6, 10, 20))
    idx = HintIndex(geom, workers=2).add(phrase_stream(1, 20_000, 16, 200, 12))
    if seal:
        idx.seal()
    q1, q2 = phrase_stream(2, 5_000, 16, 200, 12), phrase_stream(3, 5_000, 16, 200, 12)
    fresh = HintIndex(geom).add(phrase_stream(1, 20_000, 16, 200, 12))  # what every lookup must equal
    want1, want2 = fresh.lookup(q1), fresh.lookup(q2)

    def memory(h):
        return [getattr(h, f) for f in FIELDS]

    a = idx.lookup(q1)
    b = idx.lookup(q1)  # a is held: new memory
    c = idx.lookup(q2)  # a and b are held: new memory again
    for i, j in ((0, 1), (0, 2), (1, 2)):  # (indices: a loop variable would hold a result)
        assert not any(np.shares_memory(u, v) for u in memory((a, b, c)[i]) for v in memory((a, b, c)[j]))
    assert_same_hints(a, want1, "a, held through two more lookups")
    assert_same_hints(b, want1, "b")
    assert_same_hints(c, want2, "c")
    b_at = b.token.ctypes.data
    del b
    d = idx.lookup(q2)  # b's memory is free again, and is reused
    assert d.token.ctypes.data == b_at
    assert_same_hints(d, want2, "d, in b's memory")
    view = d.count[1:, 10:]  # a view of one field keeps the whole buffer
    del d
    e = idx.lookup(q1)
    assert not any(np.shares_memory(view, v) for v in memory(e))
    assert_same_hints(e, want1, "e")
    assert_same_hints(a, want1, "a, at the end")
    assert_same_hints(c, want2, "c, at the end")
