"""llama.cpp's mutable n-gram caches (context, dynamic) on fast containers: an n-gram of up to 4
token ids packed into one uint64 key, found in an open-addressing table, its followers one sorted
run of (token, count) in a shared pool, with the follower total and the largest count kept for the
precheck (hints.draft.llama says how the rule uses them).
"""
import numba
import numpy as np

from ..tokens import TOKEN_BITS

U64 = np.uint64

# llama.cpp's common/ngram-cache.h: LLAMA_NGRAM_MIN, LLAMA_NGRAM_MAX, LLAMA_NGRAM_STATIC.
NGRAM_MIN, NGRAM_MAX, NGRAM_STATIC = 1, 4, 2
HASH_MULT = U64(0x9E3779B97F4A7C15)  # Fibonacci hashing (Knuth): multiply, keep the top bits


# ---- the search ------------------------------------------------------------------------------

@numba.njit(cache=True, inline="always")
def lower_bound(a, off, n, y):
    """First index i in [0, n] with a[off + i] >= y, for a[off:off + n] sorted ascending. The
    loop runs ceil(log2 n) times whatever the values: only `base` moves with the comparison."""
    base, length = off, n
    while length > 1:
        half = length >> 1
        base += half * (a[base + half - 1] < y)
        length -= half
    return base - off + (n > 0 and a[base] < y)


@numba.njit(cache=True, inline="always")
def find_count(f_tok, f_cnt, off, n, y):
    """y's count in the sorted follower run (f_tok, f_cnt)[off:off + n], 0 when absent."""
    i = lower_bound(f_tok, off, n, y)
    return f_cnt[off + i] if i < n and f_tok[off + i] == y else 0


# ---- mutable caches (context, dynamic) -------------------------------------------------------
# A cache is a tuple of arrays (Numba passes and returns it whole; growth returns new arrays):
#   meta    int64[3]: entries, pool slots used, slot mask
#   s_key   uint64 [slots]  packed n-gram of each table slot
#   s_len   int64  [slots]  its length (0: empty)
#   s_ent   int64  [slots]  its entry
#   e_off, e_n, e_cap  int64 [entries]: its follower run in the pool, length, capacity
#   e_tot, e_max       int64 [entries]: follower total and largest count (the precheck)
#   f_tok, f_cnt       int64 [pool]: followers, sorted by token within each run

HASH_SHIFT_BITS = 64  # slot index = top bits of key * HASH_MULT (the table has 2^bits slots)


@numba.njit(cache=True, inline="always")
def home(key, length, bits):
    return np.int64(((key + U64(length)) * HASH_MULT) >> U64(HASH_SHIFT_BITS - bits))


def new_cache(slot_bits=10, entries=256, pool=1024):
    """An empty mutable cache with room for `entries` n-grams and `pool` followers (it grows)."""
    slots = 1 << slot_bits
    return (np.array([0, 0, slot_bits], dtype=np.int64), np.zeros(slots, np.uint64), np.zeros(slots, np.int64),
            np.zeros(slots, np.int64), np.zeros(entries, np.int64), np.zeros(entries, np.int64),
            np.zeros(entries, np.int64), np.zeros(entries, np.int64), np.zeros(entries, np.int64),
            np.zeros(pool, np.int64), np.zeros(pool, np.int64))


def cache_for_tokens(n_tokens):
    """An empty context cache that holds every n-gram of n_tokens tokens without growing:
    at most NGRAM_MAX entries per token, and follower runs that double from 1 (<= 4 slots each)."""
    n = NGRAM_MAX * max(n_tokens, 1)
    return new_cache(slot_bits=max(4, int(np.ceil(np.log2(2 * n)))), entries=n, pool=4 * n)


@numba.njit(cache=True)
def clear_cache(c):
    meta, s_len = c[0], c[2]
    meta[0] = 0
    meta[1] = 0
    s_len[:] = 0


@numba.njit(cache=True, inline="always")
def find_entry(c, key, length):
    """Entry of an n-gram in a mutable cache, or -1."""
    meta, s_key, s_len, s_ent = c[0], c[1], c[2], c[3]
    bits = meta[2]
    mask = (np.int64(1) << bits) - 1
    h = home(key, length, bits)
    while s_len[h] != 0:
        if s_key[h] == key and s_len[h] == length:
            return s_ent[h]
        h = (h + 1) & mask
    return -1


@numba.njit(cache=True)
def _grown(c, need_entries, need_pool):
    """c with room for need_entries entries (table at most half full) and need_pool pool slots."""
    meta, s_key, s_len, s_ent, e_off, e_n, e_cap, e_tot, e_max, f_tok, f_cnt = c
    bits = meta[2]
    if 2 * need_entries > (np.int64(1) << bits):
        while 2 * need_entries > (np.int64(1) << bits):
            bits += 1
        slots = np.int64(1) << bits
        mask = slots - 1
        k2, l2, e2 = np.zeros(slots, np.uint64), np.zeros(slots, np.int64), np.zeros(slots, np.int64)
        for h in range(s_len.shape[0]):
            if s_len[h] != 0:
                j = home(s_key[h], s_len[h], bits)
                while l2[j] != 0:
                    j = (j + 1) & mask
                k2[j], l2[j], e2[j] = s_key[h], s_len[h], s_ent[h]
        s_key, s_len, s_ent = k2, l2, e2
        meta[2] = bits
    if need_entries > e_off.shape[0]:
        m = max(need_entries, 2 * e_off.shape[0])
        arrs = []
        for a in (e_off, e_n, e_cap, e_tot, e_max):
            b = np.zeros(m, np.int64)
            b[:a.shape[0]] = a
            arrs.append(b)
        e_off, e_n, e_cap, e_tot, e_max = arrs[0], arrs[1], arrs[2], arrs[3], arrs[4]
    if need_pool > f_tok.shape[0]:
        m = max(need_pool, 2 * f_tok.shape[0])
        t2, c2 = np.zeros(m, np.int64), np.zeros(m, np.int64)
        t2[:meta[1]] = f_tok[:meta[1]]
        c2[:meta[1]] = f_cnt[:meta[1]]
        f_tok, f_cnt = t2, c2
    return meta, s_key, s_len, s_ent, e_off, e_n, e_cap, e_tot, e_max, f_tok, f_cnt


@numba.njit(cache=True)
def add_count(c, key, length, y, inc):
    """Add inc to follower y of an n-gram; returns the cache (new arrays when it had to grow)."""
    meta = c[0]
    e = find_entry(c, key, length)
    if e < 0:
        c = _grown(c, meta[0] + 1, meta[1] + 1)
        meta, s_key, s_len, s_ent, e_off, e_n, e_cap = c[0], c[1], c[2], c[3], c[4], c[5], c[6]
        bits = meta[2]
        h = home(key, length, bits)
        while s_len[h] != 0:
            h = (h + 1) & ((np.int64(1) << bits) - 1)
        e = meta[0]
        meta[0] += 1
        s_key[h], s_len[h], s_ent[h] = key, length, e
        e_off[e], e_n[e], e_cap[e] = meta[1], 0, 1
        c[7][e] = 0
        c[8][e] = 0
        meta[1] += 1
    e_off, e_n, e_cap, f_tok, f_cnt = c[4], c[5], c[6], c[9], c[10]
    off, n = e_off[e], e_n[e]
    i = lower_bound(f_tok, off, n, y)
    if i < n and f_tok[off + i] == y:
        f_cnt[off + i] += inc
        cnt = f_cnt[off + i]
    else:
        if n == e_cap[e]:  # the run is full: move it to twice its size at the pool's end
            c = _grown(c, c[0][0], c[0][1] + 2 * n)
            meta, e_off, e_n, e_cap, f_tok, f_cnt = c[0], c[4], c[5], c[6], c[9], c[10]
            new = meta[1]
            f_tok[new:new + n] = f_tok[off:off + n]
            f_cnt[new:new + n] = f_cnt[off:off + n]
            meta[1] += 2 * n
            off = new
            e_off[e], e_cap[e] = new, 2 * n
        for j in range(n, i, -1):
            f_tok[off + j] = f_tok[off + j - 1]
            f_cnt[off + j] = f_cnt[off + j - 1]
        f_tok[off + i] = y
        f_cnt[off + i] = inc
        e_n[e] = n + 1
        cnt = inc
    c[7][e] += inc
    c[8][e] = max(c[8][e], cnt)
    return c


@numba.njit(cache=True)
def add_last(c, seq, m):
    """The context cache's update when token seq[m - 1] arrives: the n-grams of lengths
    NGRAM_MIN..NGRAM_MAX that end just before it, each followed by it (llama.cpp's
    common_ngram_cache_update with one new token)."""
    i = m - 1
    y = np.int64(seq[i])
    key = U64(0)
    for length in range(1, NGRAM_MAX + 1):
        if i < length:
            break
        key |= U64(seq[i - length]) << U64(TOKEN_BITS * (length - 1))
        c = add_count(c, key, length, y, 1)
    return c


@numba.njit(cache=True)
def add_range(c, seq, first, n):
    """add_last for tokens seq[first - 1 .. n - 1]: the sequence grew from first - 1 to n tokens."""
    for m in range(max(first, 2), n + 1):
        c = add_last(c, seq, m)
    return c


def add_sequence(c, seq, n):
    """Every n-gram of seq[:n] with its follower (what the context cache holds after n tokens)."""
    return add_range(c, seq, 2, n)


@numba.njit(cache=True)
def merge_into(dst, src):
    """Add every count of src to dst (llama.cpp's common_ngram_cache_merge); returns dst."""
    s_key, s_len, s_ent, e_off, e_n = src[1], src[2], src[3], src[4], src[5]
    f_tok, f_cnt = src[9], src[10]
    dst = _grown(dst, dst[0][0] + src[0][0], dst[0][1])
    for h in range(s_len.shape[0]):
        if s_len[h] != 0:
            e = s_ent[h]
            for j in range(e_off[e], e_off[e] + e_n[e]):
                dst = add_count(dst, s_key[h], s_len[h], f_tok[j], f_cnt[j])
    return dst


def cache_nbytes(c):
    return sum(a.nbytes for a in c)
