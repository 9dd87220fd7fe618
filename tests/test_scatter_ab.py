"""scripts/scatter_ab.py: every variant of stage 1's scatter stages each partition's slots in order,
a line at a time, as a plain-Python statement of the scatter says."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("scatter_ab", REPO / "scripts" / "scatter_ab.py")
scatter_ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(scatter_ab)


def staged_by_hand(parts, slots, n_partitions):
    """The staging blocks after the scatter: partition p's slots in stream order, whole lines of 8
    only (a partial line stays in its burst), from its first block on."""
    arena = np.zeros((n_partitions * scatter_ab.BLOCKS_A_PARTITION, scatter_ab.BLOCK), np.uint64)
    for p in range(n_partitions):
        mine = [int(s) for q, s in zip(parts, slots) if q == p]
        mine = mine[:len(mine) // 8 * 8]
        assert len(mine) <= scatter_ab.BLOCK * scatter_ab.BLOCKS_A_PARTITION  # no block is written twice
        for o, s in enumerate(mine):
            arena[p * scatter_ab.BLOCKS_A_PARTITION + o // scatter_ab.BLOCK, o % scatter_ab.BLOCK] = s
    return arena


@pytest.mark.parametrize("variant", [v for v in scatter_ab.VARIANTS if v != "floor"])
def test_every_variant_stages_what_the_plain_statement_does(variant):
    rng = np.random.default_rng(3)
    n_partitions = 37
    parts = rng.integers(0, n_partitions, 20_000).astype(np.int64)
    slots = rng.integers(0, 1 << 62, parts.size).astype(np.uint64)
    _, arena = scatter_ab.run(variant, parts, slots, n_partitions, chunk=64, ahead=16)
    assert np.array_equal(arena, staged_by_hand(parts, slots, n_partitions))


def test_compare_times_every_variant():
    lines = []
    times = scatter_ab.compare(16, 50_000, 2, 64, 16, lines.append)
    assert set(times) == set(scatter_ab.VARIANTS) and all(len(t) == 2 and min(t) > 0 for t in times.values())
    assert lines[0].startswith("16 partitions") and len(lines) == 1 + len(scatter_ab.VARIANTS)
