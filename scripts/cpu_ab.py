"""CPU A/Bs at demo width, two of them.

Backbone (the default): the later-record backbone features. Trains one model per variant
(the baseline speedrun GPT, each feature alone, all of them) on the same local-corpus batches
for a few steps and prints train and val loss. No hints: this measures the backbone only.

The numbers are NOT predictive of GPU scale: ~100 steps of a 4 x 256 model on 512-token
batches of Python source say little about 1,390 steps of 12 x 768 on FineWeb. They show that
every feature trains and give its sign at this size; the GPU A/B is scripts/gpu_ab.sh.

Usage: python scripts/cpu_ab.py --train-files 'data/local_corpus/train_*.bin' \
           --val-files 'data/local_corpus/val_*.bin' [--steps 100] [--variants baseline,unet_skips]
(build the corpus first: python -m data.local_corpus)

Hints (--hints OUT): the hint representations, through train_gpt.py itself (real loader, real
training-time hints, real validation). For each corpus (the standard library's source, the
man-pages prose), seed and arm, one demo-2025-preset run writes OUT/<corpus>-<arm>-s<seed>.json:
  lengths   --hint-repr lengths (per-length hints from the per-rank growing index)
  record    --hint-repr record  (the record's cells from the positional index)
  nohints   --no-hints (the same recipe trained without hints)
The model A/B (--arms model-new,model-new-nohints,model-old,model-old-nohints): the demo preset (the
record arch and its recipe) against demo-2025 (the January 2025 backbone, the lengths hints) at
equal tokens, each with and without hints (ARMS below says the flags).
The hinted arms validate with hints from the same saved HintIndex over the corpus's whole
training split (OUT/<corpus>.idx, built once, --val-index; the record's arm reads it as cells), and
each run reports val loss with and without hints. Runs
whose JSON exists are skipped, so the grid can be stopped and resumed; --table prints the
markdown table (median over seeds, [lowest, highest]) from whatever JSON is there.
    python scripts/cpu_ab.py --hints runs/hints_ab --seeds 0,1,2 [--recipe-args "--steps 300"]
    python scripts/cpu_ab.py --hints runs/hints_ab --table
(build the corpora first: python -m data.local_corpus; python -m data.prose_corpus)
"""
import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from data.loader import DistributedDataLoader, read_tokens
from hints import n_kinds
from hints.index import DEFAULT_LENGTHS
from model import GPT, GPTConfig, attention_window_blocks, build_optimizers, lr_multiplier, muon_momentum
from model.muon import Muon

# The record's momentum warm-up is 300 of 1,390 steps; a short run warms up over the same share.
MOMENTUM_WARMUP_SHARE = 300 / 1390
COOLDOWN_FRAC = 0.4        # modded-nanogpt's linear cool-down over the last 40% of the steps
# Windowed attention at demo length: blocks of 32 tokens, the window growing from one block to
# the whole 256-token sequence (the record grows 128 -> 1856 tokens of its 64K-token rows).
DEMO_ATTN_BLOCK = 32
# Features of the record's backbone that fit 4 layers (its no-attention block is block 7 of 12).
ALL_FEATURES = dict(unet_skips=True, embed_skips=True, value_embeds=2, window_attn=True, rope="half")
VARIANTS = {
    "baseline": {},
    "unet_skips": dict(unet_skips=True),
    "embed_skips": dict(embed_skips=True),
    "value_embeds": dict(value_embeds=2),
    "window_attn": dict(window_attn=True),
    "rope_half": dict(rope="half"),
    "no_attn_layer1": dict(no_attn_layers=(1,)),
    "momentum_warmup": {},   # an optimizer schedule, not a GPTConfig field
    "all": ALL_FEATURES,
}


REPO = Path(__file__).resolve().parents[1]
# The hint A/B's corpora: (train glob, val glob) under the repo (data/local_corpus.py, data/prose_corpus.py).
CORPORA = {"stdlib": ("data/local_corpus/train_*.bin", "data/local_corpus/val_*.bin"),
           "prose": ("data/local_corpus/man-pages/train_*.bin", "data/local_corpus/man-pages/val_*.bin")}
# The demo preset (the record arch, 84 steps x 1,024 tokens) against the January 2025 backbone's demo
# (demo-2025, steps of 2 x 256 tokens) at equal tokens: demo-2025 trains 84 x 1,024 / 512 = 168 steps.
# Both validate on the first 16,384 val tokens (demo's size), the record arch without its canonical
# mask (the old path has none), each hinted arm from the corpus's saved index.
EQUAL_TOKEN_STEPS_2025 = 84 * 1024 // (2 * 256)
NEW = ["--preset", "demo", "--no-canonical-mask"]
OLD = ["--preset", "demo-2025", "--steps", str(EQUAL_TOKEN_STEPS_2025), "--val-every", "0", "--val-tokens", "16384"]
# Every arm's flags, after --preset demo-2025 and before --recipe-args. An arm NAME-nohints (or
# nohints) trains without hints; its hinted partner is NAME (lengths and record pair with nohints).
ARMS = {"lengths": ["--hint-repr", "lengths"], "record": ["--hint-repr", "record"],
        "nohints": ["--no-hints", "--hint-repr", "record"],
        "model-new": NEW, "model-new-nohints": [*NEW, "--no-hints"],
        "model-old": OLD, "model-old-nohints": [*OLD, "--no-hints"]}
DEFAULT_ARMS = ("lengths", "record", "nohints")


def unhinted(arm):
    return arm.endswith("nohints")


def base_arm(arm):
    """The --no-hints arm a hinted arm's gain is paired against."""
    return f"{arm}-nohints" if f"{arm}-nohints" in ARMS else "nohints"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("the hint A/B (--hints OUT; the other flags are the backbone A/B's)")
    g.add_argument("--hints", metavar="OUT", help="run the hint-representation A/B into this folder")
    g.add_argument("--table", action="store_true", help="with --hints: print the table of the runs in OUT")
    g.add_argument("--corpora", default=",".join(CORPORA), help=f"comma-separated, of {', '.join(CORPORA)}")
    g.add_argument("--arms", default=",".join(DEFAULT_ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    g.add_argument("--seeds", default="0,1,2")
    g.add_argument("--parallel", type=int, default=1, help="runs at once (each gets cores / parallel torch threads)")
    g.add_argument("--recipe-args", default="", help="extra train_gpt.py flags for every run (the recipe), e.g. "
                   "'--steps 1000'; the table names them")
    p.add_argument("--train-files", default="data/local_corpus/train_*.bin")
    p.add_argument("--val-files", default="data/local_corpus/val_*.bin")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--val-tokens", type=int, default=16_384)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.hints:
        for name, known in (("corpora", CORPORA), ("arms", ARMS)):
            setattr(args, name, getattr(args, name).split(","))
            bad = [v for v in getattr(args, name) if v not in known]
            if bad:
                p.error(f"--{name}: unknown {bad}; expected some of {list(known)}")
        try:
            args.seeds = [int(v) for v in args.seeds.split(",")]
        except ValueError:
            p.error(f"--seeds {args.seeds!r}: expected comma-separated integers")
        if args.parallel < 1:
            p.error(f"--parallel {args.parallel}: expected >= 1")
        return args
    args.variants = args.variants.split(",")
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {unknown}; expected some of {list(VARIANTS)}")
    if args.seq_len % DEMO_ATTN_BLOCK:
        p.error(f"--seq-len must be a multiple of {DEMO_ATTN_BLOCK} (the windowed attention's block)")
    return args


@torch.no_grad()
def val_loss(model, val, T, batch_size):
    model.eval()
    n_seq = (len(val) - 1) // T
    losses = []
    for b in range(0, n_seq - batch_size + 1, batch_size):
        buf = torch.from_numpy(val[b * T:(b + batch_size) * T + 1].astype(np.int64))
        losses.append(model(buf[:-1].view(batch_size, T), buf[1:].view(batch_size, T)).item())
    model.train()
    return statistics.fmean(losses)


def run_variant(name, args, val):
    torch.manual_seed(args.seed)
    features = VARIANTS[name]
    cfg = GPTConfig(n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head, max_seq_len=args.seq_len,
                    attn_block_size=DEMO_ATTN_BLOCK, n_hint_kinds=n_kinds(len(DEFAULT_LENGTHS)), **features)
    model = GPT(cfg)
    optimizers = build_optimizers(model, arch="speedrun")
    loader = DistributedDataLoader(args.train_files, args.batch_size, args.seq_len, log=None)
    warmup = round(args.steps * MOMENTUM_WARMUP_SHARE) if name in ("momentum_warmup", "all") else 0
    losses, t0 = [], time.perf_counter()
    for step in tqdm(range(args.steps), desc=name, leave=False):
        mult = lr_multiplier(step, args.steps, cooldown_frac=COOLDOWN_FRAC)
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * mult
                if isinstance(opt, Muon):
                    group["momentum"] = muon_momentum(step, warmup_steps=warmup)
        if cfg.window_attn:
            model.set_window_blocks(attention_window_blocks(step, args.steps, DEMO_ATTN_BLOCK,
                                                            start_tokens=DEMO_ATTN_BLOCK, end_tokens=args.seq_len))
        batch = loader.next_batch()
        x, y = (torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)) for a in (batch.x, batch.y))
        loss = model(x, y)
        loss.backward()
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
        losses.append(loss.item())
    ms = (time.perf_counter() - t0) / args.steps * 1e3
    tail = losses[-max(1, args.steps // 10):]
    return dict(train=statistics.fmean(tail), val=val_loss(model, val, args.seq_len, 8), ms=ms,
                params=sum(p.numel() for p in model.parameters()))


# -- the hint A/B ------------------------------------------------------------------------------
def val_index(out, corpus):
    """The corpus's saved validation index over its whole training split (built once; both arms
    read it, lengths through lookup_span, record through lookup_cells)."""
    path = out / f"{corpus}.idx"
    if not path.exists():
        train, _ = CORPORA[corpus]
        subprocess.run([sys.executable, "-m", "hints", "build", "--tokens", str(REPO / train), "--out", str(path),
                        "--geometry", "auto"], cwd=REPO, check=True)
    return path


def run_cell(out, corpus, arm, seed, recipe, threads):
    """One train_gpt.py run; its summary JSON's path (skipped when it exists)."""
    summary = out / f"{corpus}-{arm}-s{seed}.json"
    if summary.exists():
        return summary
    train, val = CORPORA[corpus]
    cmd = [sys.executable, str(REPO / "train_gpt.py"), "--preset", "demo-2025", "--train-files", str(REPO / train),
           "--val-files", str(REPO / val), "--hint-tokens", "0",
           *(["--val-index", str(val_index(out, corpus))] if not unhinted(arm) else []), "--seed", str(seed), "--log-dir", str(out / "logs"), "--summary-json", str(summary), *ARMS[arm], *recipe]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=str(REPO))
    t0 = time.perf_counter()
    with open(out / "logs" / f"{corpus}-{arm}-s{seed}.out", "w") as log:
        rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    print(f"{corpus}-{arm}-s{seed}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {time.perf_counter() - t0:.0f}s",
          flush=True)
    return summary


def run_hints_ab(args):
    out = Path(args.hints)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    recipe = shlex.split(args.recipe_args)
    (out / "recipe.json").write_text(json.dumps(dict(recipe=recipe, command=sys.argv)))
    for corpus in args.corpora:
        val_index(out, corpus)
    cells = [(c, a, s) for s in args.seeds for c in args.corpora for a in args.arms]  # seed-major: balanced early
    threads = max(1, (os.cpu_count() or 1) // args.parallel)
    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(lambda cell: run_cell(out, *cell, recipe, threads), cells))


def step_ms(summary):
    """Wall ms per trained step: the summary's, else its train time over its steps."""
    if "step_ms" in summary:
        return summary["step_ms"]
    return 1000 * summary["train_time_s"] / max(1, summary.get("steps_trained", summary["steps"]))


def hints_table(out):
    """Markdown: per corpus and arm, val loss with / without hints, and the gain over the no-hints arm
    paired by seed (same init and batches): the median over the seeds found and [lowest, highest]."""
    out = Path(out)
    runs = {}
    for f in sorted(out.glob("*-s*.json")):
        corpus, rest = f.stem.split("-", 1)  # corpus names have no '-', arm names may
        arm, seed = rest.rsplit("-", 1)
        runs.setdefault((corpus, arm), {})[int(seed[1:])] = json.loads(f.read_text())
    recipe = json.loads((out / "recipe.json").read_text())["recipe"] if (out / "recipe.json").exists() else []

    def cell(values):
        values = [v for v in values if v is not None]
        if not values:
            return "n/a"
        spread = f" [{min(values):.4f}, {max(values):.4f}]" if len(values) > 1 else ""
        return f"{statistics.median(values):.4f}{spread} (n={len(values)})"

    def paired(corpus, arm, base_arm, key="val_loss_hints", base_key="val_loss_nohints"):
        a, b = runs.get((corpus, arm), {}), runs.get((corpus, base_arm), {})
        return [b[s][base_key] - a[s][key] for s in sorted(a.keys() & b.keys())
                if a[s][key] is not None and b[s][base_key] is not None]

    lines = [f"every run: train_gpt.py --preset demo-2025, then the arm's flags (scripts/cpu_ab.py ARMS), then "
             f"the recipe: {' '.join(recipe) or '(none)'}", "",
             "| corpus | arm | val loss with hints | val loss without hints | gain over --no-hints (paired) | ms/step |",
             "|---|---|---|---|---|---|"]
    for (corpus, arm), rs in sorted(runs.items()):
        rs = list(rs.values())
        hinted = [r["val_loss_hints"] for r in rs] if not unhinted(arm) else []
        gain = cell(paired(corpus, arm, base_arm(arm))) if not unhinted(arm) else "-"
        lines.append(f"| {corpus} | {arm} | {cell(hinted)} | {cell([r['val_loss_nohints'] for r in rs])} | {gain} | "
                     f"{statistics.fmean(step_ms(r) for r in rs):.0f} |")
    for new, old, what in (("record", "lengths", "record against lengths"),
                           ("model-new", "model-old", "the record arch (demo) against the January 2025 backbone (demo-2025)")):
        if any(arm in (new, old) for _, arm in runs):
            lines += ["", f"{what}, paired by seed (positive: {new}'s val loss with hints is lower):"]
            for corpus in sorted({c for c, _ in runs}):
                lines.append(f"- {corpus}: {cell(paired(corpus, new, old, base_key='val_loss_hints'))}")
    lines += ["", "per seed (seed: val loss with hints for the hinted arms, without for nohints):"]
    for (corpus, arm), rs in sorted(runs.items()):
        key = "val_loss_nohints" if unhinted(arm) else "val_loss_hints"
        lines.append(f"- {corpus} {arm}: " + ", ".join(
            f"s{s} {r[key]:.4f}" if r[key] is not None else f"s{s} n/a" for s, r in sorted(rs.items())))
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if args.hints:
        if args.table:
            return print(hints_table(args.hints))
        run_hints_ab(args)
        return print(hints_table(args.hints))
    val = read_tokens(args.val_files, args.val_tokens + 1, strict=False)
    print(f"CPU A/B (NOT predictive of GPU scale): {args.n_layer} x {args.n_embd}, {args.n_head} heads, seq {args.seq_len}, "
          f"batch {args.batch_size}, {args.steps} steps, val {len(val) - 1:,} tokens, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    results = {}
    for name in args.variants:
        results[name] = run_variant(name, args, val)
        r = results[name]
        print(f"{name:16s} train(last 10%) {r['train']:.4f}  val {r['val']:.4f}  {r['ms']:.0f} ms/step  "
              f"{r['params'] / 1e6:.1f}M params", flush=True)
    base = results.get("baseline")
    if base:
        print("\nval loss vs baseline (negative = better):")
        for name, r in results.items():
            print(f"  {name:16s} {r['val'] - base['val']:+.4f}  (ppl x{math.exp(r['val'] - base['val']):.3f})")


if __name__ == "__main__":
    main()
