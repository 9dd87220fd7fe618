"""Gradient sync that overlaps backward: bucketed asynchronous reductions started from
post-accumulate-grad hooks.

Every trainable parameter's gradient lives as a view in a flat bucket buffer allocated once
(no per-step concatenation or copy-back). When backward has accumulated the last gradient of a
bucket, its hook starts the bucket's collective asynchronously, so communication runs while
backward continues. Two kinds of buckets:
  * all-reduce buckets (built here): parameters replicated on every rank (the Adam groups);
    averaged in place;
  * sharded buckets (built by an optimizer that reduces its own gradients, i.e. Muon with
    shard_grads=True, listed in its `grad_buckets`): reduce-scattered in place, each rank
    getting the average of its own share. GradSync skips their parameters when it builds its
    all-reduce buckets, so no gradient is reduced twice.
Buckets start strictly in one order, the same on every rank (collectives pair up by order), a
bucket waiting for earlier ones. The order is the order gradients arrive: first guessed as the
reverse of the parameter order, then rebuilt once, after the first backward, from the arrival
order observed on rank 0.

Trainer call sequence, one backward per step:
    sync = GradSync(model, optimizers)  # after build_optimizers, once
    loss.backward()                     # hooks start the reductions as gradients complete
    sync.wait()                         # starts what is left, waits for the all-reduce buckets
    for opt in optimizers: opt.step()   # Muon waits for its own sharded buckets
    sync.zero_grad()                    # zeroes the buckets; the gradients stay views
The big tables. A bucket holds one dtype, and a gradient has its parameter's dtype: on the GPU
path the token and value-embedding tables are bf16 (GPT.cast_embeddings, as in the 2025-01-04
record), so their gradients (4 x 77 MB at the record's shape) are all-reduced in bf16, half the
bytes of float32. They cannot start earlier: the value embeddings feed blocks 0-2 and the token
table the embedding and the hints, so their gradients complete only at the very end of backward.
The float32 LM head (154 MB) gets its gradient first in backward, and its bucket starts at once
(after the first step's rebuild in arrival order), overlapping the whole backward.
Under a whole-model torch.compile the backward is one autograd node, so every hook fires at its
end and only Muon's Newton-Schulz overlaps the reductions; compile per block
(GPT.compile_regions) to overlap them with backward too. Without torch.distributed (or with one
rank) GradSync does nothing.
"""
import torch
import torch.distributed as dist

from model.collectives import all_reduce_mean, is_distributed

# DDP's default bucket_cap_mb=25: large enough to amortise a collective's latency, small enough
# that the first buckets start early in backward. A larger parameter gets a bucket of its own.
BUCKET_BYTES = 25 * 2**20

IDLE, LAUNCHED, REDUCED = "idle", "launched", "reduced"


class GradBucket:
    """Gradients of some parameters as views into one flat buffer, reduced by one collective.

    params: the parameters, packed in this order unless `offsets` (id(param) -> element offset)
    and `numel` (the buffer's length) give another layout; reduce: starts the collective on the
    flat buffer, returning a collectives.Pending.
    """

    def __init__(self, params, reduce, numel=None, offsets=None):
        self.params = list(params)
        if offsets is None:
            offsets, start = {}, 0
            for p in self.params:
                offsets[id(p)] = start
                start += p.numel()
            numel = start
        first = self.params[0]
        self.flat = torch.zeros(numel, dtype=first.dtype, device=first.device)
        self.views = {id(p): self.flat[offsets[id(p)]:offsets[id(p)] + p.numel()].view_as(p) for p in self.params}
        self._reduce = reduce
        self.pending = None
        self.state = IDLE
        self.arrived = set()

    def view(self, p: torch.Tensor) -> torch.Tensor:
        return self.views[id(p)]

    def take_grad(self, p: torch.Tensor) -> None:
        """Make p.grad the bucket's view, copying a gradient autograd made elsewhere (after
        zero_grad(set_to_none=True)); a parameter without a gradient gets zeros."""
        view = self.view(p)
        if p.grad is None:
            view.zero_()
        elif p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad)
        p.grad = view

    def attach(self) -> None:
        for p in self.params:
            p.grad = self.view(p)

    def launch(self) -> None:
        if self.state != IDLE:
            raise RuntimeError(f"gradient bucket launched twice in one step (state {self.state}): one backward "
                               "per GradSync.wait(), and step every optimizer after it")
        for p in self.params:
            if id(p) not in self.arrived:
                self.take_grad(p)
        self.pending = self._reduce(self.flat)
        self.state = LAUNCHED

    def wait(self) -> None:
        if self.state == LAUNCHED:
            self.pending.wait()
            self.pending = None
            self.state = REDUCED

    def reset(self) -> None:
        self.state = IDLE
        self.arrived = set()


class GradSync:
    """Overlapped gradient averaging for `model` (see the module docstring)."""

    def __init__(self, model, optimizers=(), bucket_bytes: int = BUCKET_BYTES):
        self.active = is_distributed()
        self.bucket_bytes = bucket_bytes
        self.params = [p for p in model.parameters() if p.requires_grad]  # tied parameters once
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self.sharded = [b for opt in optimizers for b in getattr(opt, "grad_buckets", ())]
        owned = {id(p) for b in self.sharded for p in b.params}
        self.replicated = [p for p in self.params if id(p) not in owned]
        self.buckets = []
        self._arrivals = []      # parameter indices in arrival order (first backward only)
        self._rebuilt = False
        if not self.active:
            return
        self._build(list(reversed(range(len(self.params)))))
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._on_grad)

    # -- layout --------------------------------------------------------------------------------
    def _build(self, arrival: list[int]) -> None:
        """All-reduce buckets of the replicated parameters in arrival order, and the launch order."""
        position = {i: n for n, i in enumerate(arrival)}
        old = {id(p): b for b in self.buckets if b not in self.sharded for p in b.params}
        groups, current, size = [], [], 0
        for p in sorted(self.replicated, key=lambda p: position[self._index[id(p)]]):
            nbytes = p.numel() * p.element_size()
            if current and (size + nbytes > self.bucket_bytes or (p.dtype, p.device) != (current[0].dtype, current[0].device)):
                groups.append(current)
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            groups.append(current)
        replicated = []
        for group in groups:
            bucket = GradBucket(group, all_reduce_mean)
            for p in group:  # keep the gradients of this step (rebuilt after a reduction)
                if id(p) in old:
                    bucket.view(p).copy_(old[id(p)].view(p))
            bucket.attach()
            replicated.append(bucket)
        self.replicated_buckets = replicated
        # a bucket completes when its last gradient arrives: start buckets in that order
        last = lambda b: max(position[self._index[id(p)]] for p in b.params)  # noqa: E731
        self.buckets = sorted(replicated + self.sharded, key=last)
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._next = 0

    # -- during backward -----------------------------------------------------------------------
    def _on_grad(self, p: torch.Tensor) -> None:
        bucket = self._bucket_of[id(p)]
        if bucket.state != IDLE:
            raise RuntimeError("a gradient arrived after its bucket was reduced: GradSync supports one "
                               "backward per step (call wait() and step the optimizers in between)")
        bucket.take_grad(p)
        bucket.arrived.add(id(p))
        if not self._rebuilt:
            self._arrivals.append(self._index[id(p)])
        if len(bucket.arrived) == len(bucket.params):
            self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next < len(self.buckets) and \
                len(self.buckets[self._next].arrived) == len(self.buckets[self._next].params):
            self.buckets[self._next].launch()
            self._next += 1

    # -- after backward ------------------------------------------------------------------------
    def wait(self) -> None:
        """Start the buckets not started yet (in order), then wait for the all-reduce buckets."""
        if not self.active:
            return
        for bucket in self.buckets[self._next:]:
            bucket.launch()
        self._next = len(self.buckets)
        for bucket in self.replicated_buckets:
            bucket.wait()
            bucket.reset()
        self._next = 0  # the sharded buckets are reset by their optimizer once it used them
        if not self._rebuilt:
            self._rebuild_from_arrivals()

    def _rebuild_from_arrivals(self) -> None:
        """Rebuild the layout once, in the arrival order rank 0 saw (the same on every rank)."""
        seen = list(dict.fromkeys(self._arrivals))
        seen += [i for i in reversed(range(len(self.params))) if i not in set(seen)]  # never arrived: last
        box = [seen]
        dist.broadcast_object_list(box, src=0)
        self._rebuilt = True
        self._arrivals = []
        self._build(box[0])

    def zero_grad(self) -> None:
        """Zero every gradient (one fill per bucket); the gradients stay views of the buckets."""
        if not self.active:
            for p in self.params:
                p.grad = None
            return
        for bucket in self.buckets:
            bucket.flat.zero_()
            bucket.attach()
