"""The llm.c / modded-nanogpt `.bin` token shard format: write, read, validate, list.

Layout of a shard: a header of 256 little-endian int32 (header[0] = magic 20240520,
header[1] = version 1, header[2] = number of tokens, the rest zero), then that many
uint16 token ids. Shards written here are byte-compatible with the cached FineWeb shards
of modded-nanogpt and with llm.c's data loaders.
"""

import glob
import os

import numpy as np

MAGIC = 20240520  # llm.c / modded-nanogpt shard magic number
VERSION = 1  # the version that stores tokens as uint16
HEADER_INTS = 256  # the header is 256 int32 values ...
HEADER_BYTES = HEADER_INTS * 4  # ... = 1024 bytes before the first token
TOKEN_DTYPE = np.dtype("<u2")  # uint16 tokens: GPT-2's 50,257 ids fit below 65,536
MAX_TOKEN = 65535  # largest id a uint16 slot can hold
MAX_COUNT = 2**31 - 1  # the count lives in an int32 header field


def write_shard(path, tokens):
    """Write `tokens` (a 1-D array of integers in [0, 65535]) as a shard at `path`.

    The file is written to a temporary name beside `path` and renamed into place, so a
    reader never sees a half-written shard. Parent directories are created. Returns `path`.
    """
    original = tokens
    tokens = np.asarray(tokens)
    if tokens.size == 0 and not isinstance(original, np.ndarray):
        tokens = np.zeros(0, dtype=TOKEN_DTYPE)  # an empty list has no integer dtype
    if tokens.ndim != 1:
        raise ValueError(f"write_shard {path}: tokens must be a 1-D array, got shape {tokens.shape}")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"write_shard {path}: tokens must have an integer dtype, got {tokens.dtype}")
    if tokens.size > MAX_COUNT:
        raise ValueError(f"write_shard {path}: tokens has {tokens.size} entries, at most {MAX_COUNT} fit in a shard")
    if tokens.size:
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi > MAX_TOKEN:
            raise ValueError(
                f"write_shard {path}: tokens must lie in [0, {MAX_TOKEN}], got values in [{lo}, {hi}]"
            )
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, VERSION, tokens.size
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            f.write(tokens.astype(TOKEN_DTYPE, copy=False).tobytes())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def read_header(path):
    """Validate the header and size of shard `path`; return its token count.

    Raises ValueError naming the file and the field for a wrong magic, a wrong version,
    a negative count, or a file too short or too long for its count.
    """
    path = os.fspath(path)
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise ValueError(f"shard {path}: file is {size} bytes, shorter than the {HEADER_BYTES}-byte header")
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(HEADER_BYTES), dtype="<i4")
    magic, version, count = int(header[0]), int(header[1]), int(header[2])
    if magic != MAGIC:
        raise ValueError(f"shard {path}: magic is {magic}, expected {MAGIC}")
    if version != VERSION:
        raise ValueError(f"shard {path}: version is {version}, expected {VERSION}")
    if count < 0:
        raise ValueError(f"shard {path}: token count is {count}, expected >= 0")
    expected = HEADER_BYTES + count * TOKEN_DTYPE.itemsize
    if size != expected:
        what = "truncated" if size < expected else "too long"
        raise ValueError(
            f"shard {path}: token count is {count}, so the file should be {expected} bytes, "
            f"but it is {size} bytes ({what})"
        )
    return count


def shard_token_count(path):
    """Number of tokens in shard `path`, from its header (validated, tokens not read)."""
    return read_header(path)


def read_shard(path):
    """Return the tokens of shard `path` as a read-only uint16 array (an np.memmap).

    The array has exactly the header's token count; an empty shard gives an empty
    (plain, read-only) array. A bad header raises ValueError (see `read_header`).
    """
    count = read_header(path)
    if count == 0:
        empty = np.zeros(0, dtype=TOKEN_DTYPE)
        empty.flags.writeable = False
        return empty
    return np.memmap(os.fspath(path), dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(count,))


def is_complete_shard(path):
    """True when `path` exists and has a valid header and size (what a finished download has)."""
    try:
        read_header(path)
        return True
    except (OSError, ValueError):
        return False


def list_shards(pattern):
    """Sorted list of the files matching a glob `pattern` (or a list of patterns / paths).

    Every pattern must match at least one file, else FileNotFoundError names the pattern.
    """
    patterns = [pattern] if isinstance(pattern, (str, os.PathLike)) else list(pattern)
    if not patterns:
        raise FileNotFoundError("list_shards: no shard patterns given")
    files = set()
    for p in patterns:
        p = os.path.expanduser(os.fspath(p))
        matched = [f for f in glob.glob(p) if os.path.isfile(f)]
        if not matched:
            raise FileNotFoundError(f"no shard files match pattern {p!r}")
        files.update(matched)
    return sorted(files)


class ShardWriter:
    """Cut a stream of token arrays into shards of `shard_tokens` tokens each.

    `path_for_index(i)` names shard i. `max_tokens` caps the total written (the array
    that crosses the cap is cut). Call `close()` to write the last, partial shard.
    Afterwards `paths` and `counts` list the shards written and `total` their tokens.
    """

    def __init__(self, path_for_index, shard_tokens, max_tokens=None):
        if not isinstance(shard_tokens, int) or shard_tokens < 1:
            raise ValueError(f"ShardWriter: shard_tokens is {shard_tokens!r}, expected a positive integer")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 0):
            raise ValueError(f"ShardWriter: max_tokens is {max_tokens!r}, expected a non-negative integer or None")
        self.path_for_index = path_for_index
        self.shard_tokens = shard_tokens
        self.max_tokens = max_tokens
        self.buf = np.empty(shard_tokens, dtype=TOKEN_DTYPE)
        self.fill = 0
        self.total = 0
        self.paths, self.counts = [], []

    @property
    def full(self):
        """True once `max_tokens` tokens have been taken."""
        return self.max_tokens is not None and self.total >= self.max_tokens

    def add(self, tokens):
        """Append a 1-D array of token ids in [0, 65535]; returns how many were taken (fewer at
        the cap). Other ids are refused (ValueError naming the shard), as write_shard refuses them."""
        tokens = np.asarray(tokens)
        where = f"ShardWriter ({self.path_for_index(len(self.paths))})"
        if tokens.ndim != 1:
            raise ValueError(f"{where}: tokens must be a 1-D array, got shape {tokens.shape}")
        if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"{where}: tokens must have an integer dtype, got {tokens.dtype}")
        if tokens.size and tokens.dtype != TOKEN_DTYPE:
            lo, hi = int(tokens.min()), int(tokens.max())
            if lo < 0 or hi > MAX_TOKEN:
                raise ValueError(f"{where}: tokens must lie in [0, {MAX_TOKEN}], got values in [{lo}, {hi}]")
        n = len(tokens)
        if self.max_tokens is not None:
            n = min(n, self.max_tokens - self.total)
        pos = 0
        while pos < n:
            take = min(self.shard_tokens - self.fill, n - pos)
            self.buf[self.fill:self.fill + take] = tokens[pos:pos + take]
            self.fill += take
            self.total += take
            pos += take
            if self.fill == self.shard_tokens:
                self._flush()
        return n

    def _flush(self):
        path = write_shard(self.path_for_index(len(self.paths)), self.buf[:self.fill])
        self.paths.append(path)
        self.counts.append(self.fill)
        self.fill = 0

    def close(self):
        """Write the remaining tokens as the last shard (nothing if none remain)."""
        if self.fill:
            self._flush()
        return self.paths
