"""The record arch's run settings from the trainer's flags: its schedule (train/record_schedule.py,
scaled by --steps), the model's config, and the model card --describe prints (train/describe.py),
with what a GPU holds between steps (train/record_memory.py).

Sizes: --tokens-per-step over the world's ranks is a rank's packed row (16,384 at the record's
131,072 over 8); --block-tokens is the attention block (128 at the record), the unit of every window
and cut length, so a demo on short documents scales them all with one number; --ngram-rows sizes the
hashed bigram/trigram table (84,602,880 at the record).
"""
import os

import torch

from train.record_memory import record_memory_per_gpu
from train.record_schedule import RecordSchedule

# Ranks a --describe of the record preset assumes when no torchrun environment says otherwise: the
# record's node (8 x H100; RECORD.md section 1).
RECORD_RANKS = 8
# The record's MLP hidden width 1792 = 3.5 x 512 (RECORD.md section 2).
MLP_RATIO_NUM, MLP_RATIO_DEN = 7, 2


def padded_vocab(vocab_size: int) -> int:
    """The vocabulary rounded up to a multiple of 128 (50,257 -> 50,304, the record's)."""
    return -(-vocab_size // 128) * 128


def record_schedule(args) -> RecordSchedule:
    return RecordSchedule(args.steps, block_tokens=args.block_tokens, tokens_per_step=args.tokens_per_step,
                          vocab=padded_vocab(args.vocab_size))


def tokens_per_rank(args, world_size: int) -> int:
    if args.tokens_per_step % world_size:
        raise SystemExit(f"error: argument --tokens-per-step: {args.tokens_per_step:,} does not split over "
                         f"{world_size} ranks")
    return args.tokens_per_step // world_size


def record_config(args, schedule=None):
    """RecordGPT's config from the flags (model/record_gpt.py): the record's shape at --n-embd / --n-head
    (head width n_embd / n_head, MLP hidden 3.5 n_embd, the record's ratio), its cells for the hint
    lengths, the table's rows, and the rotary tables starting at the schedule's step-0 windows."""
    from hints.kinds import n_cells
    from model.record_gpt import RecordConfig
    schedule = schedule or record_schedule(args)
    if args.hint_repr != "record":  # its loop looks up the positional index's cells only (train/record_run.py)
        raise SystemExit(f"error: argument --hint-repr: the record arch takes the record's cells ('record'), "
                         f"got {args.hint_repr!r}")
    try:
        return RecordConfig(vocab_size=args.vocab_size, model_dim=args.n_embd, n_head=args.n_head,
                            head_dim=args.n_embd // args.n_head,
                            mlp_hidden=args.n_embd * MLP_RATIO_NUM // MLP_RATIO_DEN,
                            hint_repr="record", n_hint_kinds=n_cells(len(args.hint_lengths)),
                            ngram_table_rows=args.ngram_rows, initial_windows=schedule.plan(0).window_tokens,
                            fp8=args.fp8 != "off", fp8_exact_refreshes=schedule.fp8_exact_refreshes)
    except (TypeError, ValueError) as e:
        raise SystemExit(f"error: model: {e}") from None


def record_gpu_memory(args, world: int, model=None) -> dict:
    """train/record_memory.py's bytes per GPU on `world` ranks between steps (the model, its optimizer state,
    the n-gram table's shard, the tail averages; not the activations) and the share of an H100 they take;
    --describe and --plan print it."""
    from model.record_gpt import RecordGPT
    if model is None:
        with torch.device("meta"):
            model = RecordGPT(record_config(args), world_size=world)
    return record_memory_per_gpu(model.labelled_params(), world_size=world, ngram_rows=args.ngram_rows,
                                 dim=args.n_embd, tokens_per_rank=tokens_per_rank(args, world),
                                 val_tokens_per_rank=args.val_batch_tokens // world)


def record_card(args) -> dict:
    """RecordGPT.describe() on the meta device, then the recipe (the module docstring)."""
    from model.record_gpt import RecordGPT
    world = int(os.environ.get("WORLD_SIZE", RECORD_RANKS if args.preset == "record" else 1))
    with torch.device("meta"):
        model = RecordGPT(record_config(args), world_size=world)
    card = dict(model.describe())
    recipe = record_schedule(args).describe()
    T = tokens_per_rank(args, world)
    memory = record_gpu_memory(args, world, model)
    recipe.update(world_size=world, tokens_per_rank=T, memory_per_gpu=memory,
                  val_tokens=args.val_tokens, canonical_mask=not args.no_canonical_mask,
                  hints=not args.no_hints)
    clash = {k for k in set(card) & set(recipe) if card[k] != recipe[k]}
    if clash:
        raise RuntimeError(f"--describe: the model card and the recipe disagree on {sorted(clash)}")
    return {**card, **recipe}
