"""The 64-bit n-gram fingerprint the exact counters compare n-grams by (hints.exact's torch
backend and Triton kernels) and the positional index's rows are keyed by, defined once here.

An n-gram of length L ending at position t is compared by a 64-bit fingerprint

    F_L(t) = sum_{i=0..L-1} (s[t-i] + 1) * A[i]    mod 2^64     (then 0 -> 1: 0 marks empty)

with A[i] fixed pseudo-random 64-bit multipliers (splitmix64), indexed by the distance from
the n-gram's last token, so F_10 extends F_6 by four terms. Why collisions are negligible:
for two different n-grams, let i be a position where they differ whose token difference d
has the fewest factors of two, 2^s (s <= 15, since |d| < 2^16; s = 0 whenever d is odd).
Over random multipliers, d * A[i] is uniform on the multiples of 2^s, so the two
fingerprints are equal with probability 2^(s-64), i.e. 2^-64 for most pairs. A count goes
wrong only if a training n-gram that is not a query n-gram shares a query n-gram's
fingerprint: with 10^7 distinct query n-grams and 10^10 distinct training n-grams per
length that is about 10^17 pairs x 2^-63 ~ 0.01 expected wrong follower counts over a 10B-token
count. Measured: `fingerprint_collisions` compares fingerprints with the exact n-gram
tuples; `python -m hints exact-bench` reports it on a real corpus, and the tests assert zero
collisions on standard-library text.
"""
import numpy as np

from .tokens import as_tokens

M64 = (1 << 64) - 1
FINGERPRINT_SEED = 0x6E6772616D73  # seed of the multipliers A[i] ("ngrams" in ASCII)
SPLITMIX_GAMMA = 0x9E3779B97F4A7C15  # splitmix64 (Steele, Lea, Flood 2014): increment and mixing constants
SPLITMIX_C1 = 0xBF58476D1CE4E5B9
SPLITMIX_C2 = 0x94D049BB133111EB


def multipliers(n):
    """The first n fingerprint multipliers A[0..n-1] as Python ints (uint64 values)."""
    out, state = [], FINGERPRINT_SEED
    for _ in range(n):
        state = (state + SPLITMIX_GAMMA) & M64
        z = state
        z = ((z ^ (z >> 30)) * SPLITMIX_C1) & M64
        z = ((z ^ (z >> 27)) * SPLITMIX_C2) & M64
        out.append(z ^ (z >> 31))
    return out


def fingerprint(ngram):
    """F_L of one n-gram (a sequence of token ids, oldest first) as a Python int: the definition
    the backends implement (module docstring)."""
    a = multipliers(len(ngram))
    f = sum((int(x) + 1) * a[i] for i, x in enumerate(reversed(list(ngram)))) & M64
    return f or 1


def fingerprints_numpy(tokens, length):
    """uint64 fingerprints of every n-gram of `length` in `tokens` (position t = L-1 .. n-1, the
    n-gram's last token), with NumPy's wrapping uint64 arithmetic. For measuring collisions."""
    x = as_tokens(tokens).astype(np.uint64) + np.uint64(1)
    n = x.size - length + 1
    if n <= 0:
        return np.zeros(0, dtype=np.uint64)
    f = np.zeros(n, dtype=np.uint64)
    for i, a in enumerate(multipliers(length)):
        f += x[length - 1 - i:length - 1 - i + n] * np.uint64(a)
    f[f == 0] = 1
    return f


def fingerprint_collisions(tokens, length, bits=64):
    """(distinct n-grams, distinct fingerprints) of every n-gram of `length` in `tokens`: equal
    when no two different n-grams share a fingerprint. bits < 64 keeps only the low bits (to see
    how many a corpus would need)."""
    t = as_tokens(tokens)
    if t.size < length:
        return 0, 0
    windows = np.lib.stride_tricks.sliding_window_view(t, length)
    rows = np.ascontiguousarray(windows).view(np.dtype((np.void, 2 * length))).reshape(-1)
    f = fingerprints_numpy(t, length)
    if bits < 64:
        f &= np.uint64((1 << bits) - 1)
    return int(np.unique(rows).size), int(np.unique(f).size)
