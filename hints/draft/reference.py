"""Plain-Python statement of llama.cpp's drafting rule and of its replay (llama-lookup-stats).

Dicts of n-gram tuples to {follower: count}, read straight from the rule as docs/inference.md
states it; hints/draft/llama.py is the fast form and tests require the two to agree exactly. The
rule's numbers are stated here, from llama.cpp itself, not taken from the code under test.
"""
# llama.cpp (ggml-org/llama.cpp), common/ngram-cache.h: LLAMA_NGRAM_MIN, LLAMA_NGRAM_MAX, LLAMA_NGRAM_STATIC.
NGRAM_MIN, NGRAM_MAX, NGRAM_STATIC = 1, 4, 2
# llama.cpp, common/ngram-cache.cpp, by n-gram length: the context cache is tried with the "lax"
# thresholds (draft_min_sample_size_lax, draft_min_percent_lax), the dynamic cache with the
# "strict" ones (draft_min_sample_size_strict, draft_min_percent_strict). A length's pick is taken
# when its n-gram's follower total is at least the minimum and 100 x the pick's count is at least
# the percent x the total.
CONTEXT_MIN_TOTAL = {1: 2, 2: 2, 3: 1, 4: 1}
CONTEXT_MIN_PERCENT = {1: 66, 2: 50, 3: 50, 4: 50}
DYNAMIC_MIN_TOTAL = {1: 4, 2: 3, 3: 2, 4: 2}
DYNAMIC_MIN_PERCENT = {1: 75, 2: 66, 3: 66, 4: 66}
# ngram-cache.cpp's static try_draft: the lax entry of length LLAMA_NGRAM_STATIC (2), on the most
# frequent follower of the last 2 tokens.
STATIC_MIN_TOTAL, STATIC_MIN_PERCENT = CONTEXT_MIN_TOTAL[NGRAM_STATIC], CONTEXT_MIN_PERCENT[NGRAM_STATIC]
# ngram-cache.cpp's primary try_draft: a follower's score is its count times 100 x its count after
# the last 2 tokens in the static cache, or times 1 when it is not there.
STATIC_WEIGHT = 100


def count_ngrams(cache, seq, lengths, first=0):
    """Add to cache the n-grams of the given lengths that end before each token seq[i], i >= first."""
    for i in range(first, len(seq)):
        for L in lengths:
            if i >= L:
                followers = cache.setdefault(tuple(seq[i - L:i]), {})
                followers[seq[i]] = followers.get(seq[i], 0) + 1


def static_cache(tokens):
    cache = {}
    count_ngrams(cache, [int(t) for t in tokens], (NGRAM_STATIC,))
    return cache


def pick_primary(cache, seq, static_part, min_total, min_percent):
    for L in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
        if L > len(seq):
            continue
        followers = cache.get(tuple(seq[len(seq) - L:]))
        if not followers:
            continue
        total = sum(followers.values())
        scores = {y: c * (STATIC_WEIGHT * static_part[y] if y in static_part else 1) for y, c in followers.items()}
        pick = min(scores, key=lambda y: (-scores[y], y))
        if total >= min_total[L] and 100 * followers[pick] >= min_percent[L] * total:
            return pick
    return None


def draft(seq, n_draft, context, dynamic, static):
    """The tokens drafted after seq (a list of ids) from the three caches."""
    seq = list(seq)
    if len(seq) < NGRAM_STATIC:
        return []
    out = []
    while len(out) < n_draft:
        ext = seq + out
        static_part = static.get(tuple(ext[-NGRAM_STATIC:]), {})
        tok = pick_primary(context, ext, static_part, CONTEXT_MIN_TOTAL, CONTEXT_MIN_PERCENT)
        if tok is None:
            tok = pick_primary(dynamic, ext, static_part, DYNAMIC_MIN_TOTAL, DYNAMIC_MIN_PERCENT)
        if tok is None and static_part:
            total = sum(static_part.values())
            best = min(static_part, key=lambda y: (-static_part[y], y))
            if total >= STATIC_MIN_TOTAL and 100 * static_part[best] >= STATIC_MIN_PERCENT * total:
                tok = best
        if tok is None:
            break
        out.append(tok)
    return out


def replay(tokens, n_ctx, n_draft, static_tokens=None):
    """(n_drafted, n_accept, n_chunks) of llama-lookup-stats over tokens."""
    tokens = [int(t) for t in tokens]
    static = static_cache(static_tokens) if static_tokens is not None else {}
    dynamic = {}
    drafted = accepted = chunks = 0
    start = 0
    while start + n_ctx < len(tokens):
        chunk = tokens[start:start + n_ctx]
        out, context = [chunk[0]], {}
        while len(out) < n_ctx:
            d = draft(out, n_draft, context, dynamic, static)
            drafted += len(d)
            for y in d:
                if len(out) >= n_ctx or y != chunk[len(out)]:
                    break
                accepted += 1
                out.append(y)
                count_ngrams(context, out, range(NGRAM_MIN, NGRAM_MAX + 1), len(out) - 1)
            if len(out) < n_ctx:
                out.append(chunk[len(out)])
                count_ngrams(context, out, range(NGRAM_MIN, NGRAM_MAX + 1), len(out) - 1)
        for ngram, followers in context.items():
            merged = dynamic.setdefault(ngram, {})
            for y, c in followers.items():
                merged[y] = merged.get(y, 0) + c
        chunks += 1
        start += n_ctx
    return drafted, accepted, chunks
