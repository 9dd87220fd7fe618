"""Stage 1's work distribution: workers claim chunks of the stream one after another (the next
unclaimed chunk each time), and stage 2 takes every partition's slots back in chunk order, so
the bytes equal one worker's for any worker count and chunk size, and the slot-level replay's."""
import numpy as np
import pytest

from hints import Geometry, HintIndex
from hints.index import stage1_chunk
from hints.index.reference import reference_slots
from streams import phrase_stream


def build(geom, stream, workers, chunk, parts=1):
    idx = HintIndex(geom, workers=workers)
    idx.stage1_chunk = chunk
    for part in np.array_split(stream, parts):
        idx.add(part)
    return idx


# the fourth: several partitions whose adds bring 8 or more slots a bucket, so stage 2 goes through
# bucket lines in every add, and a bucket's last line often holds slots of an earlier add
@pytest.mark.parametrize("geom", [Geometry(4, 6, 16, (6, 10, 20)), Geometry(0, 6, 64, (2, 3)),
                                  Geometry(8, 2, 8, (3, 5, 8, 13)), Geometry(2, 4, 64, (2, 3))], ids=str)
def test_any_workers_and_chunks_give_one_workers_bytes(geom):
    stream = phrase_stream(1, 12000, 16, 200, 12)
    fill, table, dropped = reference_slots(geom, stream)
    assert dropped > 0  # drop order matters: the test sees it
    for workers, chunk, parts in ((1, stage1_chunk(geom), 1), (2, 97, 1), (3, 1, 2), (5, 1000, 3), (2, 20, 7)):
        for _ in range(2):  # chunk ownership depends on thread timing; the bytes must not
            idx = build(geom, stream, workers, chunk, parts)
            assert idx.fill.tobytes() == fill.tobytes(), (workers, chunk, parts)
            assert idx.table.tobytes() == table.tobytes(), (workers, chunk, parts)
            assert idx.dropped == dropped


def test_workers_that_interleave_give_one_workers_bytes():
    """Chunks claimed by several workers are taken back in chunk order. Which worker claims
    which chunk depends on thread timing (a worker that starts late may find every chunk
    taken), so builds are repeated until the workers did share the chunks; every build,
    shared or not, must give the one worker's bytes. The stream is long enough that stage 1
    outlasts a scheduler's time slice (~15 ms of hashing): at 400k tokens (2-3 ms) a loaded 2-core
    machine ran one worker through every chunk before the others started, in 20 builds of 20."""
    geom = Geometry(4, 8, 32, (6, 10, 20))
    stream = np.tile(phrase_stream(3, 400_000, 40, 2000, 12), 8)
    one = build(geom, stream, 1, 997)
    for workers in (2, 3):
        shared = False
        for _ in range(20):
            idx = build(geom, stream, workers, 997)
            assert idx.dropped == one.dropped > 0
            assert idx.fill.tobytes() == one.fill.tobytes() and idx.table.tobytes() == one.table.tobytes()
            shared = len(set(idx._stage["owner"][:-(-stream.size // 997)].tolist())) >= 2
            if shared:
                break
        assert shared, f"{workers} workers never shared the chunks in 20 builds"


@pytest.mark.parametrize("geom", [Geometry(4, 8, 32, (6, 10, 20)), Geometry(0, 2, 65528, (6, 10, 20)),
                                  Geometry(14, 1, 8, (6, 10, 20))], ids=str)
def test_stream_of_several_default_chunks(geom):
    """More than one chunk of the default size, one worker vs three: 64k-token chunks, of
    which one partition can take every slot (one partition: 65,536 slots of one chunk in one
    count), and with 2^14 partitions chunks grown to bring each partition 64 slots."""
    chunk = stage1_chunk(geom)
    assert chunk == max(1 << 16, geom.n_partitions * 64)
    stream = phrase_stream(2, 2 * chunk + 123, 40, 2000, 12)
    one = build(geom, stream, 1, chunk)
    many = build(geom, stream, 3, chunk)
    assert one.dropped == many.dropped
    assert one.fill.tobytes() == many.fill.tobytes() and one.table.tobytes() == many.table.tobytes()


def test_slots_of_full_buckets_are_not_staged(tmp_path):
    """Stage 1 skips a slot whose two buckets were full when the add began (stage 2 would drop
    it): the bytes and the drop count stay the reference's, also when the full buckets come
    from a saved index, and the full-bucket bits stay those of the fill after every add."""
    from hints.index.build import full_buckets
    geom = Geometry(2, 4, 8, (3, 5, 8))
    stream = phrase_stream(4, 30_000, 16, 200, 12)
    fill, table, dropped = reference_slots(geom, stream)
    cut = stream.size // 3
    first = HintIndex(geom).add(stream[:cut])
    assert (first.fill >= geom.slots).sum() > geom.n_partitions * geom.n_buckets // 2  # most buckets full at the cut
    path = str(tmp_path / "third.idx")
    first.save(path)
    for idx in (first, HintIndex.load(path, mmap=False, workers=2)):
        for part in np.array_split(stream[cut:], 3):
            idx.add(part)
            assert np.array_equal(idx._full, full_buckets(idx.fill, geom.slots))
        assert idx.fill.tobytes() == fill.tobytes() and idx.table.tobytes() == table.tobytes()
        assert idx.dropped == dropped
