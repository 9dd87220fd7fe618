"""The four ledgers of n-gram drafting for one checkpoint and index, medians of repeats.

    python scripts/inference_bench.py --checkpoint runs/demo/ckpt.pt --index runs/demo.idx \\
        --static-cache runs/demo.ngstatic --prompts 'data/local_corpus/val_*.bin' --json runs/bench.json

In one process, for each repeat, the same prompts are generated greedily with no drafting,
llama.cpp's drafting and the hints policy, in turn (so machine noise falls on all three alike):
  1 drafting latency   us per drafted token (the drafter's own time, measured around its calls);
  2 acceptance         accepted / drafted, with the model verifying;
  3 caches             load time of the index (mapped) and of the static cache (one buffer), and
                       their bytes; the process's peak RSS;
  4 end to end         generated tokens per second over all prompts, and the ratio to no drafting.
Each figure is the median over --repeats runs with its min-max; the script also checks that every
drafted run's tokens equal the undrafted run's (greedy, or seeded sampling: one draw per token).
"""
import argparse
import json
import statistics
import time

import numpy as np
import torch

from data.tokenizer import gpt2
from hints.draft import HintDrafter, LlamaDrafter, load_static, static_nbytes
from hints.index import HintIndex
from hints.tokens import read_all
from train.inference import Generator, load_model, open_index, peak_rss_mib

BOS = 50256


def prompts_from(pattern, n, length):
    """n prompts of `length` tokens: the starts of the first n documents of the shards that are long enough."""
    toks = read_all(pattern, 4_000_000).astype(np.int64)
    starts = np.flatnonzero(toks == BOS) + 1
    out = []
    for s in starts:
        if s + 2 * length < toks.size and not (toks[s:s + 2 * length] == BOS).any():
            out.append(toks[s:s + length])
        if len(out) == n:
            break
    return out


def spread(xs):
    return dict(median=statistics.median(xs), min=min(xs), max=max(xs), n=len(xs))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--index", required=True)
    p.add_argument("--static-cache", help="llama.cpp's static cache file (python -m hints draft-stats --static-cache)")
    p.add_argument("--prompts", required=True, help="shards whose documents' starts are the prompts")
    p.add_argument("--n-prompts", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--n-draft", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; else sample-then-compare (seeded)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-hints", action="store_true", help="generate with the backbone alone (drafting still uses the index)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, lengths = load_model(args.checkpoint)
    loads = dict(index=[], static=[])
    for _ in range(args.repeats):
        index, s = open_index(args.index, None, lengths)
        loads["index"].append(s)
        if args.static_cache:
            t0 = time.perf_counter()
            static, _ = load_static(args.static_cache)
            loads["static"].append(time.perf_counter() - t0)
    static = static if args.static_cache else None
    gen = Generator(model, None if args.no_hints else index)
    prompts = prompts_from(args.prompts, args.n_prompts, args.prompt_tokens)
    drafters = dict(none=None, llama=LlamaDrafter(static), hints=HintDrafter(index))
    for d in drafters.values():  # warm-up, untimed
        gen.generate(prompts[0], 4, drafter=d, n_draft=args.n_draft)
    runs = {k: [] for k in drafters}
    identical = True
    for r in range(args.repeats):
        ref = None
        for name, d in drafters.items():
            outs = [gen.generate(pr, args.max_new_tokens, drafter=d, n_draft=args.n_draft, temperature=args.temperature,
                                 top_k=args.top_k, seed=args.seed + i) for i, pr in enumerate(prompts)]
            toks = [o["tokens"] for o in outs]
            ref = toks if ref is None else ref
            identical &= toks == ref
            n_new, secs = sum(o["n_new"] for o in outs), sum(o["seconds"] for o in outs)
            drafted, acc = sum(o["n_drafted"] for o in outs), sum(o["n_accept"] for o in outs)
            runs[name].append(dict(tokens_per_s=n_new / secs, n_drafted=drafted, n_accept=acc,
                                   accept_pct=100 * acc / max(drafted, 1), forwards=sum(o["n_forwards"] for o in outs),
                                   draft_us_per_token=1e6 * sum(o["draft_s"] for o in outs) / max(drafted, 1)))
        print(f"repeat {r + 1}/{args.repeats}: " + ", ".join(f"{k} {v[-1]['tokens_per_s']:.1f} tok/s" for k, v in runs.items()),
              flush=True)
    res = dict(checkpoint=args.checkpoint, index=args.index, hints=not args.no_hints, prompts=len(prompts),
               temperature=args.temperature, top_k=args.top_k,
               prompt_tokens=args.prompt_tokens, max_new_tokens=args.max_new_tokens, n_draft=args.n_draft,
               threads=args.threads, repeats=args.repeats, greedy_identical=bool(identical),
               index_load_s=spread(loads["index"]), index_bytes=int(HintIndex.load(args.index).geom.nbytes),
               static_load_s=spread(loads["static"]) if loads["static"] else None,
               static_bytes=static_nbytes(static) if static is not None else None, peak_rss_mib=peak_rss_mib())
    for name, rs in runs.items():
        res[name] = {k: spread([x[k] for x in rs]) for k in rs[0]}
        res[name]["speedup"] = spread([x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(rs, runs["none"])])
    fmt = lambda s, f="{:.1f}": f"{f.format(s['median'])} [{f.format(s['min'])}-{f.format(s['max'])}]"  # noqa: E731
    print(f"\n{'':<7}{'us/drafted':>22}{'accept %':>22}{'tok/s':>22}{'x no drafting':>24}")
    for name in runs:
        r = res[name]
        print(f"{name:<7}{fmt(r['draft_us_per_token']) if name != 'none' else '-':>22}"
              f"{fmt(r['accept_pct']) if name != 'none' else '-':>22}{fmt(r['tokens_per_s']):>22}"
              f"{fmt(r['speedup'], '{:.2f}'):>24}")
    print(f"index load {fmt(res['index_load_s'], '{:.4f}')} s ({res['index_bytes'] / 2**20:.0f} MiB mapped)"
          + (f", static cache load {fmt(res['static_load_s'], '{:.4f}')} s ({res['static_bytes'] / 2**20:.1f} MiB)"
             if res["static_load_s"] else "") + f", peak RSS {res['peak_rss_mib']:.0f} MiB; tokens identical "
          f"with and without drafting: {identical}")
    print("tokens: " + " | ".join(repr(gpt2().decode([t for t in ref[i] if t < gpt2().n_vocab]))[:80]
                                  for i in range(min(2, len(ref)))))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
