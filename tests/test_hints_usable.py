"""Hints are usable at GPT-2's full vocabulary, in both representations.

A tiny speedrun model trains on rows of two random-token documents: a fresh one, never seen (no
n-gram of it is in the index: no hints), then one from a pool that the hint index holds (every
position from its 6th token on hinted by a real HintIndex lookup, count 1, purity 1: the right
next token). After training, on fresh rows, its loss on the hinted positions must be far below its
loss on the unhinted ones. Random tokens carry nothing else to learn, so the gap is what the hints
give. docs/design.md ("Which table the hints read") says why the vocabulary is GPT-2's own: at a
few hundred tokens a hint read from a table the LM head does not see is still decodable, and the
test would pass on that defect.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hints import Geometry, HintIndex, n_cells, n_kinds
from hints.cells import BOS
from hints.index import DEFAULT_LENGTHS
from model import GPT, GPTConfig, build_optimizers
from train.evaluate import val_hint_arrays

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 50257          # GPT-2's; padded to 50,304 in the model
DOC = 31               # tokens of a document after its BOS: a row is 2 x (1 + DOC) = 64 tokens
T = 2 * (1 + DOC)
POOL = 64              # documents the index holds
BATCH, STEPS, LR_SCALE = 4, 150, 1.0
K = len(DEFAULT_LENGTHS)
# unhinted positions: random tokens, about ln(vocab) = 10.8 nats (less only for the BOS after each
# fresh document); hinted ones must be this many nats lower. Measured (150 steps): hinted about 2,
# unhinted about 10, in either representation; main's record path (an untied input table): no gap.
UNHINTED_FLOOR = 0.75 * math.log(VOCAB)
MARGIN = 4.0


def random_docs(rng, n):
    return rng.integers(0, BOS, size=(n, DOC), dtype=np.uint16)  # no BOS inside a document


def with_bos(doc):
    return np.concatenate([[BOS], doc]).astype(np.uint16)


def pool_index(pool):
    index = HintIndex(Geometry.preset("tiny"))
    index.add(np.concatenate([with_bos(d) for d in pool]))
    return index


def batch(rng, pool, index, record):
    """(idx, targets, hint inputs, hinted mask) of BATCH rows [BOS fresh, BOS pool doc]; the hints
    are the index's lookups as validation makes them (train.evaluate.val_hint_arrays)."""
    fresh, chosen = random_docs(rng, BATCH), pool[rng.integers(0, len(pool), BATCH)]
    rows = np.stack([np.concatenate([with_bos(a), with_bos(b), [BOS]]) for a, b in zip(fresh, chosen)])
    arrays = [val_hint_arrays(index, row, 0, T, record=record) for row in rows]
    hints = [torch.from_numpy(np.stack(a)) for a in zip(*arrays)]
    rows = torch.from_numpy(rows.astype(np.int64))
    if record:
        followers, cells, weights = hints
        hinted, hints = cells >= 0, (followers, cells, weights)
    else:
        tokens, kinds = hints
        hinted, hints = (tokens >= 0).any(-1), (tokens, kinds, None)
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous(), hints, hinted


def train_and_measure(record, steps=STEPS, seed=0):
    """Mean loss (hinted positions, unhinted positions) on fresh rows after `steps` steps."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    pool = random_docs(rng, POOL)
    index = pool_index(pool)
    model = GPT(GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=64, max_seq_len=T,
                          hint_repr="record" if record else "lengths",
                          n_hint_kinds=n_cells(K) if record else n_kinds(K), n_hint_lengths=K))
    optimizers = build_optimizers(model, arch="speedrun", lr_scale=LR_SCALE)
    for _ in range(steps):
        idx, targets, (ht, hk, hw), _ = batch(rng, pool, index, record)
        model(idx, targets, ht, hk, hw).backward()
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
    with torch.no_grad():
        idx, targets, (ht, hk, hw), hinted = batch(np.random.default_rng(seed + 1000), pool, index, record)
        losses = F.cross_entropy(model(idx, None, ht, hk, hw).flatten(0, 1), targets.flatten(), reduction="none")
    hinted = hinted.flatten()
    return losses[hinted].mean().item(), losses[~hinted].mean().item()


@pytest.mark.parametrize("arch", ["speedrun", "gpt2"])
@pytest.mark.parametrize("repr_", ["lengths", "record"])
def test_hints_read_the_table_the_lm_head_reads(arch, repr_):
    """The hint module gets the LM head's weight (gpt2: wte, tied), never the untied input table."""
    record = repr_ == "record"
    model = GPT(GPTConfig(vocab_size=512, n_layer=2, n_head=2, n_embd=16, arch=arch, max_seq_len=8,
                          hint_repr=repr_, n_hint_kinds=n_cells(K) if record else n_kinds(K), n_hint_lengths=K))
    seen = []
    model.hints.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    idx = torch.zeros(1, 8, dtype=torch.long)
    if record:
        model(idx, None, torch.zeros(1, 8, 2, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long), torch.ones(1, 8, 2))
    else:
        model(idx, None, torch.zeros(1, 8, K, dtype=torch.long), torch.zeros(1, 8, K, dtype=torch.long))
    assert len(seen) == 1 and seen[0] is model.lm_head.weight


@pytest.mark.parametrize("repr_", ["lengths", "record"])
def test_hints_are_usable_at_gpt2_vocabulary(repr_):
    hinted, unhinted = train_and_measure(record=repr_ == "record")
    # the unhinted positions: random tokens, nothing to learn but the BOS after each fresh document
    assert unhinted > UNHINTED_FLOOR, f"{repr_}: unhinted loss {unhinted:.2f}: the task leaks the next token"
    assert hinted < unhinted - MARGIN, f"{repr_}: hinted {hinted:.2f} vs unhinted {unhinted:.2f}: hints unused"
