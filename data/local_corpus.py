"""Turn a directory of local text files into GPT-2 train/val shards (the CPU demo corpus).

Default source: Python's standard-library source (`*.py` under the directory of `os`,
without site-packages), which every machine with Python has. Each file is one document,
preceded by the end-of-text token. The split is by file: a hash of the file's relative
path decides val or train, so no file is in both, and the same tree always splits the
same way. Documents go in hash order (a fixed shuffle). Output in `out_dir`:
`train_000000.bin ...`, `val_000000.bin ...`, `corpus.json` (parameters + summary) and the
shard set's `manifest.json` (data/manifest.py), written whole or not at all; a second build
with the same parameters over unchanged files reuses a complete set, and rebuilds anything else.
"""

import argparse
import fnmatch
import hashlib
import json
import os
import re
import sys

import numpy as np
from tqdm import tqdm

from data.manifest import check_shards, shard_set
from data.shards import TOKEN_DTYPE, ShardWriter, shard_token_count
from data.tokenizer import encode_document, gpt2, tokenizing_pool

DATA_DIR = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT_DIR = os.path.join(DATA_DIR, "local_corpus")
VAL_FRACTION = 0.05  # share of files held out for validation
SHARD_TOKENS = 2**22  # 4M tokens per shard: small, so the demo's stream spans several shards
WORKERS = 2  # tokenizer processes: the 2-core CPU machine this demo targets
CHUNKSIZE = 8  # files per Pool task
EXCLUDE_DIRS = ("site-packages", "dist-packages", "__pycache__")  # third-party code and caches
FORMAT_VERSION = 1  # bump when the corpus layout or document encoding changes
CORPUS_JSON = "corpus.json"
OWNED_RE = re.compile(r"^((train|val)_\d{6}\.bin|corpus\.json)$")  # the files of a corpus, replaced by a rebuild


def stdlib_dir():
    """Directory of Python's standard-library source."""
    return os.path.dirname(os.__file__)


def find_files(src_dir, pattern="*.py", exclude_dirs=EXCLUDE_DIRS):
    """Sorted relative paths (with '/') of files under `src_dir` whose name matches `pattern`."""
    found = []
    for root, dirs, files in os.walk(src_dir):
        dirs[:] = sorted(d for d in dirs if d not in exclude_dirs)
        for name in files:
            if fnmatch.fnmatch(name, pattern):
                found.append(os.path.relpath(os.path.join(root, name), src_dir).replace(os.sep, "/"))
    return sorted(found)


def path_hash(rel_path):
    """A number in [0, 1) from the SHA-256 of a relative path: decides the split and the order."""
    return int.from_bytes(hashlib.sha256(rel_path.encode("utf-8")).digest()[:8], "big") / 2**64


def split_files(rel_paths, val_fraction=VAL_FRACTION):
    """Split relative paths into (train, val) lists by path hash, each in hash order.

    A file is val when its hash is below `val_fraction`. With two or more files, each
    split gets at least one: if none hashes into val, the lowest hash goes there; if none
    stays in train, the highest hash does.
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"split_files: val_fraction is {val_fraction!r}, expected a number in (0, 1)")
    if len(rel_paths) < 2:
        raise ValueError(f"split_files: got {len(rel_paths)} files, need at least 2 (one train, one val)")
    ordered = sorted(rel_paths, key=lambda p: (path_hash(p), p))
    n_val = sum(path_hash(p) < val_fraction for p in ordered)
    n_val = min(max(n_val, 1), len(ordered) - 1)
    return ordered[n_val:], ordered[:n_val]


def tokenize_file(path):
    """uint16 tokens of one file as a document (EOT first); undecodable bytes become U+FFFD."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return np.asarray(encode_document(f.read()), dtype=TOKEN_DTYPE)


def _fingerprint(src_dir, rel_paths):
    h = hashlib.sha256()
    for rel in rel_paths:
        st = os.stat(os.path.join(src_dir, rel))
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _check_positive(name, value, allow_none=True):
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"build_local_corpus: {name} is {value!r}, expected a positive integer" + (" or None" if allow_none else ""))


def _load_existing(out_dir, params):
    """The stored summary when out_dir holds a complete corpus built with `params`, else None."""
    try:
        with open(os.path.join(out_dir, CORPUS_JSON)) as f:
            summary = json.load(f)
        if summary.get("params") != params:
            return None
        for split in ("train", "val"):
            names = summary["shards"][split]
            files = check_shards(os.path.join(out_dir, f"{split}_*.bin"))  # a complete set (its manifest agrees)
            if [os.path.basename(f) for f in files] != names:
                return None
            if sum(shard_token_count(f) for f in files) != summary["tokens"][split]:
                return None
        return summary
    except (OSError, ValueError, KeyError, TypeError):
        return None


def format_summary(s):
    """One line per split: files, documents, tokens, shards."""
    lines = [f"local corpus in {s['out_dir']} from {s['src_dir']} ({s['params']['pattern']})"]
    for split in ("train", "val"):
        lines.append(
            f"  {split:5s}: {s['files'][split]:6d} files, {s['documents'][split]:6d} documents, "
            f"{s['tokens'][split]:11,d} tokens in {len(s['shards'][split])} shard(s)"
        )
    return "\n".join(lines)


def build_local_corpus(src_dir=None, out_dir=DEFAULT_OUT_DIR, val_fraction=VAL_FRACTION,
                       max_train_tokens=None, shard_tokens=SHARD_TOKENS, pattern="*.py",
                       max_val_tokens=None, workers=WORKERS, force=False, progress=True):
    """Tokenize the files under `src_dir` matching `pattern` into train/val shards in `out_dir`.

    src_dir: default Python's standard-library source. max_train_tokens / max_val_tokens
    cap a split (the document at the cap is cut). Reuses `out_dir` when its corpus.json
    has the same parameters and source fingerprint, unless `force`. Returns the summary dict:
    `files`, `documents`, `tokens`, `shards` (file names) and `file_lists` (relative paths,
    in stream order, of the documents used), each per split ("train", "val"); also
    `train_pattern` / `val_pattern` (globs for the loader), `params`, `reused`.
    """
    src_dir = os.path.abspath(src_dir or stdlib_dir())
    if not os.path.isdir(src_dir):
        raise NotADirectoryError(f"build_local_corpus: src_dir {src_dir} is not a directory")
    _check_positive("shard_tokens", shard_tokens, allow_none=False)
    _check_positive("max_train_tokens", max_train_tokens)
    _check_positive("max_val_tokens", max_val_tokens)
    rel_paths = find_files(src_dir, pattern)
    if len(rel_paths) < 2:
        raise ValueError(f"build_local_corpus: src_dir {src_dir} has {len(rel_paths)} files matching {pattern!r}, need at least 2")
    train_files, val_files = split_files(rel_paths, val_fraction)
    out_dir = os.path.abspath(out_dir)
    params = {
        "format_version": FORMAT_VERSION,
        "tokenizer": "gpt2",
        "src_dir": src_dir,
        "pattern": pattern,
        "exclude_dirs": list(EXCLUDE_DIRS),
        "val_fraction": val_fraction,
        "max_train_tokens": max_train_tokens,
        "max_val_tokens": max_val_tokens,
        "shard_tokens": shard_tokens,
        "source_fingerprint": _fingerprint(src_dir, rel_paths),
    }
    if not force:
        summary = _load_existing(out_dir, params)
        if summary is not None:
            summary["reused"] = True
            if progress:
                print(format_summary(summary) + "\n  (reused: same parameters and source files)")
            return summary

    used = {"train": [], "val": []}
    # val first, so that a train cap can stop tokenizing early
    jobs = [("val", rel) for rel in val_files] + [("train", rel) for rel in train_files]
    gpt2()  # build the encoding once here; forked workers inherit it
    with shard_set(out_dir, owned=OWNED_RE) as tmp:
        writers = {
            split: ShardWriter(lambda i, s=split: os.path.join(tmp, f"{s}_{i:06d}.bin"), shard_tokens, cap)
            for split, cap in (("train", max_train_tokens), ("val", max_val_tokens))
        }
        pool = tokenizing_pool(workers)
        bar = tqdm(total=len(jobs), unit="file", desc="tokenizing", disable=not progress)
        try:
            paths = [os.path.join(src_dir, rel) for _, rel in jobs]
            docs = pool.imap(tokenize_file, paths, chunksize=CHUNKSIZE) if pool else map(tokenize_file, paths)
            for (split, rel), tokens in zip(jobs, docs):
                bar.update(1)
                writer = writers[split]
                if writer.full:
                    if split == "train":
                        break
                    continue
                writer.add(tokens)
                used[split].append(rel)
            for w in writers.values():
                w.close()
        finally:
            bar.close()
            if pool:
                pool.terminate()
                pool.join()

        summary = {
            "src_dir": src_dir,
            "out_dir": out_dir,
            "files": {"train": len(train_files), "val": len(val_files)},
            "documents": {s: len(used[s]) for s in used},
            "tokens": {s: int(writers[s].total) for s in writers},
            "shards": {s: [os.path.basename(p) for p in writers[s].paths] for s in writers},
            "train_pattern": os.path.join(out_dir, "train_*.bin"),
            "val_pattern": os.path.join(out_dir, "val_*.bin"),
            "params": params,
            "file_lists": used,
        }
        with open(os.path.join(tmp, CORPUS_JSON), "w") as f:
            json.dump(summary, f, indent=1)
    summary["reused"] = False
    if progress:
        print(format_summary(summary))
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Tokenize local text files (default: Python's standard-library *.py) into GPT-2 "
        "train/val shards, split by file, for the CPU demo.",
    )
    parser.add_argument("--src-dir", default=None, help="directory to read (default: the stdlib source, %s)" % stdlib_dir())
    parser.add_argument("--out-dir", default=DEFAULT_OUT_DIR, help="output directory (default: %(default)s)")
    parser.add_argument("--pattern", default="*.py", help="file name glob (default: %(default)s)")
    parser.add_argument("--val-fraction", type=float, default=VAL_FRACTION, help="share of files for val (default: %(default)s)")
    parser.add_argument("--max-train-tokens", type=int, default=None, help="cap on train tokens (default: no cap)")
    parser.add_argument("--max-val-tokens", type=int, default=None, help="cap on val tokens (default: no cap)")
    parser.add_argument("--shard-tokens", type=int, default=SHARD_TOKENS, help="tokens per shard (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=WORKERS, help="tokenizer processes (default: %(default)s)")
    parser.add_argument("--force", action="store_true", help="rebuild even if out-dir holds the same corpus")
    args = parser.parse_args(argv)
    try:
        build_local_corpus(
            src_dir=args.src_dir, out_dir=args.out_dir, val_fraction=args.val_fraction,
            max_train_tokens=args.max_train_tokens, shard_tokens=args.shard_tokens, pattern=args.pattern,
            max_val_tokens=args.max_val_tokens, workers=args.workers, force=args.force,
        )
    except (ValueError, OSError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
