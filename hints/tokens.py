"""Tokens: the ids every index takes (`as_tokens`, uint16: GPT-2's 50,257 ids fit in TOKEN_BITS),
and the token sources of the hint CLI and builders: `.bin` shards (llm.c format; a glob, path or
list of paths) or `.npy` arrays (a path or glob ending in .npy)."""
import glob
import os

import numpy as np

from data.loader import CHUNK_TOKENS, iter_tokens, resolve_files
from data.shards import shard_token_count

TOKEN_BITS = 16           # GPT-2 ids < 50,257 < 2^16
MAX_TOKEN = (1 << TOKEN_BITS) - 1


def as_tokens(tokens, name="tokens"):
    """A 1-D uint16 view/copy of `tokens`, or a ValueError saying what was wrong."""
    a = np.asarray(tokens)
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of token ids, got shape {a.shape}")
    if a.size == 0:
        return np.zeros(0, dtype=np.uint16)  # np.asarray([]) is float64; an empty input is still fine
    if a.dtype == np.uint16:
        return np.ascontiguousarray(a)
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected integer token ids (uint16), got dtype {a.dtype}")
    if a.size and (a.min() < 0 or a.max() > MAX_TOKEN):
        raise ValueError(f"{name}: token ids must be in [0, {MAX_TOKEN}], found range [{a.min()}, {a.max()}]")
    return a.astype(np.uint16)


def _is_npy(pattern):
    return isinstance(pattern, str) and pattern.endswith(".npy")


def _npy_files(pattern):
    files = sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else [pattern]
    missing = [f for f in files if not os.path.exists(f)]
    if not files or missing:
        raise FileNotFoundError(f"--tokens {pattern}: no such .npy file(s)")
    return files


def _load_npy(path):
    a = np.load(path, mmap_mode="r")
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise ValueError(f"{path}: expected a 1-D integer token array, got shape {a.shape} dtype {a.dtype}")
    return a


def count_tokens(pattern, max_tokens=None):
    if _is_npy(pattern):
        n = sum(_load_npy(f).size for f in _npy_files(pattern))
    else:
        n = sum(shard_token_count(f) for f in resolve_files(pattern))
    return n if max_tokens is None else min(n, max_tokens)


def iter_chunks(pattern, max_tokens=None, chunk=CHUNK_TOKENS):
    """Consecutive token chunks of the stream named by `pattern`, up to max_tokens in all."""
    if not _is_npy(pattern):
        yield from iter_tokens(pattern, max_tokens=max_tokens, chunk_tokens=chunk)
        return
    left = np.inf if max_tokens is None else max_tokens
    for f in _npy_files(pattern):
        a = _load_npy(f)
        for i in range(0, a.size, chunk):
            if left <= 0:
                return
            part = a[i:i + int(min(chunk, left))]
            left -= part.size
            yield part


def read_all(pattern, max_tokens=None):
    chunks = list(iter_chunks(pattern, max_tokens))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint16)
