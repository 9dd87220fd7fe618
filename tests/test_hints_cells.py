"""The record's cells: kinds.cell_of's bins, the boundary rule, the plain-Python reference, and
the exact positional training index against it (position filter, cap, BOS restarts, step 0,
causality), on standard-library source and on planted streams. Each rule's test also checks
that breaking the rule would change the answer on its data, so none passes vacuously."""
import os
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

from hints.cells import BOS, Cells, mask_hints, reach
from hints.kinds import (CELL_COUNT_EDGES, CELLS_PER_DEPTH, N_CELL_PURITY_BINS, cell_of, cell_one, cell_parts,
                         n_cells)
from hints.positional import PositionalIndex, build_phases, load_covering, phase_ends
from hints.index.reference import reference_cell, reference_cells

STDLIB = sysconfig.get_paths()["stdlib"]
LENGTHS = (6, 10, 20)


def normalize(text):
    return "\n".join(" ".join(line.split()) for line in text.splitlines())


@pytest.fixture(scope="module")
def stdlib_stream():
    """Four standard-library modules, each blank-line-separated block a document (starting with
    BOS): many boundaries, and documents that start alike ("def", "class", "if")."""
    from data.tokenizer import encode_document
    docs = []
    for name in ("argparse.py", "textwrap.py", "csv.py", "string.py"):
        with open(os.path.join(STDLIB, name), encoding="utf-8") as f:
            for block in f.read().split("\n\n"):
                if block.strip():
                    docs.append(np.array(encode_document(normalize(block)), dtype=np.uint16))
    return np.concatenate(docs)


def planted(seed, n, vocab=50, phrases=30, bos_every=300):
    """Random tokens with repeated phrases planted, and a BOS every ~bos_every tokens."""
    rng = np.random.default_rng(seed)
    pool = [rng.integers(0, vocab, rng.integers(6, 30)) for _ in range(phrases)]
    out, size = [], 0
    while size < n:
        part = pool[rng.integers(phrases)] if rng.random() < 0.6 else rng.integers(0, vocab, rng.integers(1, 6))
        if rng.random() < len(part) / bos_every:
            part = np.concatenate([[BOS], part])
        out.append(part)
        size += len(part)
    return np.concatenate(out)[:n].astype(np.uint16)


def assert_cells_equal(got, want, where=""):
    for f in Cells._fields:
        a, b = getattr(got, f), getattr(want, f)
        assert a.shape == b.shape and a.dtype == b.dtype, f"{where} {f}: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
        bad = np.argwhere(a != b)
        assert bad.size == 0, f"{where} {f} differs at {len(bad)} entries, first {bad[:4].tolist()}"


def same(a, b):
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in Cells._fields)


# ---- kinds.cell_of -------------------------------------------------------------------------------

def test_cell_bins_at_their_edges():
    assert n_cells(3) == 126 and CELLS_PER_DEPTH == 42
    # count bins: an edge starts its bin
    counts = np.array([1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 1000])
    cb = cell_parts(cell_of(np.zeros(12), counts, counts))[1]
    assert cb.tolist() == [0, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]
    # purity edges are inclusive and exact: 17/20 is 0.85 (bin 4), 84/100 below it (bin 3)
    cases = [(2, 10, 0), (3, 10, 1), (1, 2, 2), (69, 100, 2), (7, 10, 3), (84, 100, 3), (17, 20, 4),
             (94, 100, 4), (19, 20, 5), (1, 1, 5)]
    for top, count, pb in cases:
        assert cell_parts(cell_of([1], [count], [top]))[2][0] == pb, (top, count)
    assert cell_of([-1, 2], [5, 5], [5, 5]).tolist() == [-1, 2 * 42 + 3 * 6 + 5]
    # the Numba kernel and the array function agree everywhere with the design's bins, as the
    # reference states them on its own (hints.index.reference.reference_cell)
    for d in range(3):
        for count in range(1, 70):
            for top in range(1, count + 1):
                assert cell_one(d, count, top) == cell_of([d], [count], [top])[0] == reference_cell(d, count, top)
    assert len(CELL_COUNT_EDGES) + 1 == 7 and N_CELL_PURITY_BINS == 6


# ---- the boundary rule ----------------------------------------------------------------------------

def test_reach_restarts_at_bos_and_segments():
    t = np.array([5, 6, BOS, 7, 8, 9, 1, 2], np.uint16)
    assert reach(t).tolist() == [1, 2, 1, 2, 3, 4, 5, 6]  # the BOS starts its n-grams
    assert reach(t, boundary=None).tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert reach(t, segment=3).tolist() == [1, 2, 1, 1, 2, 3, 1, 2]
    assert reach(t, limit=3).tolist() == [1, 2, 1, 2, 3, 3, 3, 3]


def spans_a_boundary(tokens, t, L):
    """The design's rule in its own words (docs/design.md, "Document boundaries"), not through
    hints.cells.reach: the n-gram tokens[t-L+1..t] is cut when it starts before the array (a
    segment's start) or holds a BOS after its first token (a BOS may start an n-gram, never sit
    inside one)."""
    return t - L + 1 < 0 or BOS in tokens[t - L + 2:t + 1].tolist()


def boundary_cuts(tokens):
    """(K, n) bool: spans_a_boundary for every length and position."""
    return np.array([[spans_a_boundary(tokens, t, L) for t in range(len(tokens))] for L in LENGTHS])


def test_mask_hints_cuts_ngrams_that_span_a_bos():
    from hints import ReferenceIndex
    query = planted(2, 800)
    train = np.concatenate([planted(1, 3000), query])  # so n-grams that span a BOS recur
    h = ReferenceIndex(LENGTHS).add(train).lookup(query)
    m = mask_hints(h, query, BOS, LENGTHS)
    cuts = boundary_cuts(query)
    for k, L in enumerate(LENGTHS):
        cut = cuts[k]
        assert (m.token[k][cut] == -1).all() and (m.kind[k][cut] == -1).all() and (m.count[k][cut] == 0).all()
        assert np.array_equal(m.token[k][~cut], h.token[k][~cut])
        assert (h.token[k][cut] >= 0).any(), "no hint spanned a BOS: the test would not see the rule"
        # ...and an n-gram that starts at a BOS (one token short of being cut) keeps its hint
        starts_at_bos = np.array([t - L + 1 >= 0 and query[t - L + 1] == BOS for t in range(len(query))])
        assert (m.token[k][starts_at_bos] >= 0).any()


# ---- the reference, on hand-made streams ------------------------------------------------------------

def ref(stream, query, **kw):
    kw.setdefault("lengths", (2, 3, 4))
    return reference_cells(stream, query, **kw)


def test_reference_depth_count_and_followers():
    s = [1, 2, 3, 4, 9, 2, 3, 4, 8, 7, 3, 4, 8, 0]
    c = ref(s, [5, 2, 3, 4], max_followers=2)
    # at [2, 3, 4]: the 2-gram (3, 4) occurs 3 times; two of them match 3 deep ((2, 3, 4)), none 4
    assert c.depth.tolist() == [-1, -1, 0, 1] and c.count.tolist() == [0, 0, 2, 2]
    assert c.followers[3].tolist() == [8, 9] and c.follower_counts[3].tolist() == [1, 1]  # tie: smaller id first
    assert c.followers[2].tolist() == [4, -1] and c.follower_counts[2].tolist() == [2, 0]


def test_reference_position_filter_and_step_zero():
    s = [1, 2, 7, 1, 2, 8, 1, 2]
    q = [1, 2]
    # occurrence j counts iff its follower s[j + 1] lies before `before`
    assert ref(s, q, before=3).count[1] == 1 and ref(s, q, before=2).count[1] == 0
    assert ref(s, q, before=6).count[1] == 2 and ref(s, q, before=5).count[1] == 1
    assert ref(s, q, before=0).depth.tolist() == [-1, -1]  # step 0: nothing before it


def test_reference_cap_keeps_the_most_recent():
    # old occurrences match 4 deep, the recent ones only 2: the cap decides the depth
    s = [5, 6, 1, 2, 7] * 3 + [9, 9, 1, 2, 8] * 2
    q = [5, 6, 1, 2]
    assert ref(s, q).depth[3] == 2 and ref(s, q).count[3] == 3
    c = ref(s, q, cap=2)
    assert c.depth[3] == 0 and c.count[3] == 2 and c.followers[3, 0] == 8
    c3 = ref(s, q, cap=3)  # the third most recent is the last deep one
    assert c3.depth[3] == 2 and c3.count[3] == 1 and c3.followers[3, 0] == 7


def test_reference_bos_restarts():
    s = [4, BOS, 1, 2, 3, 5, 4, 9, 1, 2, 3, 6]
    # the query's 3-gram [BOS, 1, 2] may start with the BOS; (4, BOS, ...) never matches past it
    c = ref(s, [4, BOS, 1, 2, 3])
    assert c.depth[4] == 2 and c.count[4] == 1 and c.followers[4, 0] == 5  # [BOS 1 2 3], not [4 BOS 1 2]
    # [4, BOS, 1, 2] spans the BOS: with restarts the deepest match is [BOS, 1, 2]; without, the 4-gram
    assert ref(s, [4, BOS, 1, 2]).depth[3] == 1 and ref(s, [4, BOS, 1, 2], boundary=None).depth[3] == 2
    assert ref(s, [7, BOS, 1]).depth.tolist() == [-1, -1, 0]  # (7, BOS) spans it; (BOS, 1) starts at it
    # the stream restarts too: with segments of 4, the occurrence of (2, 3) at j = 4 crosses one
    assert ref(s, [2, 3], segment=4).count[1] == 1 and ref(s, [2, 3]).count[1] == 2


# ---- the positional index against the reference --------------------------------------------------

def training_lookups(stream, steps, world, bt, cap, F=2):
    """(index, [(step, rank, tokens, before)]): the record's training layout, one segment per rank slice."""
    G = world * bt
    idx = PositionalIndex.build(stream[:steps * G], segment=bt)
    looks = []
    for s in range(steps):
        for r in range(world):
            a = s * G + r * bt
            looks.append((s, r, stream[a:a + bt], s * G))
    return idx, looks


@pytest.mark.parametrize("cap", [96, 4, None])
def test_positional_equals_reference_on_stdlib(stdlib_stream, cap):
    world, bt, steps = 2, 1500, 6
    idx, looks = training_lookups(stdlib_stream, steps, world, bt, cap)
    deep = 0
    for s, r, tok, before in looks:
        got = idx.lookup_cells(tok, before, cap=cap, max_followers=3)
        want = reference_cells(stdlib_stream[:steps * world * bt], tok, before=before, cap=cap, max_followers=3,
                               segment=bt)
        assert_cells_equal(got, want, f"step {s} rank {r}")
        deep += int((got.depth == 2).sum())
        if s == 0:
            assert (got.depth == -1).all()  # step 0: no hints
    assert deep > 100  # the 20-grams are reached


@pytest.mark.parametrize("dir_bits", [None, 2])
def test_positional_equals_reference_on_planted_streams(dir_bits):
    """Also with a 4-bucket directory: runs are then found by binary search among many keys."""
    for seed in range(3):
        stream = planted(seed, 6000)
        _, looks = training_lookups(stream, 5, 4, 300, cap=8)
        idx = PositionalIndex.build(stream, segment=300, dir_bits=dir_bits)
        for s, r, tok, before in looks:
            for cap in (8, None):
                got = idx.lookup_cells(tok, before, cap=cap, max_followers=2)
                want = reference_cells(stream[:6000], tok, before=before, cap=cap, max_followers=2, segment=300)
                assert_cells_equal(got, want, f"seed {seed} step {s} rank {r} cap {cap}")


def test_each_rule_changes_the_answer_on_this_data(stdlib_stream):
    """The position filter, the cap, BOS and segment restarts all matter on stdlib text, so the
    equality tests above would fail if the index broke any of them."""
    world, bt = 2, 1500
    G = world * bt
    stream = stdlib_stream[:6 * G]
    idx = PositionalIndex.build(stream, segment=bt)
    tok, before = stream[4 * G:4 * G + bt], 4 * G
    base = idx.lookup_cells(tok, before, cap=4)
    assert not same(base, idx.lookup_cells(tok, before + bt, cap=4))     # seeing its own step would differ
    assert not same(base, idx.lookup_cells(tok, before, cap=None))       # no cap would differ
    no_bos = PositionalIndex.build(stream, segment=bt, boundary=None)
    assert not same(base, no_bos.lookup_cells(tok, before, cap=4, boundary=None))
    # the stream's slices restart too: an index without them answers some step differently
    bt = 100
    idx, flat = PositionalIndex.build(stream, segment=bt), PositionalIndex.build(stream, segment=0)
    assert any(not same(idx.lookup_cells(stream[a:a + bt], a), flat.lookup_cells(stream[a:a + bt], a))
               for a in range(bt, len(stream), bt))


def test_causality_the_future_cannot_change_a_lookup(stdlib_stream):
    """A lookup for step s sees only tokens before it: replacing every token from step s on (the
    step's own tokens included) leaves its cells unchanged. Fails if a lookup can see its own step."""
    world, bt, steps = 2, 1000, 6
    G = world * bt
    stream = stdlib_stream[:steps * G].copy()
    idx = PositionalIndex.build(stream, segment=bt)
    rng = np.random.default_rng(0)
    for s in (1, 3, 5):
        other = stream.copy()
        other[s * G:] = stream[rng.permutation(np.arange(s * G, steps * G)) % (steps * G)]
        other_idx = PositionalIndex.build(other, segment=bt)
        for r in range(world):
            tok = stream[s * G + r * bt:s * G + (r + 1) * bt]
            assert_cells_equal(idx.lookup_cells(tok, s * G), other_idx.lookup_cells(tok, s * G), f"step {s}")
        # ...while a lookup allowed to see step s does change
        assert not same(idx.lookup_cells(tok, (s + 1) * G), other_idx.lookup_cells(tok, (s + 1) * G))


def test_save_load_map_and_phases(tmp_path, stdlib_stream):
    world, bt, steps = 2, 1000, 8
    G = world * bt
    stream = stdlib_stream[:steps * G]
    ends = phase_ends(steps, G, phases=(2, 5))
    assert ends == [2 * G, 5 * G, 8 * G]
    paths = build_phases(stream, ends, tmp_path, segment=bt)
    full = PositionalIndex.build(stream, segment=bt)
    for s in range(steps):
        idx = load_covering(tmp_path, s * G, timeout=0)
        assert idx.tokens == min(e for e in ends if e >= s * G)
        assert not idx.table.flags.writeable
        tok = stream[s * G:s * G + bt]
        assert_cells_equal(idx.lookup_cells(tok, s * G), full.lookup_cells(tok, s * G), f"step {s}")
    with pytest.raises(ValueError, match="holds only"):
        PositionalIndex.load(paths[0]).lookup_cells(stream[:10], 3 * G)
    with pytest.raises(TimeoutError):
        load_covering(tmp_path, 9 * G, timeout=0)
    # another process maps the same file and gets the same cells
    code = ("import sys, numpy as np; from hints.positional import PositionalIndex as P; "
            f"i = P.load(sys.argv[1]); c = i.lookup_cells(np.load(sys.argv[2]), {3 * G}); "
            "print(int(c.count.sum()), int(c.followers.sum()))")
    np.save(tmp_path / "q.npy", stream[3 * G:3 * G + bt])
    out = subprocess.run([sys.executable, "-c", code, paths[1], str(tmp_path / "q.npy")], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.getcwd()), check=True).stdout.split()
    c = full.lookup_cells(stream[3 * G:3 * G + bt], 3 * G)
    assert [int(x) for x in out] == [int(c.count.sum()), int(c.followers.sum())]


def test_bad_inputs(tmp_path):
    idx = PositionalIndex.build(planted(0, 500))
    with pytest.raises(ValueError, match="before"):
        idx.lookup_cells([1, 2, 3], -1)
    with pytest.raises(ValueError, match="cap"):
        idx.lookup_cells([1, 2, 3], 10, cap=0)
    with pytest.raises(ValueError, match="max_followers"):
        idx.lookup_cells([1, 2, 3], 10, max_followers=0)
    with pytest.raises(ValueError, match="boundary"):
        idx.lookup_cells([1, 2, 3], 10, boundary=None)
    with pytest.raises(ValueError, match="tokens"):
        idx.lookup_cells(np.zeros((2, 2), np.int64), 10)
    bad = tmp_path / "x.idx"
    bad.write_bytes(b"nope" * 100)
    with pytest.raises(ValueError, match="not a positional"):
        PositionalIndex.load(bad)


# ---- the background index and the exact path -------------------------------------------------------

def test_hint_index_cells_equal_the_reference(stdlib_stream, tmp_path):
    """HintIndex.lookup_cells (growing, then sealed) and exact_cells equal the reference with no
    position filter and no cap, where nothing was dropped or collided."""
    from hints import Geometry, HintIndex, ReferenceIndex
    from hints.positional import exact_cells
    train, query = stdlib_stream[:25000], stdlib_stream[21000:]  # a third seen in training, the rest not
    idx = HintIndex(Geometry(partition_bits=8, bucket_bits=8, slots=64))  # many partitions: rare collisions
    idx.add(train)
    assert idx.dropped == 0
    # positions where a checksum collided: the per-length lookup differs from exact counting
    h, exact = idx.lookup(query), ReferenceIndex(LENGTHS).add(train).lookup(query)
    ok = (h.count == exact.count).all(0) & (h.token == exact.token).all(0)
    assert ok.mean() > 0.999
    want = reference_cells(train, query, max_followers=8)
    assert (want.depth == 2).sum() > 50 and (want.followers[:, 1] >= 0).sum() > 50  # deep and mixed followers
    pick = lambda c: Cells(*(a[ok] for a in c))
    assert_cells_equal(pick(idx.lookup_cells(query, max_followers=8)), pick(want), "growing")
    assert_cells_equal(exact_cells(query, train, max_followers=8), want, "exact")
    idx.seal()
    assert_cells_equal(pick(idx.lookup_cells(query, max_followers=8)), pick(want), "sealed")
    idx.save(tmp_path / "bg.idx")
    mapped = HintIndex.load(tmp_path / "bg.idx", mmap=True, workers=3)  # cells split over 3 workers
    assert_cells_equal(pick(mapped.lookup_cells(query, max_followers=8)), pick(want), "sealed, saved and mapped")
    # the boundary rule matters here: without BOS restarts the answer differs
    assert not same(idx.lookup_cells(query, boundary=None), idx.lookup_cells(query))
    # the deepest length's count is the per-length lookup's count there
    got = idx.lookup_cells(query, max_followers=1)
    hit = got.depth >= 0
    assert np.array_equal(got.count[hit], h.count[got.depth[hit].astype(int), np.flatnonzero(hit)])


def test_stats_apply_and_name_the_boundary_rule():
    """hint_stats restarts n-grams at BOS across its lookup chunks, counts the hints of a
    whole-stream lookup that the boundary rule keeps, and says which rule it used."""
    from hints import Geometry, HintIndex
    from hints.bench import format_stats, hint_stats
    stream = planted(5, 12000, bos_every=60)
    idx = HintIndex(Geometry(6, 10, 64))
    idx.add(stream[:8000])
    val = stream[7000:]
    h = idx.lookup(val)  # unmasked; the cut comes from the rule as the design states it
    kept = (h.token >= 0) & ~boundary_cuts(val)
    right = kept[:, :-1] & (h.token[:, :-1] == val[1:].astype(np.int32)[None])
    for chunk in (777, 1 << 20):
        st = hint_stats(idx, val, chunk=chunk)
        assert st["covered"] == kept[:, :-1].sum(1).tolist()
        assert st["correct"] == right.sum(1).tolist()
    assert "restart at every BOS" in format_stats(st)
    off = hint_stats(idx, val, boundary=None)
    assert off["covered"] != st["covered"] and "none" in format_stats(off)


def test_positional_bench_runs_at_a_small_shape(tmp_path, stdlib_stream):
    """`python -m hints positional-bench` end to end on a small shape: both paths timed, phases built."""
    import json
    from hints.cli import main
    np.save(tmp_path / "t.npy", stdlib_stream)
    out = tmp_path / "b.json"
    assert main(["positional-bench", "--tokens", str(tmp_path / "t.npy"), "--rank-tokens", "512", "--world", "4",
                 "--prefill", "10000", "--steps", "3", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert len(res["new_cpu_ms"]) == len(res["old_cpu_ms"]) == 3 and res["phases"][-1]["tokens"] == 17 * 2048
    assert main(["positional-bench", "--tokens", str(tmp_path / "t.npy"), "--rank-tokens", "4096", "--world", "8",
                 "--steps", "3"]) == 2  # too short a stream: a one-line error


def test_build_bytes_do_not_depend_on_threads(stdlib_stream):
    import numba
    n = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = PositionalIndex.build(stdlib_stream, segment=700)
        numba.set_num_threads(max(2, n) if numba.config.NUMBA_NUM_THREADS >= 2 else 1)
        many = PositionalIndex.build(stdlib_stream, segment=700)
    finally:
        numba.set_num_threads(n)
    assert np.array_equal(one.table, many.table) and np.array_equal(one.directory, many.directory)
    pos = (one.table[:, 1] & np.uint64(0xFFFFFFFF)).astype(np.int64)
    top = one.table[:, 0] >> np.uint64(64 - 42)
    same_run = top[1:] == top[:-1]
    assert (np.diff(top.astype(np.float64)) >= 0).all() and (pos[1:][same_run] > pos[:-1][same_run]).all()
