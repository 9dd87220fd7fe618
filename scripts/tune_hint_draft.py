"""The hints policy's settings by measurement: replay a held-out text with every (index order,
least count, least purity) of a grid and with llama.cpp's rule, and pick the setting with the
most accepted drafts among those whose acceptance is at least llama.cpp's.

    python scripts/tune_hint_draft.py --tokens 'data/local_corpus/val_*.bin' --max-tokens 100000 \\
        --index runs/demo.idx --static-cache runs/demo.ngstatic --json runs/tune_hints.json

The text should not be the one the figures are reported on (docs/inference.md uses validation
tokens 0-100,000 to choose and 100,000-300,000 to report). hints/draft/from_hints.py's MIN_COUNT,
MIN_PURITY and INDEX_FIRST hold the choice.
"""
import argparse
import json

from data.units import parse_token_count
from hints.draft import load_static, replay, replay_hints
from hints.index import HintIndex
from hints.tokens import read_all

COUNTS = (1, 2, 3, 5, 9)
PURITIES = (0.3, 0.5, 0.7, 0.9)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", required=True, help="the held-out text (.bin glob or .npy)")
    p.add_argument("--max-tokens", type=parse_token_count, default=100_000)
    p.add_argument("--index", required=True)
    p.add_argument("--static-cache", help="llama.cpp's static cache for the reference acceptance")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--n-draft", type=int, default=16)
    p.add_argument("--json")
    args = p.parse_args(argv)
    text = read_all(args.tokens, args.max_tokens)
    idx = HintIndex.load(args.index, mmap=False)
    st = load_static(args.static_cache)[0] if args.static_cache else None
    ref = replay(text, args.n_ctx, args.n_draft, st)
    ref_pct = 100 * ref["n_accept"] / max(ref["n_drafted"], 1)
    print(f"llama.cpp's rule: {ref['n_accept']:,} of {ref['n_drafted']:,} accepted ({ref_pct:.2f}%)")
    rows = []
    for first in (True, False):
        for c in COUNTS:
            for pur in PURITIES:
                r = replay_hints(text, args.n_ctx, args.n_draft, idx, c, pur, first)
                pct = 100 * r["n_accept"] / max(r["n_drafted"], 1)
                rows.append(dict(index_first=first, min_count=c, min_purity=pur, n_drafted=r["n_drafted"],
                                 n_accept=r["n_accept"], accept_pct=pct))
                print(f"index {'first' if first else 'last '} count >= {c} purity >= {pur}: {r['n_accept']:,} of "
                      f"{r['n_drafted']:,} ({pct:.2f}%)", flush=True)
    ok = [r for r in rows if r["n_accept"] * ref["n_drafted"] >= ref["n_accept"] * r["n_drafted"]]
    best = max(ok, key=lambda r: r["n_accept"]) if ok else None
    print(f"chosen: {best}" if best else "no setting reaches llama.cpp's acceptance")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(llama=ref, grid=rows, chosen=best), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
