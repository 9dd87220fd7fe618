"""Generate text from a trained checkpoint, with n-gram hints at every new position, and
optionally with n-gram drafting (speculative decoding verified by the model).

    python scripts/generate.py --checkpoint runs/demo/ckpt.pt --index runs/demo.idx \\
        --prompt "import os" --max-new-tokens 64
    python scripts/generate.py ... --draft hints --n-draft 16 --json runs/gen.json

With --draft llama|hints the same generation also runs without drafting, and the run prints
the four ledgers side by side (drafting latency, acceptance, the caches' load time and memory,
end-to-end tokens/s) and, at --temperature 0, whether the two outputs are identical (they must
be). docs/inference.md explains the figures.
"""
import argparse
import json
import sys
import time


import torch

from data.tokenizer import gpt2
from train.inference import Generator, InferenceError, load_model, open_index, peak_rss_mib


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a checkpoint of train_gpt.py --save-checkpoint")
    p.add_argument("--index", help="a saved hint index (python -m hints build), built with the model's lengths")
    p.add_argument("--hint-files", help="token shards to build the index from instead of --index")
    p.add_argument("--no-hints", action="store_true", help="generate with the backbone alone (no hints)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", help="the prompt text (GPT-2 tokens)")
    g.add_argument("--prompt-ids", help="the prompt as comma-separated token ids")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--draft", choices=("none", "llama", "hints"), default="none",
                   help="draft tokens with llama.cpp's n-gram caches, or from the hint index, for the model to verify")
    p.add_argument("--n-draft", type=int, default=16, help="most tokens drafted at a time")
    p.add_argument("--static-cache", help="--draft llama: a static cache file (python -m hints draft-stats "
                   "--static-cache writes one); default: no static cache")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="where the model runs")
    p.add_argument("--json", help="write tokens, text and the figures here")
    args = p.parse_args(argv)
    if args.max_new_tokens < 1 or args.n_draft < 1 or args.temperature < 0 or args.top_k < 0:
        p.error("--max-new-tokens and --n-draft must be >= 1, --temperature and --top-k >= 0")
    if not args.no_hints and not (args.index or args.hint_files):
        p.error("give --index or --hint-files (or --no-hints for the backbone alone)")
    if args.draft == "hints" and not (args.index or args.hint_files):
        p.error("--draft hints drafts from the hint index: give --index or --hint-files")
    return args


def make_drafter(args, index):
    from hints.draft import HintDrafter, LlamaDrafter, load_static
    t0 = time.perf_counter()
    if args.draft == "llama":
        drafter = LlamaDrafter(load_static(args.static_cache)[0] if args.static_cache else None)
    else:
        drafter = HintDrafter(index)
    return drafter, time.perf_counter() - t0


def ledgers(plain, drafted, load):
    """The four ledgers, the drafted run beside the same run without drafting."""
    rows = [("1 drafting latency", "-", f"{drafted['draft_ms_per_token'] * 1e3:.1f} us / drafted token"),
            ("2 acceptance (model verifies)", "-",
             f"{drafted['n_accept']}/{drafted['n_drafted']} = {drafted['accept_pct']:.1f}%"),
            ("3 cache load / memory", f"index {load['index_load_s']:.3f} s",
             f"index {load['index_load_s']:.3f} s + drafter {load['drafter_load_s']:.3f} s; peak RSS "
             f"{load['peak_rss_mib']:.0f} MiB"),
            ("4 end to end", f"{plain['tokens_per_s']:.1f} tok/s ({plain['n_forwards']} forwards)",
             f"{drafted['tokens_per_s']:.1f} tok/s ({drafted['n_forwards']} forwards), "
             f"x{drafted['tokens_per_s'] / max(plain['tokens_per_s'], 1e-9):.2f}")]
    w = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows + [("", "without drafting", "")])
    out = [f"{'ledger':<{w}}  {'without drafting':<{w1}}  with drafting"]
    out += [f"{a:<{w}}  {b:<{w1}}  {c}" for a, b, c in rows]
    return "\n".join(out)


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        model, lengths = load_model(args.checkpoint, args.device)
        index, load_s = None, 0.0
        if args.index or args.hint_files:
            index, load_s = open_index(args.index, args.hint_files, lengths)
        enc = gpt2()
        if args.prompt is not None:
            prompt = enc.encode(args.prompt, allowed_special="all")
        else:
            try:
                prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
            except ValueError:
                raise InferenceError(f"--prompt-ids {args.prompt_ids!r}: expected comma-separated integers") from None
        gen = Generator(model, None if args.no_hints else index)
        kw = dict(temperature=args.temperature, top_k=args.top_k, seed=args.seed, n_draft=args.n_draft)
        drafter, drafter_s = make_drafter(args, index) if args.draft != "none" else (None, 0.0)
        gen.generate(prompt, 2, drafter=drafter, **kw)  # warm-up, untimed: first calls load kernels
        res = gen.generate(prompt, args.max_new_tokens, drafter=drafter, **kw)
        plain = gen.generate(prompt, args.max_new_tokens, **kw) if drafter is not None else None
    except InferenceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    toks = res["tokens"]
    text = enc.decode([t for t in toks if t < enc.n_vocab])
    res.update(text=text, prompt_tokens=len(prompt), draft=args.draft, hints=not args.no_hints,
               index_load_s=load_s, drafter_load_s=drafter_s, peak_rss_mib=peak_rss_mib(), checkpoint=args.checkpoint)
    print(text)
    print(f"\n[{res['n_new']} tokens in {res['seconds']:.2f}s, {res['tokens_per_s']:.1f} tok/s; hints "
          f"{'on' if res['hints'] else 'off'}; index loaded in {load_s:.3f}s"
          + ("; stopped at the model's context" if res["capped_at_context"] else "") + "]")
    if plain is not None:
        same = plain["tokens"] == toks
        res["without_drafting"] = {k: v for k, v in plain.items() if k != "tokens"}
        res["identical_to_without_drafting"] = same
        print(ledgers(plain, res, res))
        if args.temperature == 0:
            print(f"greedy output with drafting {'==' if same else '!='} without drafting")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
