"""The scaling ladder and hint statistics: incremental sizes are exact prefixes, statistics
agree with a direct count, and every output file is written."""
import os

import numpy as np
import pytest

from data.manifest import write_manifest
from data.shards import write_shard
from hints import Geometry, HintIndex, ReferenceIndex
from hints.kinds import kind_parts
from hints.bench import format_stats, hint_stats, ladder_sizes, run_ladder
from hints.bench.scaling import scaling_rows, write_scaling

GEOM = Geometry(6, 10, 64)


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(1)
    toks = rng.integers(0, 12, size=40_000).astype(np.uint16)
    write_shard(tmp_path / "train_000000.bin", toks[:15_000])
    write_shard(tmp_path / "train_000001.bin", toks[15_000:])
    write_manifest(tmp_path)  # the set, recorded as its writer would (data/manifest.py)
    # half a passage seen in training (long hints, mostly right), half fresh text
    val = np.concatenate([toks[5_000:7_500], rng.integers(0, 12, size=2_500).astype(np.uint16)])
    return str(tmp_path / "train_*.bin"), toks, val


def test_ladder_sizes():
    assert ladder_sizes(37_000_000_000)[:3] == [75_000_000, 150_000_000, 300_000_000]
    assert ladder_sizes(37_000_000_000)[-1] == 37_000_000_000
    assert ladder_sizes(1000, 300) == [300, 600, 1000]
    assert ladder_sizes(300, 300) == [300]
    with pytest.raises(ValueError):
        ladder_sizes(100, 0)


def test_each_size_sees_exactly_its_prefix(corpus):
    pattern, toks, val = corpus
    sizes = ladder_sizes(40_000, 4_000)
    seen = []

    def check(idx, n):
        fresh = HintIndex(GEOM).add(toks[:n])
        assert idx.tokens_added == n
        assert np.array_equal(idx.fill, fresh.fill) and np.array_equal(idx.table, fresh.table)
        seen.append(n)
        return n

    assert run_ladder(pattern, sizes, check, geometry=GEOM, workers=2) == sizes
    assert seen == [4_000, 8_000, 16_000, 32_000, 40_000]
    with pytest.raises(ValueError, match="exceeds"):
        run_ladder(pattern, [50_000], check, geometry=GEOM)


def test_stats_agree_with_direct_count(corpus):
    _, toks, val = corpus
    idx = HintIndex(GEOM).add(toks)
    assert idx.dropped == 0
    st = hint_stats(idx, val, chunk=777)  # chunk boundaries must not change anything
    ref = ReferenceIndex(GEOM.lengths).add(toks).lookup(val[:-1])
    nxt = val[1:].astype(np.int32)
    has = ref.token >= 0
    right = has & (ref.token == nxt)
    assert st["positions"] == val.size - 1
    assert st["covered"] == has.sum(axis=1).tolist()
    assert st["correct"] == right.sum(axis=1).tolist()
    assert min(st["correct"]) > 1000  # the seen passage: every length hints, and is scored against the next token
    kc = np.bincount(ref.kind[has], minlength=len(st["kind_covered"]))
    kr = np.bincount(ref.kind[right], minlength=len(st["kind_correct"]))
    assert st["kind_covered"] == kc.tolist() and st["kind_correct"] == kr.tolist()
    # kinds of each length sum to that length's coverage
    li, _, _ = kind_parts(np.arange(len(kc)))
    assert [int(kc[li == k].sum()) for k in range(3)] == st["covered"]
    text = format_stats(st)
    assert "coverage" in text and "accuracy" in text


def test_write_scaling_outputs(corpus, tmp_path):
    pattern, toks, val = corpus
    stats = run_ladder(pattern, [10_000, 40_000], lambda idx, n: (n, hint_stats(idx, val)), geometry=GEOM)
    rows = scaling_rows(stats)
    out = tmp_path / "out"
    table = write_scaling(rows, str(out))
    for f in ("scaling.md", "scaling.json", "scaling.csv", "scaling.png", "scaling_buckets.png"):
        assert os.path.getsize(out / f) > 0, f
    assert "10k" in table and "40k" in table
    cov = {(r["hint_tokens"], r["length"]): r["coverage"] for r in rows if r["by"] == "all"}
    assert all(cov[(40_000, L)] >= cov[(10_000, L)] for L in GEOM.lengths)  # more corpus, more hints
