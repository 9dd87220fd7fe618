"""The index's n-gram hashing collides no more often on real text than an ideal random function.

A slot's length-k key is the partition and the checksums of lengths 0..k (hints/index/geometry.py).
Two different n-grams of length k that get the same key are merged by a lookup: that is a collision.
On real text (Python's standard-library source, GPT-2 tokens) we count, for every length, the
distinct n-grams and the distinct keys the Numba kernels give them; the difference is the number
of n-grams lost to collisions. An ideal function is the same key layout filled from independent
random 64-bit values, one per distinct n-gram and length (a random function, exactly, on the
n-grams that occur); its collisions are counted over several draws. The index's hashing must not
collide significantly more often than the ideal draws do.
"""
import os

import numpy as np
import pytest

from hints.index import Geometry
from hints.index.hashing import HASH_SCRATCH, hash_arrays
from hints.index.lookup import hash_positions

STDLIB_FILES = ("typing.py", "argparse.py", "inspect.py", "subprocess.py", "pathlib.py", "functools.py",
                "dataclasses.py", "enum.py", "logging/__init__.py", "unittest/case.py", "tarfile.py")
IDEAL_DRAWS = 16


@pytest.fixture(scope="module")
def text():
    from data.tokenizer import gpt2
    enc = gpt2()
    out = []
    for name in STDLIB_FILES:
        with open(os.path.join(os.path.dirname(os.__file__), name), encoding="utf-8") as f:
            out += enc.encode(f.read(), allowed_special="all")
    return np.array(out, dtype=np.uint16)


def index_keys(geom, s):
    """(partition, slot key without the token) of positions j = longest length .. len(s), as the
    build and the lookups compute them."""
    lengths, pows, bits, shifts = hash_arrays(geom)
    j0 = lengths[-1]
    n = s.size - j0 + 1
    keys, parts = np.zeros(n, np.uint64), np.zeros(n, np.uint64)
    prefix = np.zeros(HASH_SCRATCH, np.uint64)
    r = np.zeros(lengths.size, np.uint64)
    hash_positions(s, j0, n, r, lengths, pows, geom.partition_bits, bits, shifts, prefix, keys, parts)
    return parts, keys


def ngram_ids(s, L, j0):
    """An id per distinct n-gram s[j-L:j] for j = j0 .. len(s) (equal ids: equal n-grams)."""
    win = np.lib.stride_tricks.sliding_window_view(s, L)[j0 - L:]
    rows = np.ascontiguousarray(win).view(np.dtype((np.void, 2 * L))).ravel()
    return np.unique(rows, return_inverse=True)[1].ravel()


def length_keys(geom, parts, keys):
    """Per length k, one uint64 per position: the partition and the checksums of lengths 0..k."""
    out = []
    for k, shift in enumerate(geom.key_shifts):
        out.append((parts << np.uint64(64 - shift)) | (keys >> np.uint64(shift)))
    return out


def ideal_keys(geom, ids, rng):
    """The key layout of `length_keys`, each length's hash an independent random value per
    distinct n-gram; a longer length's checksum is never 0 (0 means absent), as in the index."""
    P, bits, shifts = geom.partition_bits, geom.checksum_bits, geom.key_shifts
    h = [rng.integers(0, 2**64, size=int(i.max()) + 1, dtype=np.uint64)[i] for i in ids]
    part = h[0] >> np.uint64(64 - P) if P else np.zeros_like(h[0])
    key = ((h[0] >> np.uint64(64 - P - bits[0])) & np.uint64((1 << bits[0]) - 1)) << np.uint64(shifts[0])
    for k in range(1, len(bits)):
        c = h[k] & np.uint64((1 << bits[k]) - 1)
        c += (c == 0).astype(np.uint64)
        key |= c << np.uint64(shifts[k])
    return part, key


def collisions(keys_by_length, ids):
    """Per length: distinct n-grams minus distinct keys (n-grams merged with another)."""
    return [int(i.max()) + 1 - np.unique(k).size for k, i in zip(keys_by_length, ids)]


@pytest.mark.parametrize("partition_bits", [0, 6])
def test_collisions_on_real_text_match_an_ideal_function(text, partition_bits):
    geom = Geometry(partition_bits=partition_bits, bucket_bits=10, slots=16)
    j0 = geom.lengths[-1]
    ids = [ngram_ids(text, L, j0) for L in geom.lengths]
    ours = collisions(length_keys(geom, *index_keys(geom, text)), ids)
    rng = np.random.default_rng(0)
    ideal = np.array([collisions(length_keys(geom, *ideal_keys(geom, ids, rng)), ids) for _ in range(IDEAL_DRAWS)])
    mean, sd = ideal.mean(axis=0), ideal.std(axis=0)
    # at most the ideal draws' mean + 5 of their standard deviations (+ 3 where they collide
    # rarely). Most collisions of a longer length come from the many extensions of a frequent
    # shorter n-gram (an indentation run), so the draws spread far less than a Poisson count:
    # with the longer lengths' checksums taken from the low bits of their hash (which depend
    # only on the tokens' low bits), L=20 gave +9 of their deviations and failed here
    allowed = mean + 5 * sd + 3
    distinct = [int(i.max()) + 1 for i in ids]
    msg = ", ".join(f"L={L}: {o} of {d:,} distinct n-grams (ideal {m:.1f} +- {v:.1f})"
                    for L, o, d, m, v in zip(geom.lengths, ours, distinct, mean, sd))
    assert all(o <= a for o, a in zip(ours, allowed)), msg
    # the corpus is large enough that every length's longer checksum collides in the ideal draws:
    # the test can tell a weak hash from a good one
    assert mean[1:].min() >= 5, msg
