"""Cells: the record's representation of a lookup, and the document boundaries every lookup obeys.

One cell per position, at the deepest of the lengths (6, 10, 20) that an earlier occurrence of
its context matches. The candidates are the occurrences that match at least that deep; `count`
is their number; the distinct tokens that followed them are kept with their counts, most
frequent first (ties to the smaller token id), up to `max_followers`; purity is the top
follower's count / count. `kind` numbers (depth, count bin, purity bin) as `kinds.cell_of` does.

Document boundaries (the rule every source of Cells follows, and `mask_hints` applies to the
per-length hints): an n-gram restarts at every BOS token and at the start of each segment (a
query array's first token; in a training stream, each rank's slice of a step). The BOS itself
may be an n-gram's first token, never a later one; a BOS may be a follower (a document's last
n-gram is followed by the next document's BOS). So the n-gram of length L ending at t exists iff
reach[t] >= L, where reach[t] counts t's segment's tokens up to and including t (`reach`).

NumPy + Numba only.
"""
from typing import NamedTuple

import numba
import numpy as np

from .kinds import cell_of

# GPT-2's <|endoftext|> (data.tokenizer.EOT_TOKEN; every document starts with it): documents are
# boundaries, n-grams restart at every BOS.
BOS = 50256
NO_BOUNDARY = -1  # `boundary` value for "no BOS restarts" (segments still restart)
N_TOKEN_IDS = 1 << 16    # follower counters are indexed by token id (uint16)
REACH_MAX = 255   # reach is kept in a uint8: n-gram lengths are at most 64 (geometry.MAX_LENGTH)


class Cells(NamedTuple):
    depth: np.ndarray            # int8[n]: -1 no match, else the index into lengths of the deepest match
    count: np.ndarray            # int32[n]: occurrences matching at least that deep (the candidates)
    followers: np.ndarray        # int32[n, F]: distinct followers by count desc, ties to the smaller id; -1 pad
    follower_counts: np.ndarray  # int32[n, F]: their counts; 0 padding
    kind: np.ndarray             # int16[n]: kinds.cell_of(depth, count, follower_counts[:, 0]); -1 none


def empty_cells(n, max_followers):
    """Cells of n positions with no match."""
    return Cells(depth=np.full(n, -1, np.int8), count=np.zeros(n, np.int32),
                 followers=np.full((n, max_followers), -1, np.int32),
                 follower_counts=np.zeros((n, max_followers), np.int32), kind=np.full(n, -1, np.int16))


def with_kinds(depth, count, followers, follower_counts):
    """Cells from their parts, the kind computed (one place, so every source agrees)."""
    return Cells(depth=depth, count=count, followers=followers, follower_counts=follower_counts,
                 kind=cell_of(depth, count, follower_counts[:, 0] if follower_counts.shape[1] else count))


def check_boundary(boundary):
    """The boundary token as an int (-1: none), or a ValueError naming the argument."""
    if boundary is None:
        return NO_BOUNDARY
    b = int(boundary)
    if not (b == NO_BOUNDARY or 0 <= b < 1 << 16):
        raise ValueError(f"boundary={boundary!r}: expected a token id in [0, 65535] (BOS = {BOS}) or None")
    return b


def check_max_followers(max_followers):
    f = int(max_followers)
    if f < 1:
        raise ValueError(f"max_followers={max_followers!r}: expected an integer >= 1 (training 2, validation 8)")
    return f


@numba.njit(cache=True, nogil=True)
def reach_into(tokens, boundary, segment, limit, out):
    """out[t] = min(limit, tokens of t's segment up to and including t): segments start at 0, at
    every multiple of `segment` (0: no fixed segments) and at every token == boundary (-1: none)."""
    start = 0
    for t in range(tokens.shape[0]):
        if (segment > 0 and t % segment == 0) or np.int64(tokens[t]) == boundary:
            start = t
        out[t] = min(t - start + 1, limit)


def reach(tokens, boundary=BOS, segment=0, limit=REACH_MAX):
    """uint8 reach of every position of a 1-D token array (module docstring)."""
    tokens = np.ascontiguousarray(tokens)
    out = np.empty(tokens.shape[0], dtype=np.uint8)
    reach_into(tokens, check_boundary(boundary), int(segment), min(int(limit), REACH_MAX), out)
    return out


def mask_hints(hints, tokens, boundary=BOS, lengths=None, skip=0):
    """Per-length hints (hints.Hints, (K, n) arrays over tokens[skip:]) with document boundaries
    applied: a length whose n-gram at t would cross a boundary gets no hint there (token -1,
    count 0, purity 0, kind -1). `tokens` starts a segment; its first `skip` tokens are context
    only. Returns a new Hints; the input is left as it is."""
    if check_boundary(boundary) == NO_BOUNDARY:
        return hints
    lengths = np.asarray(lengths, dtype=np.int64)
    r = reach(tokens, boundary, limit=int(lengths.max()))[skip:]
    cut = r[None, :] < lengths[:, None]
    return type(hints)(token=np.where(cut, -1, hints.token).astype(np.int32),
                       count=np.where(cut, 0, hints.count).astype(np.int32),
                       purity=np.where(cut, 0, hints.purity).astype(np.float32),
                       kind=np.where(cut, -1, hints.kind).astype(np.int16))


def document_hints(index, stream, start, stop, lengths, boundary=BOS):
    """Per-length hints of positions [start, stop) of `stream` from `index` (anything with
    lookup_span: HintIndex, hints.exact.ExactHints), with documents as boundaries: a length whose
    n-gram at t would reach back past a BOS (or the stream's start) gets no hint there. Every
    per-length lookup of a run goes through here: training, validation, stats, generation."""
    h = index.lookup_span(stream, start, stop)
    w = max(0, start - (max(lengths) - 1))  # reach at start..stop-1 needs the longest n-gram's tokens before it
    return mask_hints(h, stream[w:stop], boundary, lengths, skip=start - w)


def describe_boundary(boundary):
    """One line saying which boundary rule a lookup used."""
    b = check_boundary(boundary)
    if b == NO_BOUNDARY:
        return "boundaries: none (n-grams run across documents)"
    return f"boundaries: n-grams restart at every BOS ({b}) and at the start of the token stream"


@numba.njit(cache=True, nogil=True, inline="always")
def top_followers(toks, m, F, out_tok, out_cnt, t, counter):
    """Count the follower ids toks[:m] in `counter` (int32 per token id, all zero; left all zero),
    then write the F most frequent distinct ones (count desc, ties to the smaller id) and their
    counts to out_tok[t], out_cnt[t] (-1 / 0 padding). Returns the top count (0 when m == 0)."""
    for f in range(F):
        out_tok[t, f] = -1
        out_cnt[t, f] = 0
    for i in range(m):
        counter[toks[i]] += 1
    top = 0
    for i in range(m):
        x = toks[i]
        c = np.int64(counter[x])
        if c == 0:  # counted already
            continue
        counter[x] = 0
        top = max(top, c)
        f = F
        while f > 0 and (out_cnt[t, f - 1] < c or (out_cnt[t, f - 1] == c and out_tok[t, f - 1] > x)):
            f -= 1
        if f < F:
            for g in range(F - 1, f, -1):
                out_tok[t, g] = out_tok[t, g - 1]
                out_cnt[t, g] = out_cnt[t, g - 1]
            out_tok[t, f] = x
            out_cnt[t, f] = c
    return top
