"""Token streams over shards: a distributed, deterministic, resumable batch loader for
torchrun-style training, plus plain readers for hint building and validation.

The training stream is the concatenation of the shards in sorted order. Step k takes one
global batch of G = world_size * batch_size * seq_len tokens starting where step k-1
ended (reading G + 1 tokens, the last one only as a target). Rank r gets the contiguous
slice [r*B*T, (r+1)*B*T + 1) of it as inputs x and targets y (shape (B, T) each, y = x
shifted by one). Every rank also gets `global_tokens`: the inputs of all ranks
concatenated in rank order (the G tokens of the step, in stream order), which the
training-time hint index consumes after the step, so consecutive steps' global_tokens
continue one stream.

Wrap-around: when fewer than G + 1 tokens remain, the tail is skipped, the stream
restarts at token 0, `epoch` goes up by one and a line is logged.

`align_to_documents=True`: every sequence (row) starts at an end-of-text token when one
lies within the T tokens at the cursor (skipping the tokens before it); otherwise it
starts at the cursor. The next sequence's cursor is the end of this one's inputs. Rows
are planned in order (row j of rank r is sequence r*B + j), identically on every rank,
so ranks stay disjoint and deterministic; `global_tokens` is still the concatenation of
all rows' inputs, now with the skipped gaps left out, and rank r's inputs are still its
slice [r*B*T, (r+1)*B*T) of it, so the training-time hints stay causal. Wrap-around there
is per sequence.

Nothing here imports torch: batches are numpy arrays, the trainer converts them.
"""

import os
from typing import NamedTuple

import numpy as np

from data.manifest import check_shards
from data.shards import read_shard, shard_token_count
from data.tokenizer import EOT_TOKEN

OPEN_SHARDS = 4  # memory maps kept open at once (1030 FineWeb100B shards would exhaust file descriptors)
# Tokens per chunk when a stream is read in pieces (iter_tokens; HintIndex.add calls of the hint
# builders): 16M tokens = 32 MiB of uint16, large enough to amortise a call, small enough to stream.
CHUNK_TOKENS = 1 << 24
# The speedrun scores the first 10,485,760 tokens of the FineWeb val shard (modded-nanogpt).
SPEEDRUN_VAL_TOKENS = 10_485_760


def resolve_files(files):
    """A sorted list of shard paths from a glob pattern, a path, or a list of them, checked
    against their folders' manifests (data/manifest.py: a glob's first read of a folder without
    one records it)."""
    if isinstance(files, (str, os.PathLike)) or (isinstance(files, (list, tuple)) and files):
        return check_shards(files)
    raise FileNotFoundError(f"no shard files given (got {files!r}); expected a glob pattern or a list of paths")


class TokenStream:
    """Random access to the concatenation of shards (sorted), with a few shards kept mapped."""

    def __init__(self, files):
        self.files = resolve_files(files)
        counts = [shard_token_count(f) for f in self.files]
        self.starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.starts[1:])
        self.total = int(self.starts[-1])
        self._open = {}

    def _shard(self, i):
        mm = self._open.pop(i, None)
        if mm is None:
            mm = read_shard(self.files[i])
            if len(self._open) >= OPEN_SHARDS:
                self._open.pop(next(iter(self._open)))
        self._open[i] = mm  # most recently used last
        return mm

    def shard_tokens(self, i):
        """The tokens of shard i (in sorted order) as a read-only uint16 memory map."""
        return self._shard(i)

    def locate(self, pos):
        """(shard index, offset) of stream position pos (0 <= pos <= total)."""
        i = int(np.searchsorted(self.starts, pos, side="right")) - 1
        i = min(i, len(self.files) - 1)
        return i, int(pos - self.starts[i])

    def read(self, start, stop):
        """Tokens [start, stop) of the stream as a new uint16 array."""
        if not 0 <= start <= stop <= self.total:
            raise IndexError(f"TokenStream.read({start}, {stop}) outside [0, {self.total}]")
        out = np.empty(stop - start, dtype=np.uint16)
        i, pos = self.locate(start)[0], start
        while pos < stop:
            s0, s1 = int(self.starts[i]), int(self.starts[i + 1])
            end = min(stop, s1)
            if end > pos:
                out[pos - start:end - start] = self._shard(i)[pos - s0:end - s0]
            pos = end
            i += 1
        return out


class Batch(NamedTuple):
    """One step for one rank: x, y of shape (B, T); global_tokens of all ranks, 1-D uint16."""

    x: np.ndarray
    y: np.ndarray
    global_tokens: np.ndarray


class DistributedDataLoader:
    """Deterministic, resumable batches over a shard stream for rank `rank` of `world_size`.

    files: glob pattern, path, or list (sorted before use). x and y come as `dtype`
    (default int64; np.uint16 halves host-to-device traffic). `log` gets wrap-around
    messages (default: print on rank 0; None silences). See the module docstring for the
    exact semantics.
    """

    def __init__(self, files, batch_size, seq_len, rank=0, world_size=1, align_to_documents=False,
                 dtype=np.int64, eot_token=EOT_TOKEN, log="default"):
        for name, v in (("batch_size", batch_size), ("seq_len", seq_len), ("world_size", world_size)):
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"DistributedDataLoader: {name} is {v!r}, expected a positive integer")
        if not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
            raise ValueError(f"DistributedDataLoader: rank is {rank!r}, expected an integer in [0, {world_size})")
        self.stream = TokenStream(files)
        self.B, self.T, self.rank, self.world_size = int(batch_size), int(seq_len), int(rank), int(world_size)
        self.global_batch_tokens = self.world_size * self.B * self.T
        self.align_to_documents = bool(align_to_documents)
        self.dtype = np.dtype(dtype)
        self.eot_token = int(eot_token)
        self.log = (print if rank == 0 else None) if log == "default" else log
        need = (self.T if self.align_to_documents else self.global_batch_tokens) + 1
        if self.stream.total < need:
            raise ValueError(f"DistributedDataLoader: shards {self.stream.files[0]} ... hold {self.stream.total} "
                             f"tokens, need at least {need} for one {'sequence' if self.align_to_documents else 'global batch'}")
        self.pos = 0  # stream position where the next step starts
        self.step = 0  # steps taken
        self.epoch = 0  # completed passes over the stream

    def _wrap(self):
        self.epoch += 1
        if self.log:
            self.log(f"data: end of the training stream ({self.stream.total:,} tokens); "
                     f"wrapping around to its start, epoch {self.epoch}")
        return 0

    def _plan_aligned(self):
        """Start positions of the step's world_size * B sequences, advancing pos."""
        T, total, pos, starts = self.T, self.stream.total, self.pos, []
        for _ in range(self.world_size * self.B):
            if pos + T + 1 > total:
                pos = self._wrap()
            window = self.stream.read(pos, min(pos + T, total))
            hits = np.flatnonzero(window == self.eot_token)
            start = pos + int(hits[0]) if hits.size else pos
            if start + T + 1 > total:  # the aligned start runs past the end: take the next epoch's first row
                pos = self._wrap()
                window = self.stream.read(pos, pos + T)
                hits = np.flatnonzero(window == self.eot_token)
                start = int(hits[0]) if hits.size and hits[0] + T + 1 <= total else 0
            starts.append(start)
            pos = start + T
        self.pos = pos
        return starts

    def next_batch(self):
        """The next Batch(x, y, global_tokens) for this rank; advances the stream by one step."""
        B, T, r = self.B, self.T, self.rank
        if self.align_to_documents:
            rows = [self.stream.read(s, s + T + 1) for s in self._plan_aligned()]
            mine = np.stack(rows[r * B:(r + 1) * B])
            x, y = mine[:, :-1], mine[:, 1:]
            global_tokens = np.concatenate([row[:-1] for row in rows])
        else:
            G = self.global_batch_tokens
            if self.pos + G + 1 > self.stream.total:
                self.pos = self._wrap()
            buf = self.stream.read(self.pos, self.pos + G + 1)
            mine = buf[r * B * T:(r + 1) * B * T + 1]
            x, y = mine[:-1].reshape(B, T), mine[1:].reshape(B, T)
            global_tokens = buf[:-1]
            self.pos += G
        self.step += 1
        return Batch(x.astype(self.dtype), y.astype(self.dtype), global_tokens)

    def __iter__(self):
        return self

    def __next__(self):
        return self.next_batch()

    def state_dict(self):
        """Where the stream stands: enough to reproduce the exact next batches."""
        shard, offset = self.stream.locate(self.pos)
        return {
            "step": self.step,
            "epoch": self.epoch,
            "shard": shard,
            "offset": offset,
            "shard_name": os.path.basename(self.stream.files[shard]),
            "global_batch_tokens": self.global_batch_tokens,
            "seq_len": self.T,
            "align_to_documents": self.align_to_documents,
        }

    def load_state_dict(self, state, strict=True):
        """Resume from `state_dict()`. With `strict`, a different batch geometry or shard
        list (the shard name at the saved index differs) raises ValueError."""
        shard, offset = int(state["shard"]), int(state["offset"])
        if not 0 <= shard < len(self.stream.files):
            raise ValueError(f"load_state_dict: shard is {shard}, expected an index in [0, {len(self.stream.files)})")
        size = int(self.stream.starts[shard + 1] - self.stream.starts[shard])
        if not 0 <= offset <= size:
            raise ValueError(f"load_state_dict: offset is {offset}, expected [0, {size}] for {self.stream.files[shard]}")
        if strict:
            name = os.path.basename(self.stream.files[shard])
            if state.get("shard_name", name) != name:
                raise ValueError(f"load_state_dict: shard {shard} is {name}, but the state was saved at {state['shard_name']}")
            for key, mine in (("global_batch_tokens", self.global_batch_tokens), ("seq_len", self.T),
                              ("align_to_documents", self.align_to_documents)):
                if key in state and state[key] != mine:
                    raise ValueError(f"load_state_dict: {key} is {state[key]} in the state, {mine} in this loader")
        self.pos = int(self.stream.starts[shard]) + offset
        self.step = int(state["step"])
        self.epoch = int(state.get("epoch", 0))


def iter_tokens(files, max_tokens=None, chunk_tokens=CHUNK_TOKENS):
    """Yield the stream of `files` (sorted) as consecutive read-only uint16 chunks, up to `max_tokens`.

    Chunks hold at most `chunk_tokens` tokens and never span two shards (they are views
    of the memory-mapped shards, not copies).
    """
    if max_tokens is not None and max_tokens < 0:
        raise ValueError(f"iter_tokens: max_tokens is {max_tokens}, expected >= 0 or None")
    if chunk_tokens < 1:
        raise ValueError(f"iter_tokens: chunk_tokens is {chunk_tokens}, expected >= 1")
    left = float("inf") if max_tokens is None else max_tokens
    for path in resolve_files(files):
        if left <= 0:
            return
        tokens = read_shard(path)
        n = int(min(len(tokens), left))
        for i in range(0, n, chunk_tokens):
            yield np.asarray(tokens[i:min(i + chunk_tokens, n)])
        left -= n


def read_tokens(files, max_tokens=None, strict=True):
    """The first `max_tokens` tokens of the stream of `files` as one uint16 array (all when None).

    With `strict`, fewer available tokens than `max_tokens` raises ValueError.
    """
    files = resolve_files(files)
    if max_tokens is not None:
        available = sum(shard_token_count(f) for f in files)
        if strict and available < max_tokens:
            raise ValueError(f"read_tokens: {len(files)} shard(s) from {files[0]} hold {available} tokens, "
                             f"fewer than the {max_tokens} asked for")
    chunks = list(iter_tokens(files, max_tokens))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint16)
