"""Exact hints by counting: look up each query (validation) n-gram in a training stream.

The hint index stores a hint for every training n-gram and answers any query. When the
query is known in advance (the validation tokens), the count can be turned around: take
the query's 6-, 10- and 20-grams, stream the training tokens past them, and count which
token follows each one. The hints still come only from training data, and nothing is
dropped: `count_exact(query, train)` equals `ReferenceIndex(lengths).add(train).lookup(query)`
(`hints.index.reference`), field for field.

Two backends run the same algorithm:
  * "torch": sort/unique/searchsorted on torch tensors, CPU or GPU. The reference for the
    kernels, and exact validation hints on a CPU machine.
  * "triton": the kernels of `hints.exact.triton_kernels` (hash tables and atomics), driven by
    `hints.exact.triton_count`, on a CUDA GPU; on a CPU they run in Triton's interpreter (slow; for
    tests with small inputs).

Fingerprints. An n-gram is compared by its 64-bit fingerprint F_L (hints/fingerprint.py: the
definition, why collisions are negligible, and how they are measured).

torch is imported inside the functions that need it: `import hints` stays torch-free.
"""
import time

import numpy as np

from ..fingerprint import multipliers
from ..index import DEFAULT_LENGTHS, Hints, hints_from_counts
from ..tokens import as_tokens

TOKEN_BITS = 16  # a follower token fits in the low 16 bits of a (query n-gram, follower) pair key
TOKEN_MASK = (1 << TOKEN_BITS) - 1
TORCH_CPU_CHUNK = 1 << 22  # training tokens per step of the torch backend on CPU (~0.5 GiB of temporaries)
TORCH_GPU_CHUNK = 1 << 27  # ... and on a GPU (temporaries ~ 40 B/token: 5 GiB)
MERGE_PAIRS_CPU = 1 << 24  # (query n-gram, follower) hits buffered before a merge (a sort) on CPU: 128 MiB
MERGE_PAIRS_GPU = 1 << 27  # ... and on a GPU: 1 GiB
BITMAP_BITS_PER_NGRAM = 16  # bitmap of the query fingerprints' top bits: ~16 bits per distinct n-gram,
BITMAP_MIN_BITS = 16        # so a training n-gram not in the query passes it with p ~ 1/16
BITMAP_MAX_BITS = 30        # (128 MiB of bools at most)
BACKENDS = ("torch", "triton")


def check_lengths(lengths):
    lengths = tuple(int(v) for v in lengths)
    if not lengths or lengths[0] < 1 or any(b <= a for a, b in zip(lengths, lengths[1:])):
        raise ValueError(f"lengths={lengths}: expected strictly increasing n-gram lengths >= 1, like (6, 10, 20)")
    return lengths


def resolve_device(backend, device):
    """The torch device a backend runs on: the given one, else CUDA when present, else CPU."""
    import torch
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {', '.join(BACKENDS)}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device}: CUDA is not available on this machine")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device={device}: expected a cpu or cuda device")
    return device


def _train_pieces(train, max_piece):
    """The training stream as consecutive 1-D pieces of at most max_piece tokens: numpy uint16
    arrays, or torch integer tensors passed through as they are (already on a device)."""
    import torch
    chunks = [train] if isinstance(train, (np.ndarray, torch.Tensor)) else train
    for i, chunk in enumerate(chunks):
        if isinstance(chunk, torch.Tensor):
            if chunk.ndim != 1 or chunk.dtype not in (torch.uint16, torch.int32, torch.int64):
                raise ValueError(f"train chunk {i}: expected a 1-D integer tensor of token ids, got "
                                 f"shape {tuple(chunk.shape)} dtype {chunk.dtype}")
        else:
            chunk = as_tokens(chunk, name=f"train chunk {i}")
        for a in range(0, len(chunk), max_piece):
            yield chunk[a:a + max_piece]


def count_exact(query, train, lengths=DEFAULT_LENGTHS, backend="torch", device=None, chunk_tokens=None,
                progress=None, stats=None, **backend_options):
    """Exact hints for every position of `query`: the most frequent follower of each of its
    n-grams in `train` (ties to the smallest id), the n-gram's count, purity and kind.

    query: 1-D uint16 token array. train: a 1-D uint16 array, or an iterable of such arrays
    (chunks in stream order; n-grams that span chunk boundaries count); torch integer tensors
    are taken as they are. Returns `Hints` with HintIndex.lookup's shapes (len(lengths),
    len(query)) and conventions. chunk_tokens: training tokens per step (default: sized for
    the device). progress: something with update(n) (a tqdm bar), told of each step's tokens.
    stats: a dict to fill with the counter's figures (tables, pairs, syncs). backend_options go
    to the Triton counter (block, programs, pair_capacity, max_pair_bytes).
    """
    lengths = check_lengths(lengths)
    query = as_tokens(query, name="query")
    device = resolve_device(backend, device)
    if backend == "torch":
        if backend_options:
            raise ValueError(f"backend='torch' takes no options {sorted(backend_options)}")
        counter = TorchCounter(query, lengths, device)
        default_chunk = TORCH_GPU_CHUNK if device.type == "cuda" else TORCH_CPU_CHUNK
    else:
        from . import triton_count
        counter = triton_count.TritonCounter(query, lengths, device, **backend_options)
        default_chunk = counter.default_chunk_tokens
    chunk_tokens = int(chunk_tokens or default_chunk)
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens}: expected >= 1")
    for piece in _train_pieces(train, chunk_tokens):
        counter.add(piece)
        if progress is not None:
            progress.update(len(piece))
    tok, cnt, top = counter.result()
    if stats is not None:
        stats.update(counter.stats())
    return hints_from_counts(tok, cnt, top)


# ---- the torch backend -----------------------------------------------------------------------

class TorchCounter:
    """Sort/unique/searchsorted counting on torch tensors (CPU or GPU).

    Per length k: the sorted distinct query fingerprints `uniq[k]` (a query n-gram's id is its
    rank there), a bitmap of their top bits (most training positions miss it and skip the
    search), and the (id << 16 | follower) pairs counted so far, sorted, with their counts.
    Each training chunk is fingerprinted (a longer length only where the shorter one was found:
    a longer query n-gram ends in a shorter one), looked up with searchsorted, and its pairs
    are buffered and merged into the counts with unique once MERGE_PAIRS have gathered.
    """

    def __init__(self, query, lengths, device):
        import torch
        self.torch, self.device, self.lengths = torch, device, lengths
        self.lmax = lengths[-1]
        self.A = [a - (1 << 64) if a >> 63 else a for a in multipliers(self.lmax)]  # int64 bit patterns
        q = torch.from_numpy(query.astype(np.int64)).to(device)
        ends = torch.arange(1, q.numel() + 1, device=device)  # the n-gram ending at t ends before t + 1
        self.n_query = q.numel()
        self.uniq, self.qid, self.bitmap, self.bitmap_bits = [], [], [], []
        for k, f in enumerate(self._fingerprints(q, ends)):
            valid = ends >= lengths[k]
            u, inv = torch.unique(f[valid], return_inverse=True)
            qid = torch.full((q.numel(),), -1, dtype=torch.int64, device=device)
            qid[valid] = inv
            bits = min(BITMAP_MAX_BITS, max(BITMAP_MIN_BITS, (BITMAP_BITS_PER_NGRAM * u.numel()).bit_length()))
            bitmap = torch.zeros(1 << bits, dtype=torch.bool, device=device)
            bitmap[self._top_bits(u, bits)] = True
            self.uniq.append(u)
            self.qid.append(qid)
            self.bitmap.append(bitmap)
            self.bitmap_bits.append(bits)
        self.pairs = [torch.zeros(0, dtype=torch.int64, device=device) for _ in lengths]
        self.counts = [torch.zeros(0, dtype=torch.int64, device=device) for _ in lengths]
        self.buffer = [[] for _ in lengths]
        self.buffered = 0
        self.merge_pairs = MERGE_PAIRS_GPU if device.type == "cuda" else MERGE_PAIRS_CPU
        self.tail = torch.zeros(0, dtype=torch.int64, device=device)
        self.seen = 0

    @staticmethod
    def _top_bits(f, bits):
        return (f >> (64 - bits)) & ((1 << bits) - 1)  # >> is arithmetic on int64: mask the sign copies

    def _fingerprints(self, buf, ends):
        """F_L of the windows buf[e-L .. e-1] (e in ends) for each length, at every end."""
        torch = self.torch
        s = torch.zeros(ends.numel(), dtype=torch.int64, device=self.device)
        padded = torch.cat([torch.zeros(self.lmax, dtype=torch.int64, device=self.device), buf]) + 1
        out, lo = [], 0
        for L in self.lengths:
            for i in range(lo, L):
                s.add_(padded[ends + (self.lmax - 1 - i)], alpha=self.A[i])
            lo = L
            out.append(torch.where(s == 0, torch.ones_like(s), s))
        return out

    def add(self, chunk):
        torch = self.torch
        chunk = torch.as_tensor(chunk) if isinstance(chunk, torch.Tensor) else torch.from_numpy(chunk.astype(np.int64))
        chunk = chunk.to(self.device, torch.int64)
        if chunk.numel() == 0:
            return
        ext = torch.cat([self.tail, chunk])  # followers are ext[j] for j >= h, after ext[j-L .. j-1]
        h, first, lmax = self.tail.numel(), self.seen - self.tail.numel(), self.lmax  # first: stream index of ext[0]
        self.tail = ext[-min(lmax, ext.numel()):]
        self.seen += chunk.numel()
        j0 = max(h, self.lengths[0] - first)  # the first follower of a whole shortest n-gram
        n = ext.numel() - j0
        if n <= 0:
            return
        x1 = torch.cat([torch.zeros(lmax, dtype=torch.int64, device=self.device), ext]) + 1  # token + 1, padded
        s = torch.zeros(n, dtype=torch.int64, device=self.device)
        for i in range(self.lengths[0]):  # all positions: contiguous slices
            a = j0 + lmax - 1 - i
            s.add_(x1[a:a + n], alpha=self.A[i])
        j = None  # the surviving followers' ext indices (all of j0.. until the first filter)
        lo = self.lengths[0]
        for k, L in enumerate(self.lengths):
            if k:
                keep = j + first >= L
                j, s = j[keep], s[keep]
                for i in range(lo, L):
                    s.add_(x1[j + (lmax - 1 - i)], alpha=self.A[i])
                lo = L
            f = torch.where(s == 0, torch.ones_like(s), s)
            cand = self.bitmap[k][self._top_bits(f, self.bitmap_bits[k])].nonzero().squeeze(1)
            j = cand + j0 if j is None else j[cand]
            f, s = f[cand], s[cand]
            u = self.uniq[k]
            pos = torch.searchsorted(u, f).clamp_(max=max(u.numel() - 1, 0))
            hit = u[pos] == f if u.numel() else torch.zeros_like(f, dtype=torch.bool)
            j, s, pos = j[hit], s[hit], pos[hit]
            if j.numel() == 0:
                break
            self.buffer[k].append(pos * (1 << TOKEN_BITS) + ext[j])
            self.buffered += j.numel()
        if self.buffered >= self.merge_pairs:
            self._merge()

    def _merge(self):
        """Fold the buffered pairs (count 1 each) into the sorted pairs and counts."""
        torch = self.torch
        for k in range(len(self.lengths)):
            if not self.buffer[k]:
                continue
            new = torch.cat(self.buffer[k])
            allp = torch.cat([self.pairs[k], new])
            allc = torch.cat([self.counts[k], torch.ones_like(new)])
            merged, inv = torch.unique(allp, return_inverse=True)
            self.pairs[k] = merged
            self.counts[k] = torch.zeros(merged.numel(), dtype=torch.int64, device=self.device).scatter_add_(0, inv, allc)
            self.buffer[k] = []
        self.buffered = 0

    def stats(self):
        return dict(training_tokens=self.seen, distinct_query_ngrams=[u.numel() for u in self.uniq],
                    pairs=[p.numel() for p in self.pairs])

    def result(self):
        """(hinted token, n-gram count, top follower's count): int32 NumPy arrays (K, n)."""
        torch = self.torch
        self._merge()
        K, n = len(self.lengths), self.n_query
        tok = torch.full((K, n), -1, dtype=torch.int64, device=self.device)
        cnt = torch.zeros((K, n), dtype=torch.int64, device=self.device)
        top = torch.zeros((K, n), dtype=torch.int64, device=self.device)
        for k in range(K):
            d = self.uniq[k].numel()
            ids, follower = self.pairs[k] >> TOKEN_BITS, self.pairs[k] & TOKEN_MASK
            total = torch.zeros(d, dtype=torch.int64, device=self.device).scatter_add_(0, ids, self.counts[k])
            # the largest (count, -token): the most frequent follower, ties to the smallest id
            packed = self.counts[k] * (1 << TOKEN_BITS) + (TOKEN_MASK - follower)
            best = torch.zeros(d, dtype=torch.int64, device=self.device).scatter_reduce_(0, ids, packed, "amax")
            qid = self.qid[k]
            found = qid >= 0
            q = qid[found]
            t, b = total[q], best[q]
            cnt[k, found] = t
            top[k, found] = b >> TOKEN_BITS
            tok[k, found] = torch.where(t > 0, TOKEN_MASK - (b & TOKEN_MASK), torch.full_like(t, -1))
        return tuple(x.to(torch.int32).cpu().numpy() for x in (tok, cnt, top))


# ---- for the trainer ------------------------------------------------------------------------

class ExactHints:
    """Exact hints of positions [start, stop) of one token stream (the validation tokens),
    computed once, answered by lookup_span like a HintIndex (`tokens_added` is the number of
    training tokens counted)."""

    def __init__(self, stream, hints, start, lengths, tokens_added, seconds, backend, device):
        self.stream, self.hints, self.start, self.lengths = stream, hints, int(start), tuple(lengths)
        self.stop = self.start + hints.token.shape[1]
        self.tokens_added, self.seconds, self.backend, self.device = int(tokens_added), seconds, backend, str(device)

    def lookup_span(self, stream, start, stop):
        """Hints for positions start..stop-1 of the stream they were counted for."""
        if stream is not self.stream and (len(stream) != len(self.stream) or not np.array_equal(stream, self.stream)):
            raise ValueError(f"exact hints were counted for one stream of {len(self.stream):,} tokens; "
                             f"asked about another of {len(stream):,} tokens")
        if not self.start <= start <= stop <= self.stop:
            raise ValueError(f"exact hints cover positions [{self.start:,}, {self.stop:,}); asked for [{start:,}, {stop:,})")
        h, a, b = self.hints, start - self.start, stop - self.start
        return Hints(token=h.token[:, a:b], count=h.count[:, a:b], purity=h.purity[:, a:b], kind=h.kind[:, a:b])

    def describe(self):
        return (f"exact count ({self.backend} on {self.device}) of {self.stop - self.start:,} positions against "
                f"{self.tokens_added:,} training tokens in {self.seconds:.2f}s")


def exact_val_hints(val_tokens, train_chunks, lengths=DEFAULT_LENGTHS, backend="torch", device=None, start=0, stop=None,
                    progress=None):
    """Count the n-grams at positions [start, stop) of the validation stream (each with its whole
    n-grams: the longest length - 1 tokens before start are read too) in `train_chunks` (an
    iterable of uint16 arrays in stream order, e.g. the first --hint-tokens of the training
    shards), and wrap the hints for the trainer's evaluate(). The count's time is in .seconds."""
    import torch
    lengths = check_lengths(lengths)
    val = as_tokens(val_tokens, name="val_tokens")
    stop = val.size if stop is None else int(stop)
    if not 0 <= start <= stop <= val.size:
        raise ValueError(f"start={start}, stop={stop}: expected 0 <= start <= stop <= {val.size:,} (the val tokens)")
    lo = max(0, start - (lengths[-1] - 1))
    seen = [0]

    def counted(chunks):
        for c in ([chunks] if isinstance(chunks, (np.ndarray, torch.Tensor)) else chunks):
            seen[0] += len(c)
            yield c

    t0 = time.perf_counter()
    dev = resolve_device(backend, device)
    h = count_exact(val[lo:stop], counted(train_chunks), lengths, backend=backend, device=dev, progress=progress)
    k = start - lo
    h = Hints(token=h.token[:, k:], count=h.count[:, k:], purity=h.purity[:, k:], kind=h.kind[:, k:])
    return ExactHints(val_tokens, h, start, lengths, seen[0], time.perf_counter() - t0, backend, dev)
