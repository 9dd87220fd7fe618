"""llama.cpp's n-gram drafting (prompt lookup decoding), its exact rule on fast containers.

Three caches map an n-gram to its followers' counts (llama.cpp's common/ngram-cache):
  context  lengths 1-4 of the sequence so far; each new token adds the n-grams ending before it;
  dynamic  earlier sequences, merged in by adding counts (the replay merges each chunk's context);
  static   the length-2 n-grams of a fixed corpus, built once and never changed.
A drafted token comes from the context cache at lengths 4, 3, 2, 1, then the dynamic cache at
4, 3, 2, 1, then the static cache alone. A cache at a length scores each follower y as
count(y) * w(y), w(y) = STATIC_WEIGHT x y's count after the last 2 tokens in the static cache
(1 when absent there), and picks the highest score, ties to the lowest token id (llama.cpp takes
the first maximum in hash-map order, which no other program can reproduce). It accepts the pick
only if the length's follower total reaches a minimum and the pick's own count a percentage of
it (integer percents: 100 * c >= p * total). The static fallback takes the most frequent
follower of the last 2 tokens under its own minimum and percentage. A length longer than the
sequence so far is absent, and a sequence shorter than 2 tokens gets no draft (llama.cpp returns
early). Drafting stops at the first token no cache gives, or at n_draft tokens. The plain-Python
statement of the same rule is hints/draft_reference.py; tests compare them on every stream.

How it is made fast (the lessons of the llama.cpp n-gram-cache write-up, docs/inference.md):
  * no copies on the hot path: the draft is written in place after the sequence, in the same
    buffer the lookups read (the "extended sequence" is a longer view of it), and a cache's
    followers are read where they lie;
  * an n-gram of up to 4 GPT-2 ids packs into one uint64 key, found in an open-addressing table;
    its followers are one sorted run of (token, count) in a shared pool (struct of arrays), and a
    token's count is found by a fixed-iteration branch-free binary search (the loop count depends
    only on the run's length, never on the tokens read);
  * every n-gram keeps its follower total and its largest count, so the precheck rejects it
    (total below the minimum, or even the largest count below the percentage) before any
    follower is scored; without static support the pick is the largest count itself;
  * the static cache is immutable: a table of (key, offset << 24 | n, total << 32 | max) and one
    contiguous run of followers, written as one file and loaded as one buffer whose views are
    the arrays (no rebuild).
"""
import os

import numba
import numpy as np

U64 = np.uint64

# llama.cpp's common/ngram-cache.h: LLAMA_NGRAM_MIN, LLAMA_NGRAM_MAX, LLAMA_NGRAM_STATIC.
NGRAM_MIN, NGRAM_MAX, NGRAM_STATIC = 1, 4, 2
# llama.cpp's common/ngram-cache.cpp, per n-gram length 1..4: the context cache's "lax" and the
# dynamic cache's "strict" minimum follower totals and minimum percentages of the pick.
CONTEXT_MIN_TOTAL = np.array([2, 2, 1, 1], dtype=np.int64)
CONTEXT_MIN_PERCENT = np.array([66, 50, 50, 50], dtype=np.int64)
DYNAMIC_MIN_TOTAL = np.array([4, 3, 2, 2], dtype=np.int64)
DYNAMIC_MIN_PERCENT = np.array([75, 66, 66, 66], dtype=np.int64)
# The static fallback uses the lax entry of length LLAMA_NGRAM_STATIC = 2: total >= 2, >= 50%.
STATIC_MIN_TOTAL, STATIC_MIN_PERCENT = 2, 50
STATIC_WEIGHT = 100  # a follower's weight is 100 x its static count (llama.cpp's try_draft)
TOKEN_BITS = 16      # ids packed into n-gram keys: GPT-2's 50,257 < 2^16
MAX_TOKEN = (1 << TOKEN_BITS) - 1
HASH_MULT = U64(0x9E3779B97F4A7C15)  # Fibonacci hashing (Knuth): multiply, keep the top bits
OFF_SHIFT = U64(24)                  # static value: follower offset << 24 | follower count (the article's 40/24 split)
N_MASK = U64((1 << 24) - 1)
STATIC_MAGIC = b"NGSTATIC"
STATIC_VERSION = 1
STATIC_HEADER_WORDS = 8  # magic, version, table bits, n-grams, followers, tokens, 2 spare (uint64 each)


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
    meta, s_key, s_len = c[0], c[1], c[2]
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


def cache_nbytes(c):
    return sum(a.nbytes for a in c)


# ---- drafting --------------------------------------------------------------------------------

@numba.njit(cache=True)
def try_primary(c, seq, m, st_off, st_n, st, min_total, min_percent):
    """llama.cpp's try_draft on a context or dynamic cache: lengths NGRAM_MAX..NGRAM_MIN of the
    sequence seq[:m]; st_off, st_n: the static followers of its last 2 tokens (st_n = 0: none).
    The drafted token, or -1."""
    s_tok, s_cnt = st[3], st[4]
    e_off, e_n, e_tot, e_max, f_tok, f_cnt = c[4], c[5], c[7], c[8], c[9], c[10]
    for length in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
        if length > m:
            continue  # longer than the sequence: absent
        key = U64(0)
        for j in range(length):
            key |= U64(seq[m - 1 - j]) << U64(TOKEN_BITS * j)
        e = find_entry(c, key, length)
        if e < 0:
            continue
        total, largest = e_tot[e], e_max[e]
        # precheck: no follower can pass when the total is short or even the largest count is
        if total < min_total[length - 1] or 100 * largest < min_percent[length - 1] * total:
            continue
        off, n = e_off[e], e_n[e]
        if st_n == 0:  # every weight is 1: the pick is the first (lowest-id) largest count
            for j in range(off, off + n):
                if f_cnt[j] == largest:
                    return f_tok[j]
        best, pick, pick_count = np.int64(0), np.int64(-1), np.int64(0)
        for j in range(off, off + n):
            w = find_count(s_tok, s_cnt, st_off, st_n, f_tok[j])
            score = f_cnt[j] * (STATIC_WEIGHT * np.int64(w) if w > 0 else np.int64(1))
            if score > best:  # strictly greater: ties keep the lower id (runs are sorted by token)
                best, pick, pick_count = score, f_tok[j], f_cnt[j]
        if 100 * pick_count >= min_percent[length - 1] * total:
            return pick
    return -1


@numba.njit(cache=True)
def draft_into(seq, m, n_draft, ctx, dyn, st, ctx_total, ctx_percent, dyn_total, dyn_percent):
    """Draft up to n_draft tokens after seq[:m], writing them to seq[m:] (the buffer is the
    extended sequence the next lookups read). Returns how many were drafted."""
    if m < NGRAM_STATIC:
        return 0
    has_static = st[0].shape[0] > 1
    for i in range(n_draft):
        k = m + i
        st_off, st_n, st_tot, st_max = np.int64(0), np.int64(0), np.int64(0), np.int64(0)
        if has_static:
            st_off, st_n, st_tot, st_max = static_find(st, (U64(seq[k - 2]) << U64(TOKEN_BITS)) | U64(seq[k - 1]))
        tok = try_primary(ctx, seq, k, st_off, st_n, st, ctx_total, ctx_percent)
        if tok < 0:
            tok = try_primary(dyn, seq, k, st_off, st_n, st, dyn_total, dyn_percent)
        if tok < 0 and st_n > 0 and st_tot >= STATIC_MIN_TOTAL and 100 * st_max >= STATIC_MIN_PERCENT * st_tot:
            for j in range(st_off, st_off + st_n):  # the first (lowest-id) most frequent follower
                if st[4][j] == st_max:
                    tok = st[3][j]
                    break
        if tok < 0:
            return i
        seq[k] = tok
    return n_draft


@numba.njit(cache=True)
def replay_chunk(chunk, n_draft, seq, ctx, dyn, st):
    """llama-lookup-stats on one chunk: from its first token, draft, accept drafted tokens while
    each equals the chunk's next one (adding each to the context cache), then append the chunk's
    true next token (the "sampled" one) and add it; until the chunk is whole.
    seq: a buffer of len(chunk) + n_draft tokens. Returns (n_drafted, n_accept, context cache)."""
    seq[0] = chunk[0]
    m = 1
    drafted, accepted = 0, 0
    while m < chunk.shape[0]:
        d = draft_into(seq, m, n_draft, ctx, dyn, st, CONTEXT_MIN_TOTAL, CONTEXT_MIN_PERCENT, DYNAMIC_MIN_TOTAL,
                       DYNAMIC_MIN_PERCENT)
        drafted += d
        m, a, ctx = verify_draft(chunk, seq, m, d, ctx)
        accepted += a
    return drafted, accepted, ctx


@numba.njit(cache=True)
def verify_draft(chunk, seq, m, d, ctx):
    """One replay round after `d` tokens were drafted into seq[m:]: accept them while each equals the
    chunk's next token (each added to the context cache), then append the chunk's true next token
    and add it. Returns (the new length m, the drafts accepted, the context cache)."""
    n_ctx = chunk.shape[0]
    accepted = 0
    for _ in range(d):
        if m >= n_ctx or seq[m] != chunk[m]:
            break
        accepted += 1
        m += 1
        ctx = add_last(ctx, seq, m)
    if m < n_ctx:
        seq[m] = chunk[m]
        m += 1
        ctx = add_last(ctx, seq, m)
    return m, accepted, ctx


def check_tokens(tokens, name):
    """tokens as an int64 array of ids that fit a packed key, or a ValueError naming them."""
    a = np.asarray(tokens)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected a 1-D array of integer token ids, got shape {a.shape} dtype {a.dtype}")
    if a.size and (a.min() < 0 or a.max() > MAX_TOKEN):
        raise ValueError(f"{name}: token ids must be in [0, {MAX_TOKEN}], found [{a.min()}, {a.max()}]")
    return a.astype(np.int64)


class LlamaDrafter:
    """llama.cpp's drafting for generation: a context cache of the sequence so far, a dynamic
    cache (earlier sequences), a static cache (or none). draft(seq, n) drafts after seq."""

    def __init__(self, static=None, dynamic=None):
        self.static = static if static is not None else empty_static()
        self.dynamic = dynamic if dynamic is not None else new_cache()
        self.context = new_cache()
        self.seen = 0  # tokens of the sequence already in the context cache
        self.buf = np.zeros(0, np.int64)

    def reset(self):
        """Start a new sequence (the context cache forgets the last one)."""
        clear_cache(self.context)
        self.seen = 0

    def draft(self, seq, n_draft):
        """Up to n_draft tokens after the 1-D token sequence seq (which extends the last one seen)."""
        seq = check_tokens(seq, "sequence")
        if self.buf.size < seq.size + n_draft + 1:
            self._grow(2 * (seq.size + n_draft + 1))
        self.buf[:seq.size] = seq
        self.context = add_range(self.context, self.buf, self.seen + 1, seq.size)
        self.seen = max(self.seen, seq.size)
        d = self._draft_into(seq.size, n_draft)
        return self.buf[seq.size:seq.size + d].copy()

    def _grow(self, n):
        """Room for n tokens of sequence and drafts."""
        self.buf = np.zeros(n, np.int64)

    def _draft_into(self, m, n_draft):
        """Draft up to n_draft tokens into buf[m:] after buf[:m]; returns how many (the policy's kernel)."""
        return draft_into(self.buf, m, n_draft, self.context, self.dynamic, self.static, CONTEXT_MIN_TOTAL,
                          CONTEXT_MIN_PERCENT, DYNAMIC_MIN_TOTAL, DYNAMIC_MIN_PERCENT)


def replay(tokens, n_ctx, n_draft, static=None, progress=None):
    """llama-lookup-stats over a token stream: chunks of n_ctx tokens at every start with
    start + n_ctx < len(tokens), the context cache merged into the dynamic one after each.
    Returns dict(n_drafted, n_accept, n_chunks, draft_s, merge_s, dynamic_bytes)."""
    st = static if static is not None else empty_static()
    return replay_with(lambda chunk, seq, ctx, dyn: replay_chunk(chunk, n_draft, seq, ctx, dyn, st),
                       tokens, n_ctx, n_draft, progress)


def replay_with(replay_chunk_fn, tokens, n_ctx, n_draft, progress=None):
    """The replay's driver for a drafting policy: replay_chunk_fn(chunk, seq, ctx, dyn) replays one
    chunk (a Numba kernel: replay_chunk here, hints.hint_draft's for the hints policy) and returns
    (drafted, accepted, context cache); each chunk starts from an empty context cache, which is then
    merged into the dynamic one. Times only the kernels. The dict of `replay`."""
    import time
    tokens = check_tokens(tokens, "tokens")
    ctx, dyn = cache_for_tokens(n_ctx), new_cache()
    seq = np.zeros(n_ctx + n_draft + 1, np.int64)
    drafted = accepted = chunks = 0
    draft_s = merge_s = 0.0
    # compile (or load from Numba's cache) for these argument types before anything is timed
    merge_into(new_cache(), replay_chunk_fn(tokens[:2], seq, new_cache(), new_cache())[2])
    for start in range(0, tokens.size, n_ctx):
        if start + n_ctx >= tokens.size:
            break
        clear_cache(ctx)
        t0 = time.perf_counter()
        d, a, ctx = replay_chunk_fn(tokens[start:start + n_ctx], seq, ctx, dyn)
        t1 = time.perf_counter()
        dyn = merge_into(dyn, ctx)
        merge_s += time.perf_counter() - t1
        draft_s += t1 - t0
        drafted, accepted, chunks = drafted + d, accepted + a, chunks + 1
        if progress is not None:
            progress.update(n_ctx)
    return dict(n_drafted=int(drafted), n_accept=int(accepted), n_chunks=chunks, draft_s=draft_s, merge_s=merge_s,
                dynamic_bytes=cache_nbytes(dyn))
