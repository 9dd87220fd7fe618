"""llama.cpp's drafting rule: the Numba form (hints/draft/llama.py) equals the plain-Python statement
(hints/draft/reference.py) on standard-library text and on planted streams (ties, short
sequences, every threshold at its exact edge, the static weight); the static cache's file
round trip; `python -m hints draft-stats`; the hints policy's index picks equal the index's
own lookups."""
import itertools
import json
import math
import os

import numpy as np
import pytest

from data.manifest import write_manifest
from data.shards import write_shard
from hints import Geometry, HintIndex
from hints import draft as D
from hints.draft import caches as C
from hints.draft import from_hints as H
from hints.draft import reference as R
from hints.cli import main as hints_main


def stdlib_tokens(names, limit):
    from data.tokenizer import gpt2
    enc = gpt2()
    out = []
    for name in names:
        with open(os.path.join(os.path.dirname(os.__file__), name), encoding="utf-8") as f:
            out += enc.encode(f.read(), allowed_special="all")
    return np.array(out[:limit], dtype=np.int64)


@pytest.fixture(scope="module")
def text():
    return stdlib_tokens(["argparse.py", "functools.py"], 12_000)


@pytest.fixture(scope="module")
def static_text():
    return stdlib_tokens(["typing.py", "dataclasses.py", "inspect.py"], 60_000)


@pytest.mark.parametrize("n_ctx, n_draft, with_static", [(1024, 16, False), (1024, 16, True), (777, 5, True)])
def test_replay_equals_reference_on_stdlib_text(text, static_text, n_ctx, n_draft, with_static):
    st = static_text if with_static else None
    fast = D.replay(text, n_ctx, n_draft, D.build_static(st) if with_static else None)
    ref = R.replay(text, n_ctx, n_draft, st)
    assert (fast["n_drafted"], fast["n_accept"], fast["n_chunks"]) == ref
    assert ref[1] > 0 and ref[0] > ref[1]  # drafts happen, some are right, some wrong


def drafts_both(history, seq, static_tokens=None, n_draft=8):
    """(fast, reference) drafts after seq, with a dynamic cache of `history` and a static one."""
    dyn = C.add_sequence(C.new_cache(), np.asarray(history, np.int64), len(history)) if len(history) else C.new_cache()
    st = D.build_static(np.asarray(static_tokens)) if static_tokens is not None else None
    fast = D.LlamaDrafter(static=st, dynamic=dyn).draft(np.asarray(seq, np.int64), n_draft).tolist()
    ref_dyn = {}
    R.count_ngrams(ref_dyn, list(history), range(1, 5))
    ctx = {}
    R.count_ngrams(ctx, list(seq), range(1, 5))
    ref = R.draft(list(seq), n_draft, ctx, ref_dyn, R.static_cache(static_tokens) if static_tokens is not None else {})
    return fast, ref


def test_every_prefix_of_planted_streams_drafts_as_the_reference():
    rng = np.random.default_rng(0)
    for trial in range(6):
        phrases = [rng.integers(0, 12, rng.integers(2, 7)) for _ in range(8)]
        stream = np.concatenate([phrases[i] for i in rng.integers(0, 8, 60)])
        history = np.concatenate([phrases[i] for i in rng.integers(0, 8, 40)])
        static = np.concatenate([phrases[i] for i in rng.integers(0, 8, 80)])
        dyn = C.add_sequence(C.new_cache(), history.astype(np.int64), history.size)
        drafter = D.LlamaDrafter(static=D.build_static(static) if trial % 2 else None, dynamic=dyn)
        ref_dyn = {}
        R.count_ngrams(ref_dyn, history.tolist(), range(1, 5))
        ref_static = R.static_cache(static) if trial % 2 else {}
        for m in range(0, min(stream.size, 150)):  # each call extends the last: the context cache grows
            ctx = {}
            R.count_ngrams(ctx, stream[:m].tolist(), range(1, 5))
            assert drafter.draft(stream[:m], 6).tolist() == R.draft(stream[:m].tolist(), 6, ctx, ref_dyn, ref_static)


def test_ties_go_to_the_lowest_id():
    # (5, 9) was followed by 3, then by 2: a tie at length 2 (50%), drafted as 2
    fast, ref = drafts_both([], [5, 9, 3, 5, 9, 2, 5, 9])
    assert fast == ref and fast[0] == 2
    # the static fallback: (4, 4) followed by 6 and 5 once each: total 2, 50%, tie -> 5
    fast, ref = drafts_both([], [4, 4], static_tokens=[4, 4, 6, 1, 4, 4, 5])
    assert fast == ref and fast[:1] == [5]


def test_short_sequences():
    history = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4]
    fast, ref = drafts_both(history, [1])  # shorter than 2: no draft, whatever the caches hold
    assert fast == ref == []
    fast, ref = drafts_both(history, [])
    assert fast == ref == []
    fast, ref = drafts_both(history, [1, 2])  # lengths 3 and 4 are absent; 2 and 1 draft from the dynamic cache
    assert fast == ref and fast[:2] == [3, 4]


PICK = 100   # the follower a threshold case is about; the others have higher ids and at most its count
OTHER = 99   # what the n-gram one shorter is followed by elsewhere: a draft that fell through to it
SEP = 1000   # before the query; the occurrences are each after a fresh token above it: no longer match


def followers(top, total):
    """{PICK: top} and other followers (PICK + 1, ...) of at most `top` each, `total` in all: PICK is
    the pick (the most frequent, ties to the lowest id)."""
    out, rest, y = {PICK: top}, total - top, PICK + 1
    while rest > 0:
        out[y] = min(top, rest)
        rest -= out[y]
        y += 1
    return out


def exactly_at(percent, min_total):
    """(top, total) with 100 x top == percent x total exactly, total >= min_total."""
    g = math.gcd(100, percent)
    k = -(-min_total // (100 // g))
    return percent // g * k, 100 // g * k


def edge_cases():
    """For each cache (context: lax, dynamic: strict), n-gram length and threshold, as llama.cpp sets
    them (hints/draft/reference.py): a count exactly at it (drafts) and one just below it (does not):
    a total of min and min - 1 (where min - 1 >= 1: no n-gram has a total of 0), a pick at exactly
    percent and at exactly percent - 1 of its total. A threshold one higher fails the first, one
    lower the second."""
    cases = []
    for cache, min_total, min_percent in (("context", R.CONTEXT_MIN_TOTAL, R.CONTEXT_MIN_PERCENT),
                                          ("dynamic", R.DYNAMIC_MIN_TOTAL, R.DYNAMIC_MIN_PERCENT)):
        for length in range(R.NGRAM_MIN, R.NGRAM_MAX + 1):
            t, p = min_total[length], min_percent[length]
            cases.append(pytest.param(cache, length, {PICK: t}, True, id=f"{cache}-{length}-total-{t}"))
            if t > 1:
                cases.append(pytest.param(cache, length, {PICK: t - 1}, False, id=f"{cache}-{length}-total-{t - 1}"))
            for q, drafts in ((p, True), (p - 1, False)):
                top, total = exactly_at(q, t)
                cases.append(pytest.param(cache, length, followers(top, total), drafts,
                                          id=f"{cache}-{length}-{top}-of-{total}"))
    return cases


def occurrences(gram, counts, fresh):
    """A stream in which the n-gram `gram` occurs once per count of counts {follower: count}, each
    time after a fresh token (next(fresh)) and followed by that follower."""
    out = []
    for y, c in counts.items():
        for _ in range(c):
            out += [next(fresh), *gram, y]
    return out


@pytest.mark.parametrize("cache, length, counts, drafts", edge_cases())
def test_each_threshold_at_its_edge(cache, length, counts, drafts):
    """The n-gram of `length` that ends the sequence has these followers, in the context cache (the
    sequence itself) or in the dynamic one (an earlier sequence), and no longer n-gram matches. Its
    suffix one shorter occurs elsewhere too, followed by OTHER often enough to be drafted: so the
    pick is drafted at `length`, or the draft falls through to OTHER (nothing at length 1), and a
    threshold moved either way drafts the other one."""
    gram, fresh = list(range(10, 10 + length)), itertools.count(SEP + 1)
    seen = occurrences(gram, counts, fresh)
    if length > 1:
        seen += occurrences(gram[1:], {OTHER: 4 * sum(counts.values()) + 4}, fresh)  # > 80%: passes any threshold
    query = [SEP, *gram]
    fast, ref = drafts_both([], seen + query, n_draft=1) if cache == "context" else drafts_both(seen, query, n_draft=1)
    assert ref == ([PICK] if drafts else [OTHER] if length > 1 else []), "the plain statement of llama.cpp's rule"
    assert fast == ref


def static_cases():
    t, p = R.STATIC_MIN_TOTAL, R.STATIC_MIN_PERCENT
    cases = [pytest.param({PICK: t}, True, id=f"total-{t}"), pytest.param({PICK: t - 1}, False, id=f"total-{t - 1}")]
    for q, drafts in ((p, True), (p - 1, False)):
        top, total = exactly_at(q, t)
        cases.append(pytest.param(followers(top, total), drafts, id=f"{top}-of-{total}"))
    return cases


@pytest.mark.parametrize("counts, drafts", static_cases())
def test_static_threshold_at_its_edges(counts, drafts):
    """The static fallback: the most frequent follower of the last 2 tokens, under the lax
    thresholds of length 2, with no context or dynamic draft."""
    static = []
    for y, c in counts.items():
        static += [4, 4, y, 9999] * c
    fast, ref = drafts_both([], [4, 4], static_tokens=static, n_draft=1)
    assert ref == ([PICK] if drafts else [])
    assert fast == ref


@pytest.mark.parametrize("weighted_lower, expect", [(True, []), (False, [PICK])])
def test_static_weight_at_a_tie(weighted_lower, expect):
    """(10, 11) was followed 100 times by a and once by b, and b follows (10, 11) once in the static
    cache: b scores 1 x STATIC_WEIGHT x 1 = 100, a tie with a's 100 x 1, which goes to the lower id.
    b lower: b is the pick and its 1% fails, and nothing is drafted (a weight of 99 would draft a);
    a lower: a is drafted (a weight of 101 would make b the pick and draft nothing)."""
    b, a = (PICK - 1, PICK) if weighted_lower else (PICK + 1, PICK)
    assert R.STATIC_WEIGHT == 100  # llama.cpp's
    seen = occurrences([10, 11], {a: R.STATIC_WEIGHT, b: 1}, itertools.count(SEP + 1))
    fast, ref = drafts_both(seen, [SEP, 10, 11], static_tokens=[10, 11, b], n_draft=1)
    assert ref == expect
    assert fast == ref


def test_static_weight_picks_and_the_raw_count_still_decides():
    seq = [7, 1, 4, 7, 1, 4, 7, 1, 4, 7, 1, 8, 7, 1, 8, 6000, 7, 1]  # (7, 1) -> {4: 3, 8: 2}
    fast, ref = drafts_both([], seq, n_draft=1)
    assert fast == ref == [4]                      # no static support: the larger count, 60% >= 50%
    fast, ref = drafts_both([], seq, static_tokens=[7, 1, 8], n_draft=1)
    assert fast == ref == []                       # 8 scores 2 x 100 > 3, but 40% < 50%: rejected at every length
    seq2 = seq[:-2] + [7, 1, 8, 7, 1]              # (7, 1) -> {4: 3, 8: 3}: 8 wins on its weight, 50% passes
    fast, ref = drafts_both([], seq2, static_tokens=[7, 1, 8], n_draft=1)
    assert fast == ref == [8]


def test_static_cache_file_round_trip(tmp_path, static_text):
    st = D.build_static(static_text)
    path = D.save_static(st, str(tmp_path / "s.ngstatic"), static_text.size)
    loaded, n = D.load_static(path)
    assert n == static_text.size
    for a, b in zip(st, loaded):
        np.testing.assert_array_equal(a, b)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 4)
    with pytest.raises(ValueError, match="truncated"):
        D.load_static(path)


def test_draft_stats_cli(tmp_path, text, static_text, capsys):
    write_shard(tmp_path / "text_000000.bin", text.astype(np.uint16))
    write_shard(tmp_path / "static_000000.bin", static_text.astype(np.uint16))
    write_manifest(tmp_path)
    out = tmp_path / "s.json"
    assert hints_main(["draft-stats", "--tokens", str(tmp_path / "text_*.bin"), "--static-tokens",
                       str(tmp_path / "static_*.bin"), "--n-ctx", "1024", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    ref = R.replay(text, 1024, 16, static_text)
    assert (res["n_drafted"], res["n_accept"], res["n_chunks"]) == ref
    assert res["accept_pct"] == pytest.approx(100 * ref[1] / ref[0])
    assert res["static_load_s"] >= 0 and res["static_build_s"] > 0 and res["peak_rss_mib"] > 0
    assert "us per drafted token" in capsys.readouterr().out
    assert hints_main(["draft-stats", "--tokens", str(tmp_path / "text_*.bin"), "--policy", "hints"]) == 2
    assert "give --index" in capsys.readouterr().err


def test_hints_policy_picks_what_the_index_looks_up(text):
    idx = HintIndex(Geometry(0, 8, 176, (6, 10, 20))).add(text[:8000].astype(np.uint16)).seal()
    q = text[6000:7000]
    h = idx.lookup(q.astype(np.uint16))
    ia = H.IndexArgs(idx, q.size)
    for k in range(1, q.size + 1):
        got = H.index_pick(q, k, ia.table, ia.scratch, ia.out, 2, 50)
        want = -1
        for j in range(2, -1, -1):
            c, t, top = h.count[j, k - 1], h.token[j, k - 1], round(float(h.purity[j, k - 1]) * h.count[j, k - 1])
            if c >= 2 and 100 * top >= 50 * c:
                want = t
                break
        assert got == want, k
    res = H.replay_hints(text, 1024, 16, idx)
    assert res["n_chunks"] == 11 and 0 < res["n_accept"] < res["n_drafted"]
