"""Hint statistics: coverage (share of positions with a hint) and accuracy (hint == next token),
per length, per kind, per count bucket and per purity bucket, for a token stream and an index.

The hint at position t is for the token at t+1, so the last position of a stream is not
scored. Long streams are looked up in chunks (HintIndex.lookup_span), so every scored
position sees its whole n-gram. Document boundaries apply (hints.cells): by default an n-gram
restarts at every BOS, and the stats say which rule they used.
"""
import numpy as np

from ..cells import BOS, check_boundary, describe_boundary, document_hints
from ..kinds import N_COUNT_BUCKETS, N_PURITY_BUCKETS, count_bucket_label, kind_parts, n_kinds, purity_bucket_label

STATS_CHUNK = 1 << 22  # positions per lookup call: bounds the memory of stats on long streams


def hint_stats(index, tokens, chunk=STATS_CHUNK, progress=None, boundary=BOS):
    """Counts of scored positions, hinted positions and correct hints, per length and per kind,
    with n-grams restarting at every `boundary` token (None: no restarts)."""
    tokens = np.asarray(tokens)
    boundary = check_boundary(boundary)
    K = index.geom.n_lengths
    n_scored = max(0, tokens.size - 1)
    covered = np.zeros(K, dtype=np.int64)
    correct = np.zeros(K, dtype=np.int64)
    kind_covered = np.zeros(n_kinds(K), dtype=np.int64)
    kind_correct = np.zeros(n_kinds(K), dtype=np.int64)
    for a in range(0, n_scored, chunk):
        b = min(n_scored, a + chunk)
        h = document_hints(index, tokens, a, b, index.geom.lengths, boundary)
        tok, kind = h.token, h.kind
        nxt = tokens[a + 1:b + 1].astype(np.int32)
        has = tok >= 0
        right = has & (tok == nxt[None, :])
        covered += has.sum(axis=1)
        correct += right.sum(axis=1)
        kind_covered += np.bincount(kind[has], minlength=kind_covered.size)
        kind_correct += np.bincount(kind[right], minlength=kind_correct.size)
        if progress is not None:
            progress.update(b - a)
    return dict(lengths=list(index.geom.lengths), positions=n_scored, boundary=int(boundary), covered=covered.tolist(),
                correct=correct.tolist(), kind_covered=kind_covered.tolist(), kind_correct=kind_correct.tolist())


def _ratio(a, b):
    return a / b if b else float("nan")


def grouped(stats):
    """Per (length, count bucket) and per (length, purity bucket) rows derived from the kind counts."""
    kc, kr = np.array(stats["kind_covered"]), np.array(stats["kind_correct"])
    length_i, cb, pb = kind_parts(np.arange(kc.size))
    rows = []
    for li, L in enumerate(stats["lengths"]):
        for name, part, n, label in (("count", cb, N_COUNT_BUCKETS, count_bucket_label),
                                     ("purity", pb, N_PURITY_BUCKETS, purity_bucket_label)):
            for bucket in range(n):
                sel = (length_i == li) & (part == bucket)
                cov, cor = int(kc[sel].sum()), int(kr[sel].sum())
                rows.append(dict(length=L, by=name, bucket=label(bucket), covered=cov, correct=cor,
                                 coverage=_ratio(cov, stats["positions"]), accuracy=_ratio(cor, cov)))
    return rows


def format_stats(stats, per_kind=True):
    n = stats["positions"]
    lines = [f"{n:,} positions scored; {describe_boundary(stats.get('boundary'))}", "", "length  coverage  accuracy      hinted     correct"]
    for L, cov, cor in zip(stats["lengths"], stats["covered"], stats["correct"]):
        lines.append(f"{L:>6}  {_ratio(cov, n):8.2%}  {_ratio(cor, cov):8.2%}  {cov:>10,}  {cor:>10,}")
    lines += ["", "length  by      bucket       coverage  accuracy"]
    for r in grouped(stats):
        if r["covered"]:
            lines.append(f"{r['length']:>6}  {r['by']:<6}  {r['bucket']:<11}  {r['coverage']:8.3%}  {r['accuracy']:8.2%}")
    if per_kind:
        kc, kr = stats["kind_covered"], stats["kind_correct"]
        lines += ["", "kind  length  count   purity       coverage  accuracy"]
        for k in range(len(kc)):
            if kc[k]:
                li, cb, pb = (int(x) for x in kind_parts(k))
                lines.append(f"{k:>4}  {stats['lengths'][li]:>6}  {count_bucket_label(cb):<6}  "
                             f"{purity_bucket_label(pb):<11}  {_ratio(kc[k], n):8.3%}  {_ratio(kr[k], kc[k]):8.2%}")
    return "\n".join(lines)
