"""The record's data loader: BOS-aligned packed rows, one 1-D row a rank a step, and its unaligned
validation reader (docs/design.md; the record's track_1_short/data.py and config.py).

Training (`PackedLoader`). The shards are read in name order, once (no wrap-around). A shard's
documents start at its BOS tokens: one runs from a BOS to the next BOS or to the shard's end;
tokens before a shard's first BOS are never read. Step s, with cut length c = cut_length(s) and
T tokens a rank, W ranks: rank 0 takes the next documents in order, each cut to its first c
tokens (the rest is dropped), until it holds T + 1 tokens, the last document cut to fit (its
rest dropped too); then rank 1 continues with the next document, and so on to rank W - 1. A
rank's inputs are its row's first T tokens, its targets the last T (inputs shifted by one);
its document starts are where its documents begin inside the inputs (0 first: every row starts
at a BOS). When the shard runs out of documents before rank W - 1 is full, the documents the
step took from it are dropped with the rest of the shard, and the whole step comes from the
next shard; the step after continues with the document after the step's last one. Every rank
plans the whole step, so all ranks agree without talking, and every batch carries
`global_tokens`: every rank's inputs of the step in rank order (W * T tokens), the stream the
training-time positional index is built over (train/positional_hints.py), so rank r's inputs are
its slice [r*T, (r+1)*T) of the step's global tokens. Nothing but the cut length per step
depends on the schedule: the caller gives `cut_length(step)` (a callable, a list indexed by
step, or one int).

Attention segments (`segment_starts`): the document starts, plus (when asked) a start every
`split_every` tokens inside a document counted from its start; the record splits at
VIRTUAL_SEQ_CAP = 2560 on the steps whose cut length exceeds it (`record_split`). Only attention
sees the splits; hints restart at BOS only.

Validation (`ValidationReader`): unaligned. Batch b covers W * T_val tokens from pos = b * W *
T_val; rank r reads the T_val + 1 tokens at pos + r * T_val (inputs, and targets shifted by one);
its segments start at 0 and at every BOS of its inputs (no splits). The number of batches is the
token budget over W * T_val, which must divide it, as in the record.

Resume: `state_dict()` / `load_state_dict(state)` (what train/checkpoint.py saves for a loader),
or `skip(n)` from a fresh loader; either gives exactly the batches of an uninterrupted run.
Bad input (shards that run out of documents for a step, a shard without a BOS, a state that does
not fit the shards) raises ValueError naming the file. NumPy only, like data/loader.py.
"""
import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from data.loader import SPEEDRUN_VAL_TOKENS, TokenStream
from data.tokenizer import EOT_TOKEN

# Tokens a rank trains on each step: the record's batch_size 8 * 2048 * 8 = 131,072 a step in every
# stage (track_1_short/config.py TRAINING_STAGES) over its 8 ranks (track_1_short/distributed.py).
TOKENS_PER_RANK = 16_384
# Documents may run to 3072 tokens, but attention segments are cut every this many tokens inside a
# document (the record's track_1_short/config.py VIRTUAL_SEQ_CAP; data.py applies it to the steps
# whose cut length, train_max_seq_len, exceeds it).
VIRTUAL_SEQ_CAP = 2560
# Validation tokens a rank reads per batch: the record's val_batch_size 4 * 64 * 1024 * 8 = 2,097,152
# (track_1_short/config.py) over 8 ranks; its val_tokens (10,485,760) make 5 batches.
VAL_TOKENS_PER_RANK = 262_144


def record_split(cut_length, cap=VIRTUAL_SEQ_CAP):
    """The record's split for a step of this cut length: `cap` when documents can outrun it, else None."""
    return cap if int(cut_length) > cap else None


def segment_starts(doc_starts, T, split_every=None):
    """cu_seqlens (S+1,) int32 of a row of T tokens: every document start (doc_starts: ascending,
    from 0, below T), plus a start every `split_every` tokens inside each document counted from
    its start (None: no splits), then T."""
    starts = np.asarray(doc_starts, dtype=np.int64)
    T = int(T)
    if starts.ndim != 1 or starts.size == 0 or starts[0] != 0:
        raise ValueError(f"segment_starts: doc_starts must be a 1-D array starting at 0, got {starts[:8]!r}")
    if np.any(np.diff(starts) <= 0) or starts[-1] >= T:
        raise ValueError(f"segment_starts: doc_starts must increase strictly and stay below T = {T}")
    if split_every is not None:
        split_every = int(split_every)
        if split_every < 1:
            raise ValueError(f"segment_starts: split_every is {split_every}, expected a positive number of tokens")
        ends = np.append(starts[1:], T)
        starts = np.concatenate([np.arange(a, b, split_every) for a, b in zip(starts, ends)])
    return np.append(starts, T).astype(np.int32)


class PackedBatch(NamedTuple):
    """One step for one rank (module docstring)."""

    step: int
    inputs: np.ndarray         # (T,) the loader's dtype
    targets: np.ndarray        # (T,) inputs shifted by one
    doc_starts: np.ndarray     # (D,) int32: where documents begin inside inputs, ascending, from 0
    global_tokens: np.ndarray  # (W*T,) uint16: every rank's inputs of the step, in rank order
    cut_length: int            # the step's cut length
    shard: int                 # index (in name order) of the shard the step came from
    documents: np.ndarray      # (D', 2) int64: this rank's documents as [start, end) in that shard
    #                            (D' = D + 1 when the last one lends the row only its final target)


def _as_cut_lengths(cut_length):
    """cut_length -> a function step -> int (a callable, a list indexed by step, or one int)."""
    if callable(cut_length):
        return cut_length
    if isinstance(cut_length, (int, np.integer)):
        return lambda step: int(cut_length)
    if isinstance(cut_length, (Sequence, np.ndarray)):
        lengths = list(cut_length)

        def by_step(step):
            if step >= len(lengths):
                raise ValueError(f"cut_length: the list gives {len(lengths)} steps' cut lengths, step {step} has none")
            return lengths[step]
        return by_step
    raise TypeError(f"cut_length is {cut_length!r}: expected a callable step -> int, a list, or an int")


class PackedLoader:
    """Deterministic, resumable BOS-aligned packed rows for rank `rank` of `world_size` (module docstring).

    loader = PackedLoader(files, cut_length, tokens_per_rank=TOKENS_PER_RANK, rank=0, world_size=1)
    batch = loader.next_batch()          # PackedBatch of step loader.step, then loader.step += 1
    state = loader.state_dict(); other.load_state_dict(state)   # or other.skip(n)
    """

    def __init__(self, files, cut_length, tokens_per_rank=TOKENS_PER_RANK, rank=0, world_size=1, dtype=np.int64,
                 bos=EOT_TOKEN):
        for name, v in (("tokens_per_rank", tokens_per_rank), ("world_size", world_size)):
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"PackedLoader: {name} is {v!r}, expected a positive integer")
        if not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
            raise ValueError(f"PackedLoader: rank is {rank!r}, expected an integer in [0, {world_size})")
        self.stream = TokenStream(files)
        self.cut_length = _as_cut_lengths(cut_length)
        self.T, self.rank, self.world_size = int(tokens_per_rank), int(rank), int(world_size)
        self.global_batch_tokens = self.world_size * self.T
        self.dtype, self.bos = np.dtype(dtype), int(bos)
        self.step = 0       # steps taken
        self.shard = 0      # the shard the next step starts in
        self.document = 0   # index, among that shard's documents, of the next step's first one
        self._bos_of = (None, None)  # (shard, its BOS positions): the current shard's document starts

    # -- planning -----------------------------------------------------------------------------------
    def _bos(self, shard):
        """BOS positions of `shard` (scanned once while it is current); a shard without one is refused."""
        if self._bos_of[0] != shard:
            starts = np.flatnonzero(self.stream.shard_tokens(shard) == self.bos)
            if starts.size == 0:
                raise ValueError(f"PackedLoader: shard {self.stream.files[shard]} has no BOS token ({self.bos}): "
                                 "BOS-aligned packing needs documents that start with one")
            self._bos_of = (shard, starts)
        return self._bos_of[1]

    def _cut(self, step):
        c = self.cut_length(step)
        if not isinstance(c, (int, np.integer)) or c < 1:
            raise ValueError(f"PackedLoader: cut_length({step}) is {c!r}, expected a positive number of tokens")
        return int(c)

    def _plan(self, cut):
        """The next step's documents: (shard, per rank a list of (start, end) in it, next document index)."""
        shard, first, need = self.shard, self.document, self.T + 1
        while shard < len(self.stream.files):
            bos = self._bos(shard)
            size = int(self.stream.starts[shard + 1] - self.stream.starts[shard])
            ranks, i = [], first
            while len(ranks) < self.world_size and i < len(bos):
                docs, have = [], 0
                while have < need and i < len(bos):
                    start = int(bos[i])
                    stop = int(bos[i + 1]) if i + 1 < len(bos) else size
                    end = min(stop, start + cut, start + need - have)
                    docs.append((start, end))
                    have += end - start
                    i += 1
                if have == need:
                    ranks.append(docs)
            if len(ranks) == self.world_size:
                return shard, ranks, i
            shard, first = shard + 1, 0  # this shard ran out: its leftover documents (this step's too) are dropped
        raise ValueError(f"PackedLoader: the training shards ({self.stream.files[0]} ... {self.stream.files[-1]}) run "
                         f"out of documents at step {self.step}: it needs {self.world_size} x {need} tokens of "
                         f"documents cut at {cut} from one shard, and none is left")

    # -- batches ------------------------------------------------------------------------------------
    def next_batch(self):
        """This rank's PackedBatch of step `self.step`; advances the loader by one step."""
        cut = self._cut(self.step)
        shard, ranks, nxt = self._plan(cut)
        tokens = self.stream.shard_tokens(shard)
        rows = [np.concatenate([tokens[a:b] for a, b in docs]) for docs in ranks]
        T, mine = self.T, ranks[self.rank]
        row = rows[self.rank]
        lengths = np.array([b - a for a, b in mine], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        batch = PackedBatch(
            step=self.step, inputs=row[:T].astype(self.dtype), targets=row[1:].astype(self.dtype),
            doc_starts=starts[starts < T].astype(np.int32),
            global_tokens=np.concatenate([r[:T] for r in rows]).astype(np.uint16, copy=False),
            cut_length=cut, shard=shard, documents=np.array(mine, dtype=np.int64))
        self.shard, self.document, self.step = shard, nxt, self.step + 1
        return batch

    def skip(self, steps):
        """Advance `steps` steps without reading their tokens (as if their batches were taken)."""
        for _ in range(int(steps)):
            self.shard, _, self.document = self._plan(self._cut(self.step))
            self.step += 1

    def __iter__(self):
        return self

    def __next__(self):
        return self.next_batch()

    # -- resume -------------------------------------------------------------------------------------
    def state_dict(self):
        """Where the loader stands: enough to reproduce the exact next batches."""
        bos = self._bos(self.shard)
        size = int(self.stream.starts[self.shard + 1] - self.stream.starts[self.shard])
        return {
            "step": self.step,
            "shard": self.shard,
            "document": self.document,
            "offset": int(bos[self.document]) if self.document < len(bos) else size,
            "shard_name": os.path.basename(self.stream.files[self.shard]),
            "tokens_per_rank": self.T,
            "world_size": self.world_size,
            "packed": True,
        }

    def load_state_dict(self, state, strict=True):
        """Resume from `state_dict()`. With `strict`, another geometry, shard list or shard content
        (the saved document does not start at the saved offset) raises ValueError."""
        if not state.get("packed", False):
            raise ValueError("load_state_dict: the state is not a PackedLoader's (saved by another loader?)")
        shard, document = int(state["shard"]), int(state["document"])
        if not 0 <= shard < len(self.stream.files):
            raise ValueError(f"load_state_dict: shard is {shard}, expected an index in [0, {len(self.stream.files)})")
        bos = self._bos(shard)
        if not 0 <= document <= len(bos):
            raise ValueError(f"load_state_dict: document is {document}, but {self.stream.files[shard]} has "
                             f"{len(bos)} documents")
        if strict:
            name = os.path.basename(self.stream.files[shard])
            if state["shard_name"] != name:
                raise ValueError(f"load_state_dict: shard {shard} is {name}, but the state was saved at "
                                 f"{state['shard_name']}")
            for key, mine in (("tokens_per_rank", self.T), ("world_size", self.world_size)):
                if state[key] != mine:
                    raise ValueError(f"load_state_dict: {key} is {state[key]} in the state, {mine} in this loader")
            size = int(self.stream.starts[shard + 1] - self.stream.starts[shard])
            offset = int(bos[document]) if document < len(bos) else size
            if int(state["offset"]) != offset:
                raise ValueError(f"load_state_dict: document {document} of {self.stream.files[shard]} starts at "
                                 f"{offset}, but the state says {state['offset']} (the shard changed?)")
        self.shard, self.document, self.step = shard, document, int(state["step"])


class ValBatch(NamedTuple):
    """One validation batch for one rank: inputs, targets (T_val,) and its segment starts' documents."""

    inputs: np.ndarray      # (T_val,) the reader's dtype
    targets: np.ndarray     # (T_val,) inputs shifted by one
    doc_starts: np.ndarray  # (D,) int32: 0 and every BOS of inputs (segment_starts(doc_starts, T_val))


class ValidationReader:
    """The record's unaligned validation batches for rank `rank` of `world_size` (module docstring).

    reader = ValidationReader(files, tokens_per_rank=VAL_TOKENS_PER_RANK, rank=0, world_size=1)
    len(reader) batches; reader.batch(b) or iterate.
    """

    def __init__(self, files, tokens_per_rank=VAL_TOKENS_PER_RANK, rank=0, world_size=1,
                 val_tokens=SPEEDRUN_VAL_TOKENS, dtype=np.int64, bos=EOT_TOKEN):
        for name, v in (("tokens_per_rank", tokens_per_rank), ("world_size", world_size), ("val_tokens", val_tokens)):
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"ValidationReader: {name} is {v!r}, expected a positive integer")
        if not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
            raise ValueError(f"ValidationReader: rank is {rank!r}, expected an integer in [0, {world_size})")
        self.stream = TokenStream(files)
        self.T, self.rank, self.world_size = int(tokens_per_rank), int(rank), int(world_size)
        self.batch_tokens = self.world_size * self.T
        self.dtype, self.bos = np.dtype(dtype), int(bos)
        if val_tokens % self.batch_tokens:
            raise ValueError(f"ValidationReader: val_tokens {val_tokens:,} is not a whole number of batches of "
                             f"{self.world_size} x {self.T:,} tokens (the record asserts it is)")
        self.n_batches = int(val_tokens) // self.batch_tokens
        need = self.n_batches * self.batch_tokens + 1
        if self.stream.total < need:
            raise ValueError(f"ValidationReader: {self.stream.files[0]} ... hold {self.stream.total:,} tokens, "
                             f"{self.n_batches} batches of {self.batch_tokens:,} need {need:,} (the last is a target)")

    def __len__(self):
        return self.n_batches

    def batch(self, b):
        """This rank's ValBatch of batch b: the T_val + 1 tokens at b * W * T_val + rank * T_val."""
        if not 0 <= b < self.n_batches:
            raise IndexError(f"ValidationReader.batch({b}): expected a batch in [0, {self.n_batches})")
        at = b * self.batch_tokens + self.rank * self.T
        buf = self.stream.read(at, at + self.T + 1)
        inputs = buf[:-1]
        starts = np.union1d([0], np.flatnonzero(inputs == self.bos)).astype(np.int32)
        return ValBatch(inputs.astype(self.dtype), buf[1:].astype(self.dtype), starts)

    def __iter__(self):
        return (self.batch(b) for b in range(self.n_batches))
