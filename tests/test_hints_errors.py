"""Refusals and persistence of the hint index: bad tokens, bad geometries, too-big tables (refused
before allocating), save/load round trips (in memory, memory-mapped, file-backed, continuing a
stream), corrupt files (refused with a ValueError naming the file), sizing helpers and presets."""
import os
import time


import numpy as np
import pytest

from hints import Geometry, HintIndex
from hints.index import PRESETS, TARGET_LOAD, store

GEOM = Geometry(4, 8, 16, (6, 10, 20))
FIELDS = ("token", "count", "purity", "kind")


def stream_of(seed, n, vocab=6):
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.uint16)


def assert_same_hints(a, b):
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and np.array_equal(x, y), f


def assert_untouched(idx):
    assert idx.tokens_added == 0 and idx.hints_stored == 0 and idx.dropped == 0
    assert not np.asarray(idx.fill).any() and not np.asarray(idx.table).any()


# ---- token input -----------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [np.array([1.0, 2.0]), np.array([1, 2], dtype=np.float32),
                                 np.array([True, False]), np.array(["a", "b"]), [1.5, 2.5]],
                         ids=["float64", "float32", "bool", "str", "float-list"])
def test_non_integer_tokens_refused(bad):
    idx = HintIndex(GEOM)
    with pytest.raises(ValueError, match="tokens"):
        idx.add(bad)
    with pytest.raises(ValueError, match="tokens"):
        idx.lookup(bad)
    assert_untouched(idx)


@pytest.mark.parametrize("bad", [np.zeros((2, 8), dtype=np.uint16), np.zeros((1, 1, 8), dtype=np.uint16),
                                 np.array(5, dtype=np.uint16), [[1, 2], [3, 4]]],
                         ids=["2d", "3d", "0d", "nested-list"])
def test_not_one_dimensional_refused(bad):
    idx = HintIndex(GEOM)
    with pytest.raises(ValueError, match="tokens.*1-D"):
        idx.add(bad)
    with pytest.raises(ValueError, match="tokens.*1-D"):
        idx.lookup(bad)
    assert_untouched(idx)


@pytest.mark.parametrize("bad", [np.array([3, -1], dtype=np.int32), np.array([-5], dtype=np.int64),
                                 np.array([65536], dtype=np.int32), np.array([1, 2, 1 << 40], dtype=np.int64),
                                 np.array([70000], dtype=np.uint32), np.array([-1], dtype=np.int8), [0, 65536]],
                         ids=["neg-int32", "neg-int64", "65536-int32", "2^40-int64", "70000-uint32", "neg-int8", "list"])
def test_out_of_range_ids_refused(bad):
    idx = HintIndex(GEOM)
    with pytest.raises(ValueError, match=r"tokens.*\[0, 65535\]"):
        idx.add(bad)
    with pytest.raises(ValueError, match="tokens"):
        idx.lookup(bad)
    assert_untouched(idx)


def test_refused_chunk_does_not_break_the_stream():
    s = stream_of(1, 3000)
    a = HintIndex(GEOM).add(s)
    b = HintIndex(GEOM).add(s[:1000])
    with pytest.raises(ValueError):
        b.add(np.array([1, 2, 70000], dtype=np.int64))
    b.add(s[1000:])
    assert a.table.tobytes() == b.table.tobytes() and a.tokens_added == b.tokens_added


def test_in_range_integer_dtypes_accepted():
    s = stream_of(2, 2000)
    base = HintIndex(GEOM).add(s)
    for dt in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64):
        v = s.astype(dt)
        idx = HintIndex(GEOM).add(v)
        assert idx.table.tobytes() == base.table.tobytes(), dt
        assert_same_hints(idx.lookup(v), base.lookup(s))
    edge = np.array([0, 65535] * 10, dtype=np.int64)  # the extreme ids are fine
    assert HintIndex(GEOM).add(edge).lookup(edge).token.max() == 65535
    # non-contiguous views are fine too
    idx = HintIndex(GEOM).add(np.repeat(s, 2)[::2])
    assert idx.table.tobytes() == base.table.tobytes()


def test_empty_input_is_fine():
    idx = HintIndex(GEOM)
    for empty in (np.array([], dtype=np.uint16), np.array([], dtype=np.int64), np.zeros(0, dtype=np.int32)):
        idx.add(empty)
        h = idx.lookup(empty)
        assert h.token.shape == h.count.shape == h.purity.shape == h.kind.shape == (3, 0)
        assert (h.token.dtype, h.count.dtype, h.purity.dtype, h.kind.dtype) == (np.int32, np.int32, np.float32, np.int16)
    assert_untouched(idx)
    s = stream_of(3, 500)
    idx.add(s[:10]).add(s[:0]).add(s[10:])
    assert idx.table.tobytes() == HintIndex(GEOM).add(s).table.tobytes()


def test_empty_python_list_is_fine():
    idx = HintIndex(GEOM)
    idx.add([])
    assert idx.lookup([]).token.shape == (3, 0)


def test_lookup_of_short_queries():
    idx = HintIndex(GEOM).add(stream_of(4, 3000))
    for n in (1, 2, 5, 6):
        h = idx.lookup(stream_of(5, n))
        assert h.token.shape == (3, n)
        assert (h.token[1:] == -1).all()  # too short for the 10- and 20-gram
        assert (h.token[0, :5] == -1).all()


# ---- geometry ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(slots=12), "slots"), (dict(slots=0), "slots"), (dict(slots=-8), "slots"), (dict(slots=65536), "slots"),
    (dict(lengths=(10, 6)), "lengths"), (dict(lengths=(6, 6, 20)), "lengths"), (dict(lengths=(6, 20, 10)), "lengths"),
    (dict(lengths=(1, 2, 3, 4, 5)), "lengths"), (dict(lengths=()), "lengths"), (dict(lengths=(0, 6)), "lengths"),
    (dict(lengths=(-1, 6)), "lengths"), (dict(lengths=(6, 10.5)), "integer"), (dict(lengths=6), "sequence"),
    (dict(partition_bits=21), "partition_bits"), (dict(partition_bits=-1), "partition_bits"),
    (dict(bucket_bits=0), "bucket_bits"), (dict(bucket_bits=25), "bucket_bits"),
    (dict(partition_bits=17, lengths=(4,)), "partition_bits"),  # 17 + 48 checksum bits > 64
], ids=lambda x: str(x))
def test_geometry_validation(kwargs, match):
    args = dict(partition_bits=4, bucket_bits=8, slots=16, lengths=(6, 10, 20))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        Geometry(**args)


def test_geometry_valid_edges():
    for g in (Geometry(0, 1, 8, (1,)), Geometry(16, 1, 8, (4,)), Geometry(20, 24, 65528, (1, 2, 3, 4)),
              Geometry(4, 8, 16, [6, 10, 20])):
        assert sum(g.checksum_bits) == 48 and g.slots % 8 == 0
        assert isinstance(g.lengths, tuple)
    g = Geometry(4, 8, 16, (6, 10, 20))
    assert g.key_shifts == (16 + 12 + 10, 16 + 10, 16)
    assert g.n_slots == 16 * 256 * 16 and g.table_bytes == 8 * g.n_slots and g.fill_bytes == 2 * 16 * 256
    with pytest.raises(ValueError, match="workers"):
        HintIndex(g, workers=0)


def test_too_big_geometry_refused_before_allocating(tmp_path):
    huge = Geometry(20, 20, 176)  # 1408 TiB
    t = time.perf_counter()
    with pytest.raises(MemoryError, match="geometry"):
        HintIndex(huge)
    with pytest.raises(MemoryError):
        HintIndex(huge, workers=4)
    path = tmp_path / "huge.idx"
    with pytest.raises(MemoryError, match="free"):  # a file backing checks the disk instead
        HintIndex(huge, path=str(path))
    assert time.perf_counter() - t < 2.0
    assert not path.exists()
    with pytest.raises(MemoryError):
        GEOM.check_fits_memory(available=GEOM.nbytes)  # over 90% of what is available
    GEOM.check_fits_memory(available=2 * GEOM.nbytes)
    if os.path.isdir("/dev/shm"):
        with pytest.raises(MemoryError):
            HintIndex(huge, path="/dev/shm/hints-test-never-created.idx")
        assert not os.path.exists("/dev/shm/hints-test-never-created.idx")


def test_for_tokens_and_presets():
    for n in (1, 100, 10 ** 4, 10 ** 6, 3 * 10 ** 7, 10 ** 9, 10 ** 11):
        g = Geometry.for_tokens(n)
        assert g.n_slots >= n / TARGET_LOAD, n
        assert g.bucket_bits <= 14 and g.slots == 176 and g.lengths == (6, 10, 20)
        if g.n_buckets * g.n_partitions > 2:  # the smallest such power-of-two geometry
            assert g.n_slots / 2 < n / TARGET_LOAD, n
    g = Geometry.for_tokens(10 ** 6, slots=64, lengths=(2, 3))
    assert g.slots == 64 and g.lengths == (2, 3) and g.n_slots >= 2 * 10 ** 6
    for bad in (0, -5):
        with pytest.raises(ValueError):
            Geometry.for_tokens(bad)
    rec = Geometry.preset("record")
    assert rec == Geometry(14, 14, 176, (6, 10, 20)) and rec.table_bytes == 352 * 2 ** 30
    assert "record" in PRESETS and {"tiny", "demo", "laptop"} <= set(PRESETS)
    for name, g in PRESETS.items():
        assert Geometry.preset(name) is g and g.slots % 8 == 0
    assert Geometry.preset("tiny").table_bytes <= 1 << 20
    with pytest.raises(ValueError, match="preset"):
        Geometry.preset("no-such-preset")
    idx = HintIndex("tiny")
    assert idx.geom == Geometry.preset("tiny")


# ---- save / load -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built():
    """An index with drops (so the dropped count must survive a round trip) and a query."""
    s = stream_of(6, 20000, vocab=4)
    idx = HintIndex(GEOM, workers=2).add(s)
    assert idx.dropped > 0
    return idx, s, stream_of(7, 3000, vocab=4)


def test_stats(built):
    idx, s, _ = built
    st = idx.stats()
    g = GEOM
    assert st["geometry"] == g.to_dict() and st["table_bytes"] == g.table_bytes
    assert st["tokens_added"] == s.size
    assert st["hints_stored"] == int(np.asarray(idx.fill, dtype=np.int64).sum()) == idx.hints_stored
    assert st["dropped"] == idx.dropped > 0
    assert st["hints_stored"] + st["dropped"] == s.size - g.lengths[0]  # one slot per position
    hist = st["fill_histogram"]
    assert len(hist) == g.slots + 1 and sum(hist) == g.n_partitions * g.n_buckets
    assert sum(i * c for i, c in enumerate(hist)) == st["hints_stored"]
    assert st["full_buckets"] == hist[g.slots] > 0
    assert st["load"] == pytest.approx(st["hints_stored"] / g.n_slots)
    empty = HintIndex(GEOM).stats()
    assert empty["hints_stored"] == empty["dropped"] == empty["tokens_added"] == 0
    assert empty["fill_histogram"][0] == g.n_partitions * g.n_buckets


def test_save_load_round_trip(built, tmp_path):
    idx, s, q = built
    path = str(tmp_path / "a.idx")
    assert idx.save(path) == path
    assert os.path.getsize(path) == store.layout(GEOM)[2]
    want = idx.lookup(q)
    for kwargs in (dict(mmap=False), dict(mmap=True), dict(mmap=True, verify=True), dict(mmap=False, workers=3)):
        got = HintIndex.load(path, **kwargs)
        assert got.geom == GEOM
        assert got.tokens_added == idx.tokens_added and got.dropped == idx.dropped
        assert got.stats() == idx.stats(), kwargs
        assert np.asarray(got.fill).tobytes() == idx.fill.tobytes()
        assert np.asarray(got.table).tobytes() == idx.table.tobytes()
        assert_same_hints(got.lookup(q), want)
    assert HintIndex.load(path, mmap=True).readonly and not HintIndex.load(path, mmap=False).readonly


@pytest.mark.parametrize("cut", [3, 7, 15, 10000])
def test_loaded_index_continues_the_stream(built, tmp_path, cut):
    """Save after `cut` tokens (3, 7 and 15: inside the first n-grams, so the saved stream tail
    matters), load into memory, add the rest: the same bytes as building at once."""
    whole, s, q = built
    path = str(tmp_path / "half.idx")
    HintIndex(GEOM, workers=2).add(s[:cut]).save(path)
    idx = HintIndex.load(path, mmap=False)
    idx.add(s[cut:])
    assert idx.tokens_added == s.size
    assert idx.fill.tobytes() == whole.fill.tobytes()
    assert idx.table.tobytes() == whole.table.tobytes()
    assert idx.dropped == whole.dropped
    assert_same_hints(idx.lookup(q), whole.lookup(q))
    # and again through a second save/load
    idx.save(path)
    again = HintIndex.load(path, mmap=True, verify=True)
    assert_same_hints(again.lookup(q), whole.lookup(q))


def test_mmap_loaded_index_is_read_only(built, tmp_path):
    idx, s, _ = built
    path = str(tmp_path / "ro.idx")
    idx.save(path)
    ro = HintIndex.load(path, mmap=True)
    before = open(path, "rb").read()
    with pytest.raises(RuntimeError, match="read-only"):
        ro.add(s[:100])
    assert open(path, "rb").read() == before and ro.tokens_added == idx.tokens_added


def test_file_backed_index(tmp_path):
    s, q = stream_of(8, 20000, vocab=4), stream_of(9, 2000, vocab=4)
    mem = HintIndex(GEOM, workers=2).add(s)
    path = str(tmp_path / "backed.idx")
    idx = HintIndex(GEOM, workers=2, path=path)
    assert os.path.getsize(path) == store.layout(GEOM)[2]
    with pytest.raises(ValueError, match="backed.idx"):  # not saved yet: the header is invalid
        HintIndex.load(path)
    idx.add(s[:5000]).add(s[5000:])
    assert np.asarray(idx.table).tobytes() == mem.table.tobytes()
    assert_same_hints(idx.lookup(q), mem.lookup(q))
    assert idx.save() == path
    for mmap in (True, False):
        got = HintIndex.load(path, mmap=mmap, verify=True)
        assert got.stats() == mem.stats()
        assert_same_hints(got.lookup(q), mem.lookup(q))
    # saving the file-backed index elsewhere gives the same file as saving the in-memory one
    a, b = str(tmp_path / "x.idx"), str(tmp_path / "y.idx")
    idx.save(a)
    mem.save(b)
    assert open(a, "rb").read() == open(b, "rb").read() == open(path, "rb").read()


def test_save_without_a_path_refused(built):
    with pytest.raises(ValueError, match="path"):
        built[0].save()


def test_lengths_beyond_saved_history_refused_by_geometry():
    with pytest.raises(ValueError, match="longest supported n-gram length is 64"):
        Geometry(2, 2, 8, (6, 65))
    Geometry(2, 2, 8, (6, 64))  # the longest length a saved index can continue


def test_save_smallest_geometry(tmp_path):
    g = Geometry(0, 1, 8, (2,))
    idx = HintIndex(g).add(stream_of(11, 50))
    path = str(tmp_path / "smallest.idx")
    idx.save(path)
    assert HintIndex.load(path, mmap=False).stats() == idx.stats()


# ---- corrupt files -----------------------------------------------------------------------------

def corrupt(path, offset, xor=0x01):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ xor]))


@pytest.fixture
def saved(built, tmp_path):
    path = str(tmp_path / "c.idx")
    built[0].save(path)
    return path


def test_wrong_magic_refused(saved):
    corrupt(saved, 0)
    for mmap in (True, False):
        with pytest.raises(ValueError, match=f"{saved}.*magic"):
            HintIndex.load(saved, mmap=mmap)


def test_not_an_index_refused(tmp_path):
    path = str(tmp_path / "text.idx")
    with open(path, "wb") as f:
        f.write(b"hello world\n" * 1000)
    with pytest.raises(ValueError, match="text.idx"):
        HintIndex.load(path)
    short = str(tmp_path / "short.idx")
    with open(short, "wb") as f:
        f.write(b"NGHINTS\x00")
    with pytest.raises(ValueError, match="short.idx"):
        HintIndex.load(short)
    with pytest.raises(FileNotFoundError, match="missing.idx"):
        HintIndex.load(str(tmp_path / "missing.idx"))


@pytest.mark.parametrize("offset", [12, 16, 28, 60, 70, 200, store._FIELDS.size])  # geometry, lengths, counts, history, CRC
def test_flipped_header_byte_refused(saved, offset):
    corrupt(saved, offset)
    for mmap in (True, False):
        with pytest.raises(ValueError, match=f"{saved}.*header checksum"):
            HintIndex.load(saved, mmap=mmap)


def test_wrong_version_refused(saved):
    with open(saved, "r+b") as f:  # a version no reader knows (a flipped bit would make a known one)
        f.seek(8)
        f.write((store.VERSION + 1).to_bytes(4, "little"))
    with pytest.raises(ValueError, match=f"{saved}.*version is {store.VERSION + 1}"):
        HintIndex.load(saved)


def test_truncated_file_refused(saved):
    size = os.path.getsize(saved)
    for new_size in (size - 8, size - 4096, 5000, 100):
        with open(saved, "r+b") as f:
            f.truncate(new_size)
        for mmap in (True, False):
            with pytest.raises(ValueError, match=saved):
                HintIndex.load(saved, mmap=mmap)


def test_appended_bytes_refused(saved):
    with open(saved, "ab") as f:
        f.write(b"\x00" * 8)
    for mmap in (True, False):
        with pytest.raises(ValueError, match=f"{saved}.*bytes"):
            HintIndex.load(saved, mmap=mmap)


@pytest.mark.parametrize("where", ["table-first", "table-middle", "table-last", "fill"])
def test_flipped_data_byte_refused(saved, where):
    fill_off, table_off, total = store.layout(GEOM)
    offset = {"table-first": table_off, "table-middle": (table_off + total) // 2 + 3,
              "table-last": total - 1, "fill": fill_off + 101}[where]
    corrupt(saved, offset, xor=0x40)
    # a fill count is checked on every load (the kernels rely on it); table bytes by the checksum
    what = "fill counts|claims" if where == "fill" else "checksum"
    with pytest.raises(ValueError, match=f"{saved}.*({what})"):
        HintIndex.load(saved, mmap=False)
    with pytest.raises(ValueError, match=f"{saved}.*({what})"):
        HintIndex.load(saved, mmap=True, verify=True)
    if where == "fill":
        with pytest.raises(ValueError, match=f"{saved}.*({what})"):
            HintIndex.load(saved, mmap=True)
    else:
        HintIndex.load(saved, mmap=True)  # a plain map checks the header and the fill counts, not the table


def test_geometry_parse():
    assert Geometry.parse("4,8,16", lengths=(2, 3)) == Geometry(4, 8, 16, (2, 3))
    assert Geometry.parse("record").table_bytes == 352 << 30
    assert Geometry.parse("tiny", lengths=(4,)).lengths == (4,)
    assert Geometry.parse("auto", 1_000_000) == Geometry.for_tokens(1_000_000)
    with pytest.raises(ValueError, match="'huge'"):
        Geometry.parse("huge")
    with pytest.raises(ValueError, match="slots=7"):
        Geometry.parse("4,8,7")


def test_hash_rounds_refuses_a_scratch_it_would_overrun():
    """The kernels index without bounds checks; hash_rounds, the hashing kernel scripts call with
    buffers of their own, checks the one whose size changed with the hash (scripts/target_ab.py
    once handed it the size from before, and the write past its end crashed the process)."""
    from hints.bench.limits import hash_rounds
    from hints.index.hashing import HASH_BLOCK, HASH_SCRATCH, hash_arrays
    geom = Geometry(2, 6, 16)
    lengths, pows, bits, shifts = hash_arrays(geom)
    s = np.arange(1000, dtype=np.uint16)
    keys, parts = np.zeros(HASH_BLOCK, np.uint64), np.zeros(HASH_BLOCK, np.uint64)
    args = (s, 1, lengths, pows, geom.partition_bits, bits, shifts)
    with pytest.raises(ValueError, match="scratch `prefix` is shorter than hints.index.hashing.HASH_SCRATCH"):
        hash_rounds(*args, np.zeros(HASH_SCRATCH - 1, np.uint64), keys, parts)
    hash_rounds(*args, np.zeros(HASH_SCRATCH, np.uint64), keys, parts)
    assert (keys != 0).all()
