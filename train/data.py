"""The run's data: shard globs resolved against the repo, every shard checked before step 1
(manifests that agree with the files, recorded on the first read of a folder without one; token
ids below the vocabulary), the training loader, the val tokens and each rank's share of them."""
import glob
import os

from data.loader import DistributedDataLoader, read_tokens
from data.manifest import check_token_ids
from train.common import REPO_DIR


def read_val_tokens(val_files, n_tokens):
    """The first n_tokens scored val tokens: n_tokens + 1 (the last is only a target)."""
    return read_tokens(val_files, n_tokens + 1, strict=False)


def val_split(n_val, seq_len, batch_size, rank, world_size):
    """This rank's share of the val stream: (first sequence, sequences, batch size)."""
    n_seq = max(n_val - 1, 0) // seq_len
    per_rank = n_seq // world_size
    bs = max(1, min(batch_size, per_rank))
    per_rank = per_rank // bs * bs  # whole batches: one shape, one compiled graph
    return rank * per_rank, per_rank, bs


def repo_glob(pattern):
    """A glob as given when it matches from here, else relative to the repo (run.sh's presets)."""
    return pattern if os.path.isabs(pattern) or glob.glob(pattern) else os.path.join(REPO_DIR, pattern)


def open_data(args, d, log, local_corpus=False):
    """(train files, val files, loader, val tokens), every shard checked before step 1: manifests
    that agree (data/manifest.py records one for a folder without, in one logged line) and token
    ids < --vocab-size. Bad data ends the run here, in one line naming the file.
    local_corpus: the files are the demo's local corpus, built here on first use."""
    if local_corpus:
        if d.local_rank == 0:  # the local demo corpus: built on first use, rebuilt when partial
            from data.local_corpus import build_local_corpus
            if not build_local_corpus(progress=d.master)["reused"]:
                log("demo: built the local corpus from Python's standard library")
        d.barrier()
    train_files, val_files = repo_glob(args.train_files), repo_glob(args.val_files)
    try:
        if d.local_rank != 0:
            d.barrier()  # local rank 0 checks first: a folder without a manifest is read and recorded once
        for files in (train_files, val_files):
            check_token_ids(files, args.vocab_size, log=log, progress=d.master)
        if d.local_rank == 0:
            d.barrier()
        loader = DistributedDataLoader(train_files, args.batch_size, args.seq_len, rank=d.rank,
                                       world_size=d.world_size, align_to_documents=args.align_documents,
                                       log=log if d.master else None)
        val_tokens = read_val_tokens(val_files, args.val_tokens)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    _, n_val_seq, _ = val_split(len(val_tokens), args.seq_len, args.val_batch_size, 0, d.world_size)
    if n_val_seq == 0:
        raise SystemExit(f"error: --val-files {val_files}: {len(val_tokens):,} val tokens make no sequence of "
                         f"{args.seq_len} + 1 per rank ({d.world_size} ranks); give more --val-tokens or val files")
    log(f"data: train {train_files} ({loader.stream.total:,} tokens), val {val_files} "
        f"({n_val_seq * args.seq_len * d.world_size:,} tokens scored)")
    return train_files, val_files, loader, val_tokens


