"""llama.cpp's static n-gram cache (the bigrams of a fixed corpus with their followers' counts),
immutable: a table of (key, offset << 24 | n, total << 32 | max) and one contiguous run of
followers, written as one file and loaded as one buffer whose views are the arrays (no rebuild).
"""
import os

import numba
import numpy as np

from ..tokens import MAX_TOKEN
from .caches import HASH_MULT, NGRAM_STATIC

U64 = np.uint64
OFF_SHIFT = U64(24)                  # static value: follower offset << 24 | follower count (the article's 40/24 split)
N_MASK = U64((1 << 24) - 1)
STATIC_MAGIC = b"NGSTATIC"
STATIC_VERSION = 1
STATIC_HEADER_WORDS = 8  # magic, version, table bits, n-grams, followers, tokens, 2 spare (uint64 each)


# ---- the static cache ------------------------------------------------------------------------
# A tuple: (t_key uint64[2^bits] (the bigram a << 16 | b), t_val uint64 (0: empty slot; else
# offset << 24 | n), t_tm uint64 (total << 32 | largest count), f_tok int32, f_cnt int32).

@numba.njit(cache=True, inline="always")
def static_home(key, mask):
    return np.int64((key * HASH_MULT) >> U64(32)) & mask  # tables of up to 2^32 slots


@numba.njit(cache=True)
def static_find(st, key):
    """(offset, n, total, largest count) of a bigram's followers in the static cache; n = 0 when absent."""
    t_key, t_val, t_tm = st[0], st[1], st[2]
    mask = t_key.shape[0] - 1
    h = static_home(key, mask)
    while t_val[h] != U64(0):
        if t_key[h] == key:
            v, tm = t_val[h], t_tm[h]
            return np.int64(v >> OFF_SHIFT), np.int64(v & N_MASK), np.int64(tm >> U64(32)), np.int64(tm & U64(0xFFFFFFFF))
        h = (h + 1) & mask
    return np.int64(0), np.int64(0), np.int64(0), np.int64(0)


@numba.njit(cache=True)
def _fill_static(keys, starts, ends, totals, maxes, bits, t_key, t_val, t_tm):
    mask = (np.int64(1) << bits) - 1
    for g in range(keys.shape[0]):
        h = static_home(keys[g], mask)
        while t_val[h] != U64(0):
            h = (h + 1) & mask
        t_key[h] = keys[g]
        t_val[h] = (U64(starts[g]) << OFF_SHIFT) | U64(ends[g] - starts[g])
        t_tm[h] = (U64(totals[g]) << U64(32)) | U64(maxes[g])


def empty_static():
    """A static cache with no n-grams (the replay without --static-tokens)."""
    return (np.zeros(1, np.uint64), np.zeros(1, np.uint64), np.zeros(1, np.uint64), np.zeros(0, np.int32),
            np.zeros(0, np.int32))


def build_static(tokens):
    """The static cache of a token stream: every bigram (a, b) with its followers' counts
    (llama-lookup-create: common_ngram_cache_update at length LLAMA_NGRAM_STATIC over the corpus)."""
    s = np.asarray(tokens).astype(np.uint64)
    if s.size < NGRAM_STATIC + 1:
        return empty_static()
    triples = np.sort((s[:-2] << U64(32)) | (s[1:-1] << U64(16)) | s[2:])
    new = np.flatnonzero(np.r_[True, triples[1:] != triples[:-1]])
    uniq, counts = triples[new], np.diff(np.r_[new, triples.size])
    bigram = uniq >> U64(16)
    starts = np.flatnonzero(np.r_[True, bigram[1:] != bigram[:-1]])
    ends = np.r_[starts[1:], uniq.size]
    totals = np.add.reduceat(counts, starts)
    maxes = np.maximum.reduceat(counts, starts)
    bits = max(1, int(np.ceil(np.log2(2 * starts.size))))
    t_key, t_val, t_tm = np.zeros(1 << bits, np.uint64), np.zeros(1 << bits, np.uint64), np.zeros(1 << bits, np.uint64)
    _fill_static(bigram[starts], starts, ends, totals, maxes, bits, t_key, t_val, t_tm)
    return (t_key, t_val, t_tm, (uniq & U64(MAX_TOKEN)).astype(np.int32), counts.astype(np.int32))


def save_static(st, path, n_tokens):
    """Write a static cache as one file: a header of STATIC_HEADER_WORDS words, then its arrays."""
    t_key, t_val, t_tm, f_tok, f_cnt = st
    header = np.zeros(STATIC_HEADER_WORDS, np.uint64)
    header[0] = np.frombuffer(STATIC_MAGIC, np.uint64)[0]
    header[1:6] = [STATIC_VERSION, t_key.size.bit_length() - 1, t_key.size, f_tok.size, n_tokens]
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        for a in (header, t_key, t_val, t_tm, f_tok, f_cnt):
            a.tofile(f)
    os.replace(tmp, path)
    return path


def load_static(path):
    """(static cache, tokens it was built from) from save_static's file, read as one buffer:
    the arrays are views of it, nothing is rebuilt."""
    buf = np.fromfile(path, dtype=np.uint8)
    words = STATIC_HEADER_WORDS * 8
    if buf.size < words or bytes(buf[:8]) != STATIC_MAGIC:
        raise ValueError(f"static cache {path}: not a static n-gram cache file (bad magic)")
    header = buf[:words].view(np.uint64)
    version, bits, slots, n_f, n_tokens = (int(x) for x in header[1:6])
    if version != STATIC_VERSION or slots != 1 << bits:
        raise ValueError(f"static cache {path}: version {version} / {slots} slots, expected version "
                         f"{STATIC_VERSION} and a power-of-two table")
    need = words + 3 * 8 * slots + 2 * 4 * n_f
    if buf.size != need:
        raise ValueError(f"static cache {path}: {buf.size:,} bytes, its header says {need:,}; the file is truncated")
    o = words
    t_key = buf[o:o + 8 * slots].view(np.uint64)
    t_val = buf[o + 8 * slots:o + 16 * slots].view(np.uint64)
    t_tm = buf[o + 16 * slots:o + 24 * slots].view(np.uint64)
    o += 24 * slots
    f_tok = buf[o:o + 4 * n_f].view(np.int32)
    f_cnt = buf[o + 4 * n_f:o + 8 * n_f].view(np.int32)
    return (t_key, t_val, t_tm, f_tok, f_cnt), n_tokens


def static_nbytes(st):
    return sum(a.nbytes for a in st)
