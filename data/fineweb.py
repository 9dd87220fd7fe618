"""Tokenize a Hugging Face text dataset (default FineWeb sample-10BT) with GPT-2 into shards.

As in modded-nanogpt's fineweb.py: every document is preceded by the end-of-text token,
documents are concatenated and cut into shards of `--shard-size` tokens (a document may
span two shards), the first shard is the validation shard and the rest are train shards:
`fineweb_val_000000.bin`, `fineweb_train_000001.bin`, ... The writer, `write_shards`, takes
any iterable of texts; `main` streams the dataset from the hub. A set is written whole or not
at all (data.manifest.shard_set): a rerun that makes fewer shards leaves none of the old ones,
and the folder's manifest.json lists exactly the new set.
"""

import argparse
import os
import re
import sys

import numpy as np
from tqdm import tqdm

from data.manifest import shard_set
from data.shards import TOKEN_DTYPE, ShardWriter
from data.tokenizer import VOCAB_SIZE, encode_document, gpt2, tokenizing_pool

DATA_DIR = os.path.dirname(os.path.abspath(__file__))
SHARD_SIZE = 10**8  # tokens per shard, as in modded-nanogpt's fineweb.py and the cached shards
CHUNKSIZE = 16  # documents per Pool task, as in modded-nanogpt's fineweb.py
DATASET = "HuggingFaceFW/fineweb"
CONFIGS = {"10B": "sample-10BT", "100B": "sample-100BT"}  # FineWeb sample configs by size


def default_workers():
    """Tokenizer processes: all cores but two (modded-nanogpt's choice), at least one."""
    return max(1, (os.cpu_count() or 1) - 2)


def tokenize_document(text):
    """uint16 token ids of one document, EOT first."""
    tokens = np.asarray(encode_document(text), dtype=np.int64)
    if tokens.size and tokens.max() >= VOCAB_SIZE:  # cannot happen with GPT-2; guards another encoding
        raise ValueError(f"tokenize_document: token id {tokens.max()} >= vocab size {VOCAB_SIZE}")
    return tokens.astype(TOKEN_DTYPE)


def shard_path(out_dir, prefix, index):
    """Path of shard `index`: index 0 is the val shard, the rest are train shards."""
    split = "val" if index == 0 else "train"
    return os.path.join(out_dir, f"{prefix}_{split}_{index:06d}.bin")


def write_shards(texts, out_dir, prefix="fineweb", shard_size=SHARD_SIZE, workers=None,
                 chunksize=CHUNKSIZE, max_shards=None, progress=True):
    """Tokenize `texts` (any iterable of str) into shards of `shard_size` tokens in `out_dir`.

    Shard 0 is val, shards 1.. are train; the last shard holds the remainder. Stops after
    `max_shards` shards when given. Tokenizing uses a Pool of `workers` processes (documents
    keep their order); workers <= 1 tokenizes in this process. Returns a summary dict
    with `documents`, `tokens`, `shards` (paths) and `shard_tokens` (counts).
    """
    if not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"write_shards: shard_size is {shard_size!r}, expected a positive integer")
    if max_shards is not None and (not isinstance(max_shards, int) or max_shards < 1):
        raise ValueError(f"write_shards: max_shards is {max_shards!r}, expected a positive integer or None")
    workers = default_workers() if workers is None else workers
    gpt2()  # build the encoding once here; forked workers inherit it
    cap = max_shards * shard_size if max_shards else None
    n_docs = 0
    with shard_set(out_dir, owned=re.compile(rf"^{re.escape(prefix)}_(val|train)_\d{{6}}\.bin$")) as tmp:
        writer = ShardWriter(lambda i: shard_path(tmp, prefix, i), shard_size, max_tokens=cap)
        bar = tqdm(total=cap, unit="tok", unit_scale=True, desc="tokenizing", disable=not progress)
        pool = tokenizing_pool(workers)
        try:
            docs = pool.imap(tokenize_document, texts, chunksize=chunksize) if pool else map(tokenize_document, texts)
            for doc in docs:
                n_docs += 1
                bar.update(writer.add(doc))
                if writer.full:
                    break
            writer.close()
        finally:
            bar.close()
            if pool:
                pool.terminate()
                pool.join()
    shards = [shard_path(os.path.abspath(out_dir), prefix, i) for i in range(len(writer.paths))]
    return {"documents": n_docs, "tokens": int(sum(writer.counts)), "shards": shards, "shard_tokens": writer.counts}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Tokenize a Hugging Face text dataset (default FineWeb sample-10BT, streamed) with "
        "GPT-2 into .bin shards: first shard val, the rest train.",
    )
    parser.add_argument("-v", "--version", choices=sorted(CONFIGS), default="10B",
                        help="FineWeb sample size; sets --name and the default --out-dir (default: %(default)s)")
    parser.add_argument("--dataset", default=DATASET, help="dataset id on the hub (default: %(default)s)")
    parser.add_argument("--name", default=None, help="dataset config (default: sample-<version>T)")
    parser.add_argument("--split", default="train", help="dataset split (default: %(default)s)")
    parser.add_argument("--text-field", default="text", help="column holding the text (default: %(default)s)")
    parser.add_argument("--out-dir", default=None, help="output directory (default: data/fineweb<version>)")
    parser.add_argument("--prefix", default="fineweb", help="shard file name prefix (default: %(default)s)")
    parser.add_argument("-s", "--shard-size", type=int, default=SHARD_SIZE, help="tokens per shard (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=default_workers(), help="tokenizer processes (default: %(default)s)")
    parser.add_argument("--chunksize", type=int, default=CHUNKSIZE, help="documents per worker task (default: %(default)s)")
    parser.add_argument("--max-shards", type=int, default=None, help="stop after this many shards, val included")
    args = parser.parse_args(argv)
    name = args.name or CONFIGS[args.version]
    out_dir = args.out_dir or os.path.join(DATA_DIR, f"fineweb{args.version}")

    import datasets

    from data.download import HubUnreachableError, _is_network_error, check_hub_reachable

    try:
        if not os.path.exists(args.dataset):  # a hub dataset: fail fast when the hub is unreachable
            check_hub_reachable(out_dir)
        ds = datasets.load_dataset(args.dataset, name=name, split=args.split, streaming=True)
        texts = (doc[args.text_field] for doc in ds)
        summary = write_shards(texts, out_dir, prefix=args.prefix, shard_size=args.shard_size,
                               workers=args.workers, chunksize=args.chunksize, max_shards=args.max_shards)
    except Exception as e:
        if isinstance(e, HubUnreachableError) or _is_network_error(e) or "offline" in str(e).lower():
            sys.exit(f"error: could not reach the Hugging Face hub to stream {args.dataset} ({name}): "
                     f"{type(e).__name__}; copy pre-tokenized shards into {out_dir} by hand "
                     f"(see data/cached_fineweb{args.version}.py) or build one from local text with "
                     f"python -m data.local_corpus")
        raise
    print(f"{summary['documents']} documents, {summary['tokens']} tokens in {len(summary['shards'])} shards in {out_dir}")


if __name__ == "__main__":
    main()
