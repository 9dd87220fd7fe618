"""Drafting from this repo's own hint index (`--policy hints`): llama.cpp's context and dynamic
caches (hints/draft/llama.py), with the 6/10/20-gram index as the static part.

A drafted token after the sequence seq[:k] comes from, in order:
  1. the context cache at lengths 4..1 with llama.cpp's thresholds (no static weighting: the
     index answers only each n-gram's top follower, not every follower's count);
  2. the dynamic cache the same way;
  3. the index's hint for the n-gram ending at seq[k - 1], at the longest length whose count
     reaches MIN_COUNT and whose purity (the hinted follower's share) reaches MIN_PURITY.
The order (index last, as llama.cpp's static cache) and the two thresholds were chosen by
measurement on held-out standard-library text (docs/inference.md, "Choosing the hints policy"):
of 36 settings, the one with the most accepted drafts among those whose acceptance is at least
llama.cpp's rule's on the same text. `index_first=True` puts the index before the caches.

The replay looks the index up one position at a time from inside Numba, through the sealed
index's own search kernel (hints.index.search_sealed) on the arrays HintIndex.search_arrays gives:
no Python per token.
"""

import numba
import numpy as np

from ..index import HintIndex, search_sealed
from .llama import (CONTEXT_MIN_PERCENT, CONTEXT_MIN_TOTAL, DYNAMIC_MIN_PERCENT, DYNAMIC_MIN_TOTAL, LlamaDrafter,
                    replay_with, try_primary, verify_draft)
from .static import empty_static

# Chosen on held-out stdlib text (docs/inference.md, "Choosing the hints policy"): the setting with
# the most accepted drafts among those whose acceptance is at least llama.cpp's rule's.
MIN_COUNT = 2
MIN_PURITY = 0.9
INDEX_FIRST = False


def sealed_index(index, log=print):
    """index, sealed: a saved index is sealed already; an unsealed one is read into memory and sealed."""
    if index.sealed:
        return index
    if index.readonly:
        log(f"hint index {index.path}: unsealed; reading it into memory to seal it for drafting")
        index = HintIndex.load(index.path, mmap=False, workers=index.workers)
    return index.seal()


class IndexArgs:
    """A sealed index's arrays and one worker's scratch, as search_sealed takes them
    (HintIndex.search_arrays, HintIndex.search_scratch), and its output arrays for n positions."""

    def __init__(self, index, n):
        index = sealed_index(index)
        K = index.geom.n_lengths
        self.index = index
        self.table = index.search_arrays()
        self.scratch = index.search_scratch()
        self.out = (np.zeros((K, n), np.int32), np.zeros((K, n), np.int32), np.zeros((K, n), np.int32))


@numba.njit(cache=True)
def index_pick(seq, k, ix, sc, out, min_count, min_purity_pct):
    """The index's draft after seq[:k] (the n-gram ending at seq[k - 1]), or -1: the longest
    length with count >= min_count and 100 * top >= min_purity_pct * count."""
    if k < 1:
        return -1
    out_tok, out_cnt, out_top = out
    search_sealed(k - 1, k, seq, ix, sc, out_tok, out_cnt, out_top)  # count 0 where no length fits yet
    for j in range(out_tok.shape[0] - 1, -1, -1):
        c = np.int64(out_cnt[j, k - 1])
        if c >= min_count and 100 * np.int64(out_top[j, k - 1]) >= min_purity_pct * c:
            return np.int64(out_tok[j, k - 1])
    return -1


@numba.njit(cache=True)
def draft_hints(seq, m, n_draft, ctx, dyn, st, ix, sc, out, min_count, min_purity_pct, index_first):
    """Draft up to n_draft tokens after seq[:m] into seq[m:] by the hints policy; returns how many.
    index_first: the index before the context and dynamic caches (else after them)."""
    for i in range(n_draft):
        k = m + i
        tok = index_pick(seq, k, ix, sc, out, min_count, min_purity_pct) if index_first else -1
        if tok < 0:
            tok = try_primary(ctx, seq, k, 0, 0, st, CONTEXT_MIN_TOTAL, CONTEXT_MIN_PERCENT)
        if tok < 0:
            tok = try_primary(dyn, seq, k, 0, 0, st, DYNAMIC_MIN_TOTAL, DYNAMIC_MIN_PERCENT)
        if tok < 0 and not index_first:
            tok = index_pick(seq, k, ix, sc, out, min_count, min_purity_pct)
        if tok < 0:
            return i
        seq[k] = tok
    return n_draft


@numba.njit(cache=True)
def replay_chunk_hints(chunk, n_draft, seq, ctx, dyn, st, ix, sc, out, min_count, min_purity_pct, index_first):
    """replay_chunk (hints/draft/llama.py) with the hints policy's drafts."""
    seq[0] = chunk[0]
    m = 1
    drafted, accepted = 0, 0
    while m < chunk.shape[0]:
        d = draft_hints(seq, m, n_draft, ctx, dyn, st, ix, sc, out, min_count, min_purity_pct, index_first)
        drafted += d
        m, a, ctx = verify_draft(chunk, seq, m, d, ctx)
        accepted += a
    return drafted, accepted, ctx


def purity_pct(min_purity):
    return int(round(100 * min_purity))


def replay_hints(tokens, n_ctx, n_draft, index, min_count=MIN_COUNT, min_purity=MIN_PURITY, index_first=INDEX_FIRST,
                 progress=None):
    """llama-lookup-stats's replay with the hints policy; the same dict as hints.draft.llama.replay."""
    ia = IndexArgs(index, n_ctx + n_draft + 1)
    st, pct = empty_static(), purity_pct(min_purity)
    return replay_with(lambda chunk, seq, ctx, dyn: replay_chunk_hints(
        chunk, n_draft, seq, ctx, dyn, st, ia.table, ia.scratch, ia.out, min_count, pct, index_first),
        tokens, n_ctx, n_draft, progress)


class HintDrafter(LlamaDrafter):
    """The hints policy for generation: draft(seq, n) drafts after the sequence seq (LlamaDrafter's
    sequence handling, with the index tried as this policy orders it)."""

    def __init__(self, index, min_count=MIN_COUNT, min_purity=MIN_PURITY, index_first=INDEX_FIRST):
        super().__init__()
        self.ia = IndexArgs(index, 1)
        self.index_first = index_first
        self.min_count, self.min_purity = min_count, purity_pct(min_purity)

    def _grow(self, n):
        super()._grow(n)
        K = self.ia.out[0].shape[0]
        self.ia.out = tuple(np.zeros((K, n), np.int32) for _ in range(3))

    def _draft_into(self, m, n_draft):
        return draft_hints(self.buf, m, n_draft, self.context, self.dynamic, self.static, self.ia.table,
                           self.ia.scratch, self.ia.out, self.min_count, self.min_purity, self.index_first)
