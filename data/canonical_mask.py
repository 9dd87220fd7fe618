"""The canonical-token mask of the record's final validation: bit (p, x) is set when GPT-2's tokenizer
can never emit token x right after token p, so the softmax may drop x there (model/record_loss.py sets
its logit to -60). The record (its canonical_mask.py and exact_match/src/canon.rs, record #350)
builds it on the clock during training; this is our NumPy + Numba build of the same rule.

The rule. BPE joins the bytes of one pre-token piece by piece, always the pair of lowest merge rank
(leftmost on ties). Replaying BPE on a token's own bytes gives the trajectory of its first piece and of
its last piece: which token each is from which rank on. Rule r (the merge that forms token r: GPT-2
numbers a merged token by the rank of its merge, and the replay of each of its 50,000 merged tokens ends
in that token, so the replay's last merge is that rule) joins (a, b). If p and x sit in one pre-token and,
at rank r, p's last piece is a and x's first piece is b, then BPE would join a and b across the seam
before p and x are both complete, so [p, x] is never the encoding. The intervals are the record's,
off by one as there: a last piece formed by the merge of rank s is a from s on, a first piece formed
at rank s is b from s + 1 on, and a piece's final interval never ends; rule r matches when
s <= r < e on both sides.

The seam. The pair must lie in one pre-token (GPT-2's regex), which the classes of p's last and x's
first character decide (space, number, letter, other; "partial" for a byte that does not start a whole
UTF-8 character, U+001C-U+001F count as other, as Python's isspace() and the regex disagree there):
  * never when x starts inside a character (its pre-token goes on past x, which the rule cannot see),
  * never across space -> space (a run of whitespace splits before its last space) or other -> letter
    (an apostrophe may start a contraction, which depends on text before p),
  * never after a p that ends in a contraction pre-token ('s 't 're 've 'm 'll 'd, after nothing or
    after a letter or number): nothing can extend that piece, and whether it is one depends on p's left.
The mask is therefore a subset of the non-canonical pairs: every set pair is non-canonical in every
context, and pairs whose fate depends on text outside them stay unset. On GPT-2 it sets 70,889,701 pairs
(2.8% of all); of 200,000 random pairs, 2.9% are non-canonical and it sets 99.7% of those, none of the
others (tests/test_data_canonical_mask.py). It equals a plain statement of the rule bit for bit (the
tests check sampled rows and a whole small vocabulary). <|endoftext|> and padding rows/columns are zero.

Time. The tokenizer tables take 1.2-1.9 s in Python (before the clock); the mask itself about 0.9 s on
one core of this 2-core AMD EPYC VM with its buffer allocated, 2-3 s with a fresh one (page faults)
or in a fresh process (Numba's cache); the record's Rust takes 318 ms on 128 threads.

Layout: uint8 [vocab_size, vocab_size // 8], bit x & 7 of byte x >> 3 of row p (np.packbits
bitorder="little"), the record's buffer. A CLI builds it once and caches it as .npy beside the data:
    python -m data.canonical_mask --out data/canonical_mask.npy
"""
import argparse
import os
import resource
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numba
import numpy as np

from data.tokenizer import gpt2

SPACE, NUMBER, LETTER, OTHER, PARTIAL = range(5)  # pre-tokenizer classes of a token's edge character
N_CLASSES = 5
# SEAM_OK[class of p's last character, class of x's first character]: may one pre-token span the seam?
SEAM_OK = np.ones((N_CLASSES, N_CLASSES), dtype=bool)
SEAM_OK[:, PARTIAL] = False      # x starts inside a character: its pre-token runs on past x
SEAM_OK[SPACE, SPACE] = False    # a whitespace run is one pre-token, and "\s+(?!\S)" splits off its end
SEAM_OK[OTHER, LETTER] = False   # an apostrophe may open a contraction: depends on the text before p
CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")  # GPT-2's regex alternatives
NEVER = 1 << 30                  # the end rank of a piece's last interval (the record's)
NO_RANK = np.int64(1 << 62)      # "this pair of pieces is not a token"
PADDED_VOCAB = 50304             # the record's vocabulary, 50,257 padded to a multiple of 128


# ---- the tokenizer side (Python, before the clock): edge classes and the pair table ----

def char_class(ch):
    """SPACE, NUMBER, LETTER or OTHER for one character, as GPT-2's regex groups it."""
    if ch.isspace() and not "\x1c" <= ch <= "\x1f":
        return SPACE
    category = unicodedata.category(ch)[0]
    return NUMBER if category == "N" else LETTER if category == "L" else OTHER


def edge_class(b, first):
    """Class of the first (or last) whole character of bytes `b`; PARTIAL when its first (last) 1-4 bytes
    are no whole character."""
    for n in range(1, 5):
        try:
            text = (b[:n] if first else b[-n:]).decode("utf-8")
        except UnicodeDecodeError:
            continue
        return char_class(text[0] if first else text[-1])
    return PARTIAL


def ends_in_contraction(b):
    """Whether the text of `b` ends in a contraction pre-token ('s after nothing, a letter or a number)."""
    try:
        text = b.decode("utf-8")
    except UnicodeDecodeError:
        return False  # ends inside a character, so not in a contraction
    for c in CONTRACTIONS:
        if text.endswith(c):
            before = text[:-len(c)]
            return not before or char_class(before[-1]) in (LETTER, NUMBER)
    return False


def token_bytes(ranks):
    """The bytes of every token id 0..n-1 (ranks maps bytes -> id; ids must be exactly 0..n-1)."""
    tokens = [None] * len(ranks)
    for b, t in ranks.items():
        if not 0 <= t < len(ranks) or tokens[t] is not None:
            raise ValueError(f"canonical mask: token ids must be 0..{len(ranks) - 1}, each once (got {t})")
        tokens[t] = b
    if any(bytes([c]) not in ranks for c in range(256)):
        raise ValueError("canonical mask: the tokenizer's ranks must hold every single byte")
    return tokens


def seam_tables(tokens):
    """(start class of each token, allowed: for each token as p, the bit set of x start classes a seam
    merge may follow it with; 0 for a p ending in a contraction)."""
    start = np.array([edge_class(b, first=True) for b in tokens], dtype=np.int64)
    end = np.array([edge_class(b, first=False) for b in tokens], dtype=np.int64)
    bits = (SEAM_OK[end] * (1 << np.arange(N_CLASSES))).sum(axis=1)
    closed = np.array([ends_in_contraction(b) for b in tokens])
    return start, np.where(closed, 0, bits).astype(np.int64)


def pair_table(ranks, tokens):
    """Sorted keys u << 16 | v of every pair of tokens whose bytes joined are a token, and that token:
    BPE's "rank of pieces u, v joined" as a lookup over token ids (ids must fit 16 bits)."""
    if len(tokens) > 1 << 16:
        raise ValueError(f"canonical mask: {len(tokens)} tokens; the pair table holds ids below 65,536")
    keys, merged = [], []
    for t, b in enumerate(tokens):
        for k in range(1, len(b)):
            u, v = ranks.get(b[:k]), ranks.get(b[k:])
            if u is not None and v is not None:
                keys.append(u << 16 | v)
                merged.append(t)
    keys, merged = np.array(keys, dtype=np.int64), np.array(merged, dtype=np.int64)
    order = np.argsort(keys)
    return keys[order], merged[order]


# ---- the BPE replay and the mask rows (Numba) ----

@numba.njit(cache=True, nogil=True)
def _joined_rank(keys, merged, u, v):
    key = u << 16 | v
    i = np.searchsorted(keys, key)
    return merged[i] if i < keys.shape[0] and keys[i] == key else NO_RANK


@numba.njit(cache=True, nogil=True)
def _append_intervals(changes, count, out, n_out):
    """(start, piece) changes -> (piece, start, end) rows of `out` from n_out on, empty ones dropped."""
    for i in range(count):
        start, piece = changes[i, 0], changes[i, 1]
        end = changes[i + 1, 0] if i + 1 < count else NEVER
        if start < end:
            out[n_out, 0], out[n_out, 1], out[n_out, 2] = piece, start, end
            n_out += 1
    return n_out


@numba.njit(cache=True, nogil=True)
def _trajectories(data, offsets, byte_token, keys, merged):
    """BPE replay of every token's bytes: its first- and last-piece intervals (piece, start, end) as
    CSR rows (offsets per token), and its rule: the pieces its last merge joined (-1 for single bytes)."""
    n = offsets.shape[0] - 1
    max_len = 0
    for t in range(n):
        max_len = max(max_len, offsets[t + 1] - offsets[t])
    bound = offsets[n] + n  # a token of L bytes has at most L intervals per side
    first = np.empty((bound, 3), dtype=np.int64)
    last = np.empty((bound, 3), dtype=np.int64)
    first_offsets = np.zeros(n + 1, dtype=np.int64)
    last_offsets = np.zeros(n + 1, dtype=np.int64)
    rules = np.full((n, 2), -1, dtype=np.int64)
    piece = np.empty(max_len, dtype=np.int64)
    joined = np.empty(max_len, dtype=np.int64)
    first_changes = np.empty((max_len + 1, 2), dtype=np.int64)
    last_changes = np.empty((max_len + 1, 2), dtype=np.int64)
    n_first = n_last = 0
    for t in range(n):
        length = offsets[t + 1] - offsets[t]
        for i in range(length):
            piece[i] = byte_token[data[offsets[t] + i]]
        for i in range(length - 1):
            joined[i] = _joined_rank(keys, merged, piece[i], piece[i + 1])
        first_changes[0, 0], first_changes[0, 1] = 0, piece[0]
        last_changes[0, 0], last_changes[0, 1] = 0, piece[length - 1]
        n_fc = n_lc = 1
        while length > 1:
            best = 0
            for i in range(1, length - 1):
                if joined[i] < joined[best]:  # the lowest rank, on ties the first pair
                    best = i
            r = joined[best]
            if r == NO_RANK:
                break
            rules[t, 0], rules[t, 1] = piece[best], piece[best + 1]
            piece[best] = r
            for i in range(best + 1, length - 1):
                piece[i] = piece[i + 1]
            for i in range(best, length - 2):
                joined[i] = joined[i + 1]
            length -= 1
            if best + 1 < length:
                joined[best] = _joined_rank(keys, merged, piece[best], piece[best + 1])
            if best > 0:
                joined[best - 1] = _joined_rank(keys, merged, piece[best - 1], piece[best])
            if best == 0:  # a first piece formed at rank r is the first piece from r + 1 on
                first_changes[n_fc, 0], first_changes[n_fc, 1] = r + 1, r
                n_fc += 1
            if best == length - 1:  # a last piece formed at rank r is the last piece from r on
                last_changes[n_lc, 0], last_changes[n_lc, 1] = r, r
                n_lc += 1
        n_first = _append_intervals(first_changes, n_fc, first, n_first)
        n_last = _append_intervals(last_changes, n_lc, last, n_last)
        first_offsets[t + 1], last_offsets[t + 1] = n_first, n_last
    return first[:n_first], first_offsets, last[:n_last], last_offsets, rules


@numba.njit(cache=True, nogil=True)
def _csr(keys, values, n_keys):
    """Offsets and values of the lists values-by-key (counting sort, stable)."""
    offsets = np.zeros(n_keys + 1, dtype=np.int64)
    for k in keys:
        offsets[k + 1] += 1
    for k in range(n_keys):
        offsets[k + 1] += offsets[k]
    fill = offsets[:-1].copy()
    out = np.empty(keys.shape[0], dtype=np.int64)
    for i in range(keys.shape[0]):
        out[fill[keys[i]]] = values[i]
        fill[keys[i]] += 1
    return offsets, out


@numba.njit(cache=True, nogil=True)
def _rules_in(offsets, ranks, piece, start, end):
    """The ranks in [start, end) of the rules with this piece on the chosen side (lists are ascending)."""
    lo, hi = offsets[piece], offsets[piece + 1]
    return ranks[lo + np.searchsorted(ranks[lo:hi], start):lo + np.searchsorted(ranks[lo:hi], end)]


@numba.njit(cache=True, nogil=True)
def _candidates(first, first_offsets, rules, start_class):
    """The x's a rule can follow with, by (rule rank, x's start class): CSR over rank * N_CLASSES + class.
    x qualifies for rule r = (a, b) when one of its first-piece intervals (b, s, e) has s <= r < e."""
    n = rules.shape[0]
    multi = np.flatnonzero(rules[:, 0] >= 0)
    right_offsets, right_ranks = _csr(rules[multi, 1], multi, n)
    count = 0
    for x in range(n):
        for j in range(first_offsets[x], first_offsets[x + 1]):
            count += _rules_in(right_offsets, right_ranks, first[j, 0], first[j, 1], first[j, 2]).shape[0]
    keys = np.empty(count, dtype=np.int64)
    xs = np.empty(count, dtype=np.int64)
    count = 0
    for x in range(n):
        for j in range(first_offsets[x], first_offsets[x + 1]):
            for r in _rules_in(right_offsets, right_ranks, first[j, 0], first[j, 1], first[j, 2]):
                keys[count], xs[count] = r * N_CLASSES + start_class[x], x
                count += 1
    return _csr(keys, xs, n * N_CLASSES)


@numba.njit(cache=True, nogil=True)
def _fill_rows(out_words, first_row, end_row, last, last_offsets, left_offsets, left_ranks, allowed, x_offsets, xs):
    """Rows [first_row, end_row) of the mask (as uint64 words): for each last-piece interval (a, s, e) of p,
    every rule of left piece a and rank in [s, e), and its x's of the start classes p allows."""
    n = allowed.shape[0]
    for p in range(first_row, end_row):
        row = out_words[p]
        row[:] = 0
        if p >= n or allowed[p] == 0:
            continue
        for j in range(last_offsets[p], last_offsets[p + 1]):
            for r in _rules_in(left_offsets, left_ranks, last[j, 0], last[j, 1], last[j, 2]):
                for c in range(N_CLASSES):
                    if allowed[p] >> c & 1:
                        k = r * N_CLASSES + c
                        for i in range(x_offsets[k], x_offsets[k + 1]):
                            x = xs[i]
                            row[x >> 6] |= np.uint64(1) << np.uint64(x & 63)


@numba.njit(cache=True, nogil=True)
def _rule_lists(first, first_offsets, rules, start_class):
    """The rules by left piece (CSR of ascending ranks) and the x's by (rank, start class)."""
    n = rules.shape[0]
    multi = np.flatnonzero(rules[:, 0] >= 0)
    left_offsets, left_ranks = _csr(rules[multi, 0], multi, n)
    x_offsets, xs = _candidates(first, first_offsets, rules, start_class)
    return left_offsets, left_ranks, x_offsets, xs


class TokenizerTables(NamedTuple):
    """What the build needs from the tokenizer, computed before the clock (about 1 s, in Python)."""
    data: np.ndarray         # uint8: every token's bytes, in id order
    offsets: np.ndarray      # int64 [n + 1]: token t is data[offsets[t]:offsets[t + 1]]
    byte_token: np.ndarray   # int64 [256]: the id of each single byte
    pair_keys: np.ndarray    # int64, sorted: u << 16 | v for each pair of tokens whose bytes joined are a token
    pair_token: np.ndarray   # int64: that token
    start_class: np.ndarray  # int64 [n]: class of each token's first character
    allowed: np.ndarray      # int64 [n]: bit set of the x start classes a seam merge may follow p with


def tokenizer_tables(ranks=None):
    """TokenizerTables of `ranks` (token bytes -> id; default GPT-2's 50,256 mergeable ranks)."""
    ranks = gpt2()._mergeable_ranks if ranks is None else ranks
    tokens = token_bytes(ranks)
    start_class, allowed = seam_tables(tokens)
    pair_keys, pair_token = pair_table(ranks, tokens)
    return TokenizerTables(
        data=np.frombuffer(b"".join(tokens), dtype=np.uint8),
        offsets=np.concatenate([[0], np.cumsum([len(b) for b in tokens])]).astype(np.int64),
        byte_token=np.array([ranks[bytes([c])] for c in range(256)], dtype=np.int64),
        pair_keys=pair_keys, pair_token=pair_token, start_class=start_class, allowed=allowed)


def fill_canonical_mask(out, tables, threads=1):
    """Write the mask into `out` (uint8 [vocab_size, vocab_size // 8], vocab_size a multiple of 64 and at least
    the token count; rows and columns past the tokens are zeroed). The BPE replay and the rule lists run on
    the calling thread, the rows on `threads` threads; every kernel releases the GIL, so this may run in a
    background thread beside training (the record builds it on the clock so)."""
    n = tables.offsets.shape[0] - 1
    vocab_size = out.shape[0]
    if vocab_size % 64 or vocab_size < n or out.shape != (vocab_size, vocab_size // 8) or out.dtype != np.uint8 \
            or not out.flags.c_contiguous:
        raise ValueError(f"canonical mask: out must be a C-contiguous uint8 [V, V // 8], V a multiple of 64 and at "
                         f"least the tokenizer's {n} tokens (got {out.dtype} {out.shape})")
    first, first_offsets, last, last_offsets, rules = _trajectories(
        tables.data, tables.offsets, tables.byte_token, tables.pair_keys, tables.pair_token)
    left_offsets, left_ranks, x_offsets, xs = _rule_lists(first, first_offsets, rules, tables.start_class)
    words = out.view(np.uint64)
    bounds = np.linspace(0, vocab_size, max(1, int(threads)) + 1).astype(np.int64)
    work = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
    run = lambda rows: _fill_rows(words, rows[0], rows[1], last, last_offsets, left_offsets, left_ranks,
                                  tables.allowed, x_offsets, xs)
    if len(work) == 1:
        run(work[0])
    else:
        with ThreadPoolExecutor(len(work)) as pool:
            list(pool.map(run, work))
    return out


def build_canonical_mask(vocab_size=PADDED_VOCAB, ranks=None, threads=None):
    """uint8 [vocab_size, vocab_size // 8]: bit x of row p set when the tokenizer never emits x after p.

    `ranks` maps token bytes -> token id (default GPT-2's mergeable ranks: 50,256 tokens, ids 0..50255);
    `vocab_size` must be a multiple of 64 and at least the token count. `threads` defaults to the cores."""
    ranks = gpt2()._mergeable_ranks if ranks is None else ranks
    vocab_size = int(vocab_size)
    if vocab_size % 64 or vocab_size < len(ranks):
        raise ValueError(f"canonical mask: vocab_size {vocab_size} must be a multiple of 64 and at least the "
                         f"tokenizer's {len(ranks)} tokens")
    out = np.empty((vocab_size, vocab_size // 8), dtype=np.uint8)
    return fill_canonical_mask(out, tokenizer_tables(ranks), threads or os.cpu_count() or 1)


def is_masked(mask, p, x):
    """Bit (p, x) of a packed mask (elementwise for arrays)."""
    return (mask[p, np.asarray(x) >> 3] >> (np.asarray(x) & 7) & 1).astype(bool)


def load_or_build(path, vocab_size=PADDED_VOCAB, ranks=None):
    """The mask cached at `path` (.npy), built (with `ranks`, default GPT-2's) and saved there first if
    the file is missing or holds another shape."""
    if os.path.exists(path):
        mask = np.load(path)
        if mask.shape == (vocab_size, vocab_size // 8) and mask.dtype == np.uint8:
            return mask
    mask = build_canonical_mask(vocab_size, ranks)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    np.save(path, mask)
    return mask


def main(argv=None):
    parser = argparse.ArgumentParser(description="Build the canonical-token mask of GPT-2's tokenizer (the "
                                     "record's final-validation mask), print its time and memory, and save it as .npy.")
    parser.add_argument("--out", default=None, help="where to save it (.npy); omit to only time the build")
    parser.add_argument("--vocab-size", type=int, default=PADDED_VOCAB,
                        help=f"rows/columns, a multiple of 64 (default {PADDED_VOCAB}, the model's padded vocabulary)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="threads for the rows (default: all cores)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    tables = tokenizer_tables()
    t1 = time.perf_counter()
    out = np.empty((args.vocab_size, args.vocab_size // 8), dtype=np.uint8)
    fill_canonical_mask(out, tables, args.threads)
    t2 = time.perf_counter()
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    pairs = int(np.bitwise_count(out.view(np.uint64)).sum())
    print(f"canonical mask {args.vocab_size} x {args.vocab_size}: {pairs:,} pairs masked; tokenizer tables "
          f"{t1 - t0:.2f} s, mask {t2 - t1:.2f} s on {args.threads} threads; peak RSS {peak_mib:.0f} MiB")
    if args.out:
        np.save(args.out, out)
        print(f"saved {args.out}")


if __name__ == "__main__":
    main()
