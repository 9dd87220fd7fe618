"""`train_gpt.py --describe`: the run's model and recipe as one JSON-able dict, from the flags alone
(no data, no GPU, no download, no process group). The model is instantiated on the meta device, so
its parameters are counted, not computed.

The record arch: RecordGPT.describe()'s model card, then the recipe (train/record_schedule.py's
describe(): steps, tokens_per_step, window_schedule, stages, switches, warm-up steps, tails) and the
run's data settings. The other archs: their config, steps, tokens a step and parameter counts.
"""
import os

import torch

from train.record_setup import record_card

# The ranks a --describe of a multi-GPU preset assumes when no torchrun environment says otherwise.
DESCRIBE_WORLD_DEFAULT = 1


def gpt_card(args) -> dict:
    """The speedrun / gpt2 archs' card (model/gpt.py GPT on the meta device)."""
    from train.step import build_config  # the run's own config builder
    from model import GPT
    cfg = build_config(args)
    with torch.device("meta"):
        model = GPT(cfg)
    groups = {}
    for name, p in model.named_parameters():
        key = name.split(".")[0]
        groups[key] = groups.get(key, 0) + p.numel()
    world = int(os.environ.get("WORLD_SIZE", DESCRIBE_WORLD_DEFAULT))
    if args.batch_size is None:  # the speedrun record preset: ~262k tokens a step over the ranks (train_gpt.py)
        from train.plan import RECORD_GLOBAL_BATCH_TOKENS, RECORD_MAX_RANK_BATCH
        batch = max(1, min(RECORD_MAX_RANK_BATCH, RECORD_GLOBAL_BATCH_TOKENS // (world * args.seq_len)))
    else:
        batch = args.batch_size
    return {"arch": cfg.arch, "n_layer": cfg.n_layer, "model_dim": cfg.n_embd, "n_head": cfg.n_head,
            "head_dim": cfg.n_embd // cfg.n_head, "vocab_size": cfg.vocab_size, "seq_len": args.seq_len,
            "steps": args.steps, "tokens_per_step": world * batch * args.seq_len, "world_size": world,
            "params": {**groups, "total": sum(groups.values())}}


def describe_run(args) -> dict:
    return record_card(args) if args.arch == "record" else gpt_card(args)
