"""CPU A/B of the later-record backbone features at demo width: trains one model per variant
(the baseline speedrun GPT, each feature alone, all of them) on the same local-corpus batches
for a few steps and prints train and val loss. No hints: this measures the backbone only.

The numbers are NOT predictive of GPU scale: ~100 steps of a 4 x 256 model on 512-token
batches of Python source say little about 1,390 steps of 12 x 768 on FineWeb. They show that
every feature trains and give its sign at this size; the GPU A/B is scripts/gpu_ab.sh.

Usage: python scripts/cpu_ab.py --train-files 'data/local_corpus/train_*.bin' \
           --val-files 'data/local_corpus/val_*.bin' [--steps 100] [--variants baseline,unet_skips]
(build the corpus first: python -m data.local_corpus)
"""
import argparse
import math
import statistics
import time

import numpy as np
import torch
from tqdm import tqdm

from data.loader import DistributedDataLoader, read_tokens
from hints import n_kinds
from hints.geometry import DEFAULT_LENGTHS
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


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
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


def main(argv=None):
    args = parse_args(argv)
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
