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
statement of the same rule is hints/draft/reference.py; tests compare them on every stream.

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
import numba
import numpy as np

from ..tokens import MAX_TOKEN, TOKEN_BITS
from .caches import (NGRAM_MAX, NGRAM_MIN, NGRAM_STATIC, add_last, add_range, cache_for_tokens, cache_nbytes,
                     clear_cache, find_count, find_entry, merge_into, new_cache)
from .static import empty_static, static_find

U64 = np.uint64

# llama.cpp's common/ngram-cache.cpp, per n-gram length 1..4: the context cache's "lax" and the
# dynamic cache's "strict" minimum follower totals and minimum percentages of the pick.
CONTEXT_MIN_TOTAL = np.array([2, 2, 1, 1], dtype=np.int64)
CONTEXT_MIN_PERCENT = np.array([66, 50, 50, 50], dtype=np.int64)
DYNAMIC_MIN_TOTAL = np.array([4, 3, 2, 2], dtype=np.int64)
DYNAMIC_MIN_PERCENT = np.array([75, 66, 66, 66], dtype=np.int64)
# The static fallback uses the lax entry of length LLAMA_NGRAM_STATIC = 2: total >= 2, >= 50%.
STATIC_MIN_TOTAL, STATIC_MIN_PERCENT = 2, 50
STATIC_WEIGHT = 100  # a follower's weight is 100 x its static count (llama.cpp's try_draft)


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
    chunk (a Numba kernel: replay_chunk here, hints.draft.from_hints's for the hints policy) and returns
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
