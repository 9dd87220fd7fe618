"""`python -m hints draft-stats`: llama-lookup-stats's replay of a text, for either drafting policy.

The text (--tokens) is replayed as if a model had written it (hints/draft/llama.py, `replay`): drafts
are compared with the text's next tokens, so acceptance here is the n-gram caches' own, not a
model's (scripts/generate.py measures that). Printed and written (--json), as the second
ledger set of docs/inference.md: n_drafted, n_accept, accept_pct, n_chunks, drafting time per
drafted token (the context-cache updates included, as llama-lookup-stats counts them), the
caches' build and load time and bytes, and the process's peak memory.
"""
import json
import os
import resource
import tempfile
import time

from tqdm import tqdm

from data.units import parse_token_count

from ..index import DEFAULT_LENGTHS, Geometry, HintIndex
from ..tokens import count_tokens, read_all
from . import from_hints
from .llama import replay
from .static import build_static, load_static, save_static, static_nbytes

DEFAULT_N_CTX = 4096   # llama-lookup-stats's default context (and the write-up's)
DEFAULT_N_DRAFT = 16   # llama.cpp's lookup examples' default --draft


def add_draft_stats_args(p):
    p.add_argument("--tokens", required=True, help="the text replayed: token shards (.bin glob) or .npy")
    p.add_argument("--max-tokens", type=parse_token_count, default=None, help="replay at most this many tokens")
    p.add_argument("--policy", choices=("llama", "hints"), default="llama",
                   help="llama: llama.cpp's context/dynamic/static caches and thresholds; hints: this repo's index "
                        "(6/10/20-grams) first, then the context and dynamic caches")
    p.add_argument("--static-tokens", default=None, help="llama: shards the static (2-gram) cache is built from")
    p.add_argument("--static-max-tokens", type=parse_token_count, default=None, help="use at most this many of them")
    p.add_argument("--static-cache", default=None, help="llama: the static cache file: loaded when it exists, else "
                   "built from --static-tokens and written there (default: a temporary file, removed after)")
    p.add_argument("--index", default=None, help="hints: a saved hint index (python -m hints build)")
    p.add_argument("--hint-files", default=None, help="hints: shards to build the index from instead of --index")
    p.add_argument("--min-count", type=int, default=None, help="hints: least n-gram count of an index draft")
    p.add_argument("--min-purity", type=float, default=None, help="hints: least purity of an index draft")
    p.add_argument("--index-order", choices=("first", "last"), default=None,
                   help="hints: the index before the context and dynamic caches, or after them")
    p.add_argument("--n-ctx", type=int, default=DEFAULT_N_CTX, help="tokens per replayed chunk")
    p.add_argument("--n-draft", type=int, default=DEFAULT_N_DRAFT, help="most tokens drafted at a time")
    p.add_argument("--json", default=None, help="write the figures to this JSON file")


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def static_cache(args, res):
    """The static cache, built (timed) and written as one file, then loaded (timed) from it."""
    path, tmp = args.static_cache, None
    if path and os.path.exists(path):
        res["static_build_s"] = None
    else:
        if not args.static_tokens:
            raise ValueError(f"--static-cache {path}: no such file; give --static-tokens to build it")
        toks = read_all(args.static_tokens, args.static_max_tokens)
        t0 = time.perf_counter()
        st = build_static(toks)
        res["static_build_s"] = time.perf_counter() - t0
        if path is None:
            fd, tmp = tempfile.mkstemp(suffix=".ngstatic")
            os.close(fd)
            path = tmp
        save_static(st, path, toks.size)
        del st, toks
    try:
        t0 = time.perf_counter()
        st, n = load_static(path)
        res["static_load_s"] = time.perf_counter() - t0
    finally:
        if tmp:
            os.unlink(tmp)
    res.update(static_tokens=n, static_bytes=static_nbytes(st), static_file=args.static_cache)
    return st


def hint_index(args, res):
    """The index of the hints policy: --index read into memory (timed), or built from --hint-files (timed)."""
    if args.index:
        t0 = time.perf_counter()
        idx = HintIndex.load(args.index, mmap=False)
        res.update(index_load_s=time.perf_counter() - t0, index_build_s=None, index=args.index)
    else:
        n = count_tokens(args.hint_files)
        idx = HintIndex(Geometry.for_tokens(n, lengths=DEFAULT_LENGTHS), workers=2)
        t0 = time.perf_counter()
        idx.add(read_all(args.hint_files)).seal()
        res.update(index_build_s=time.perf_counter() - t0, index_load_s=None, index=args.hint_files)
    res.update(index_tokens=int(idx.tokens_added), index_bytes=int(idx.geom.nbytes))
    return idx


def run_draft_stats(args):
    if args.n_ctx < 2 or args.n_draft < 1:
        raise ValueError(f"--n-ctx {args.n_ctx} / --n-draft {args.n_draft}: expected >= 2 and >= 1")
    if args.policy == "hints" and not (args.index or args.hint_files):
        raise ValueError("--policy hints: give --index (a saved hint index) or --hint-files (shards to build one)")
    if args.policy == "llama" and (args.index or args.hint_files):
        raise ValueError("--index / --hint-files: only for --policy hints")
    res = dict(policy=args.policy, tokens=args.tokens, n_ctx=args.n_ctx, n_draft=args.n_draft)
    text = read_all(args.tokens, args.max_tokens)
    res["n_tokens"] = int(text.size)
    if text.size <= args.n_ctx:
        raise ValueError(f"--tokens {args.tokens}: {text.size:,} tokens, fewer than one chunk of --n-ctx {args.n_ctx} "
                         f"(+1) to replay")
    with tqdm(total=text.size // args.n_ctx * args.n_ctx, unit="tok", unit_scale=True, desc="replay") as bar:
        if args.policy == "llama":
            st = static_cache(args, res) if (args.static_tokens or args.static_cache) else None
            out = replay(text, args.n_ctx, args.n_draft, st, progress=bar)
        else:
            idx = hint_index(args, res)
            c = from_hints.MIN_COUNT if args.min_count is None else args.min_count
            p = from_hints.MIN_PURITY if args.min_purity is None else args.min_purity
            first = from_hints.INDEX_FIRST if args.index_order is None else args.index_order == "first"
            res.update(min_count=c, min_purity=p, index_order="first" if first else "last")
            out = from_hints.replay_hints(text, args.n_ctx, args.n_draft, idx, c, p, first, progress=bar)
    res.update(out)
    res["accept_pct"] = 100 * out["n_accept"] / max(out["n_drafted"], 1)
    res["draft_us_per_drafted"] = 1e6 * out["draft_s"] / max(out["n_drafted"], 1)
    res["peak_rss_mib"] = peak_rss_mib()
    print(format_stats(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


def format_stats(r):
    fmt = lambda v, unit="s": "-" if v is None else f"{v:.3f} {unit}"  # noqa: E731
    lines = [f"policy {r['policy']}: {r['n_tokens']:,} tokens in {r['n_chunks']} chunks of {r['n_ctx']}, "
             f"n_draft {r['n_draft']}",
             f"  n_drafted {r['n_drafted']:,}  n_accept {r['n_accept']:,}  accept {r['accept_pct']:.3f}%",
             f"  drafting {r['draft_s']:.3f} s, {r['draft_us_per_drafted']:.3f} us per drafted token "
             f"(merging chunks into the dynamic cache {r['merge_s']:.3f} s; dynamic cache {r['dynamic_bytes'] / 2**20:.1f} MiB)"]
    if "static_load_s" in r:
        lines.append(f"  static cache: {r['static_tokens']:,} tokens, {r['static_bytes'] / 2**20:.1f} MiB, build "
                     f"{fmt(r['static_build_s'])}, load {fmt(r['static_load_s'])}")
    if "index_bytes" in r:
        lines.append(f"  hint index: {r['index_tokens']:,} tokens, {r['index_bytes'] / 2**20:.1f} MiB, build "
                     f"{fmt(r['index_build_s'])}, load {fmt(r['index_load_s'])}; min count {r['min_count']}, "
                     f"min purity {r['min_purity']}, index {r['index_order']}")
    lines.append(f"  peak memory (process RSS) {r['peak_rss_mib']:.0f} MiB")
    return "\n".join(lines)
