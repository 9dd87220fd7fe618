"""Training-time hints of the record's representation: one exact positional index per node.

The loader fixes the training stream's order at the start, so the whole stream the run will train
on (the concatenation of every step's global batch, step s at [s*G, (s+1)*G), rank r's slice at
[s*G + r*B*T, s*G + (r+1)*B*T)) is known before step 0. Local rank 0 of each node reads it with a
loader of its own (data/loader.py's, or the record's packed loader data/packed_loader.py with
B = 1, a rank's slice then its packed row of T inputs: start_build's `loader`) and builds
hints.positional.PositionalIndex over it in a thread (Numba releases the GIL), in phases (up to
steps 8, 32, then all: hints.positional.phase_ends), each published as a file in shared memory
(/dev/shm) by an atomic rename. Every rank of the node, rank 0 included, maps the newest phase
that covers the step it prepares, read-only. No rank adds anything during training.

A lookup for step s counts only occurrences whose follower lies before s*G (step s's first token,
on any rank), at most the 96 most recent (the record's cap), and keeps 2 followers per position
(the record's training setting). N-grams restart at every BOS and at each rank slice's start, in
the index (segment = B*T) and in the query (the slice is one query). Step 0 has no hints.
(The record's index stream, exact_match/src/stream.rs, holds each rank's T + 1 tokens, its last
target too, then a STOP; here a slice is its T inputs, so a slice's last n-gram is indexed with
the next slice's first token, a BOS in a packed stream, as its follower, not with its target.)

`cells_to_arrays` turns Cells into what the model takes (model/hint_cells.py). `trained(step)` is
the index as of a step, for validation when no other index is there (train/val_hints.py's
"training" fallback): the occurrences of the steps trained so far, at most the 96 most recent.
"""
import atexit
import os
import shutil
import tempfile
import threading
import time

import numpy as np

from data.loader import DistributedDataLoader
from hints.cells import BOS, empty_cells
from hints.positional import DEFAULT_CAP, TRAIN_FOLLOWERS, build_phases, load_covering, phase_ends

# Shared memory for the phases (a tmpfs every process of the node maps); the temp dir elsewhere.
SHM_DIR = "/dev/shm"
# Build phases of the record: the index first covers steps up to 8, then 32, then the whole run.
BUILD_PHASES = (8, 32)
# How long a rank waits for the phase that covers its step before it says so and fails.
PHASE_TIMEOUT_S = 600.0


def cells_to_arrays(cells, B, T):
    """Cells of B*T positions -> (followers int64 (B, T, F), cells int64 (B, T), weights float32 (B, T, F))."""
    F = cells.followers.shape[1]
    return (np.ascontiguousarray(cells.followers, dtype=np.int64).reshape(B, T, F),
            np.ascontiguousarray(cells.kind, dtype=np.int64).reshape(B, T),
            np.ascontiguousarray(cells.follower_counts, dtype=np.float32).reshape(B, T, F))


def loader_stream(loader, steps, G):
    """The global batches of `loader`'s next `steps` steps, in stream order: G * steps tokens.
    Any loader whose batches carry `global_tokens` (data/loader.py, data/packed_loader.py)."""
    out = np.empty(G * steps, dtype=np.uint16)
    for s in range(steps):
        g = loader.next_batch().global_tokens
        if len(g) != G:
            raise ValueError(f"the stream loader's step {s} has {len(g):,} global tokens, the hints expect G = {G:,}")
        out[s * G:(s + 1) * G] = g
    return out


def training_stream(train_files, B, T, world_size, steps, align_to_documents=False):
    """The G * steps tokens the run trains on, in stream order (every rank's slice of every step)."""
    loader = DistributedDataLoader(train_files, B, T, rank=0, world_size=world_size,
                                   align_to_documents=align_to_documents, log=None)
    return loader_stream(loader, steps, world_size * B * T)


def node_directory(run_id, node):
    """Where a node's phases live: shared memory when the machine has it."""
    base = SHM_DIR if os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK) else tempfile.gettempdir()
    return os.path.join(base, f"nghints-{run_id}-n{node}-positional")


class PositionalHints:
    """This rank's view of the node's positional index, and (local rank 0) its builder.

    hints = PositionalHints(directory, B, T, rank, world_size, lengths)
    hints.start_build(train_files, steps, align_to_documents, log)   # local rank 0 only
    followers, cells, weights = hints.lookup(x_flat, step)           # any rank, any thread
    """

    def __init__(self, directory, B, T, rank, world_size, lengths, cap=DEFAULT_CAP, max_followers=TRAIN_FOLLOWERS,
                 timeout=PHASE_TIMEOUT_S):
        self.directory, self.B, self.T, self.rank = directory, B, T, rank
        self.G = world_size * B * T
        self.world_size, self.lengths = world_size, tuple(lengths)
        self.cap, self.max_followers, self.timeout = cap, max_followers, timeout
        self.index = None          # the phase mapped now
        self.builder = None        # the build thread (local rank 0)
        self.build_error = None
        self.build_s = None        # seconds of the whole build (reading the stream included)
        self.phases = []           # (tokens, seconds since the build started) of each phase published
        self.started_at = None     # time.monotonic() when the build started (the clock's, on a run)

    def start_build(self, train_files, steps, align_to_documents=False, log=None, loader=None):
        """Read the run's stream and build its phases in a thread; the directory is removed at exit.
        loader: a fresh loader of the builder's own, at step 0, whose next `steps` global batches
        are the run's stream (the record's data/packed_loader.py PackedLoader at rank 0, with B = 1
        and T its tokens per rank); None: a DistributedDataLoader over train_files."""
        if loader is not None and loader.step != 0:
            raise ValueError(f"start_build: the stream loader is at step {loader.step}; the index covers the run "
                             "from step 0, so it needs a fresh loader of its own")
        self.started_at = time.monotonic()
        os.makedirs(self.directory, exist_ok=True)
        atexit.register(shutil.rmtree, self.directory, True)
        ends = phase_ends(steps, self.G, BUILD_PHASES)

        def build():
            t0 = time.perf_counter()
            try:
                stream = (loader_stream(loader, steps, self.G) if loader is not None else
                          training_stream(train_files, self.B, self.T, self.world_size, steps, align_to_documents))
                for end in ends:
                    build_phases(stream, [end], self.directory, segment=self.B * self.T, lengths=self.lengths,
                                 boundary=BOS)
                    self.phases.append((end, time.perf_counter() - t0))
                self.build_s = time.perf_counter() - t0
                if log:
                    log(f"training-time hints: positional index of {len(stream):,} tokens built in "
                        f"{self.build_s:.1f}s, phases at {', '.join(f'{e:,} ({s:.1f}s)' for e, s in self.phases)} tokens")
            except BaseException as e:  # noqa: BLE001 - lookups waiting for a phase report it
                self.build_error = e

        self.builder = threading.Thread(target=build, name="positional-index-build", daemon=True)
        self.builder.start()
        return self

    def _covering(self, before):
        if self.index is None or self.index.tokens < before:
            if self.build_error is not None:
                raise RuntimeError(f"the positional index build failed: {self.build_error!r}") from self.build_error
            self.index = load_covering(self.directory, before, timeout=self.timeout)
        return self.index

    def lookup_cells(self, x_flat, step):
        """Cells of this rank's B*T inputs at `step`: occurrences before step*G only (none at step 0)."""
        before = step * self.G
        if before == 0:
            return empty_cells(len(x_flat), self.max_followers)
        return self._covering(before).lookup_cells(x_flat, before, cap=self.cap, max_followers=self.max_followers,
                                                   boundary=BOS)

    def lookup(self, x_flat, step):
        """(followers, cells, weights) arrays for the model (cells_to_arrays) of this rank at `step`."""
        return cells_to_arrays(self.lookup_cells(x_flat, step), self.B, self.T)

    def trained(self, step):
        """The index as of `step` (the tokens of steps < step) for validation lookups."""
        return TrainedSoFar(self, step * self.G)

    def wait_built(self):
        if self.builder is not None:
            self.builder.join()
        if self.build_error is not None:
            raise RuntimeError(f"the positional index build failed: {self.build_error!r}") from self.build_error


class TrainedSoFar:
    """A positional index seen as of a stream position: `lookup_cells` as the validation indexes
    offer it, `tokens_added` the tokens it holds (train/evaluate.py caches on it)."""

    def __init__(self, hints, tokens):
        self.hints, self.tokens_added = hints, tokens

    def lookup_cells(self, tokens, max_followers, boundary=BOS):
        if self.tokens_added == 0:
            return empty_cells(len(tokens), max_followers)
        return self.hints._covering(self.tokens_added).lookup_cells(tokens, self.tokens_added, cap=self.hints.cap,
                                                                    max_followers=max_followers, boundary=boundary)
