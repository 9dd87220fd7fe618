"""The record arch's output head: the soft-cap, the training loss (multi-token prediction, the prefix-token
term, sampled softmax) and the eval loss with the canonical mask. The record's model/gpt.py `_loss`,
perf/kernels/cross_entropy.py, perf/kernels/sampled_cross_entropy.py and sampled_softmax.py.

Soft-cap: z = 23 * sigmoid((logit + 5) / 7.5), so every z is in (0, 23).

Training loss, summed over the rank's T packed tokens (the record's kernel writes the gradient of the sum):

    L = sum_i [ sum_k w_k CE(z_i, y_(i+k)) + w_p CE(z_i, prefix(y_i)) ]

y is the packed target stream (the MTP targets cross document boundaries, as the record's; terms with
i + k >= T are skipped); the prefix term is skipped where prefix(y_i) is -1 (data/prefix_tokens.py builds the
table; it is all -1 before the table exists, the record's warm-up). The normaliser quirk, reproduced: the
record's kernel gives row i the gradient S_i softmax(z_i) - sum_k w_k e(y_(i+k)) - w_p e(prefix), with
S_i = every MTP weight plus w_p, including the k whose target is past the end. So on the last len(w) - 1 rows
its gradient is not the stated loss's: they get an extra (skipped weights) * softmax(z_i), the gradient of
(skipped weights) * logsumexp(z_i) whose value is not added. We reproduce it (a detached logsumexp term, zero
in value) because the record's code defines the run we port; it touches 2 rows of 16,384 per rank there.

Sampled softmax: with `candidates`, CE normalises over the candidate classes C only (logits x @ lm_head[:, C]);
the targets are in C by construction; a prefix target outside C is dropped; lm_head's gradient is zero
outside C. SampledSoftmax builds C per rank and step by the record's rule (see its docstring); the
schedule picks P per step (CANDIDATES_BY_STAGE, candidate_count).

Eval loss: plain next-token CE over the full padded vocabulary, the soft-cap computed in the hidden state's
dtype (bf16 on the GPU, as the record's), then float32; with the canonical mask, z <- -60 wherever bit
(input token, class) is set (data/canonical_mask.py; -60 is far below the soft-cap's 0..23, so a masked class
adds nothing to the softmax). Computed in slabs of rows, as the record's, to bound the logit block.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from model import fp8 as fp8_sites

SOFTCAP_A, SOFTCAP_B, SOFTCAP_C = 23.0, 5.0, 7.5  # the record's perf/kernels/cross_entropy.py
CANON_MASKED_Z = -60.0      # the record's eval: a masked class's soft-capped logit
EVAL_SLAB_ROWS = 32768      # the record's EVAL_CE_SLAB_ROWS: rows of one eval logit block
NO_TARGET = -1              # a prefix target that does not exist (or is outside the candidates)
# Sampled softmax (the record's sampled_softmax.py). P per stage index; a stage with several counts
# splits its steps into equal parts; stages not listed run the full softmax.
CANDIDATES_BY_STAGE = {0: (10240,), 1: (10240,), 2: (14336, 14336, 24576)}
NEGATIVE_STRIDE = 20011     # coprime with the vocabulary: k * 20011 mod V is a permutation of the classes
NEGATIVE_DRAW = (1.7, 256)  # a step draws int(1.7 * needed) + 256 classes of that permutation


def softcap(logits):
    return SOFTCAP_A * torch.sigmoid((logits + SOFTCAP_B) / SOFTCAP_C)


def candidate_count(stage, step, stage_start, stage_end):
    """P for `step` of stage index `stage` (steps [stage_start, stage_end)); 0 = the full softmax."""
    counts = CANDIDATES_BY_STAGE.get(stage)
    if counts is None:
        return 0
    return counts[(step - stage_start) * len(counts) // (stage_end - stage_start)]


@dataclass
class Candidates:
    """One step's candidate set C on one rank."""
    classes: torch.Tensor    # (P,) int64, ascending: the classes the softmax runs over
    vocab_pos: torch.Tensor  # (V + 1,) int64: class -> its position in C, -1 if not in C (entry V stays -1,
    #                          so a prefix target of -1 maps to -1)

    def to(self, device):
        return Candidates(self.classes.to(device), self.vocab_pos.to(device))


class SampledSoftmax:
    """The record's candidate rule, per rank: C = the step's distinct targets + negatives from the
    permutation k * 20011 mod V, taken in order: rank r starts at k = V * r // world_size, and each step
    takes the next window of int(1.7 * (P - #targets)) + 256 of it (at most V), skipping classes already in C;
    if the window holds too few, evenly strided free classes fill the rest (free[::free // need][:need]).
    A full-softmax step draws nothing. reset() restarts the sweep (the post-warm-up reset)."""

    def __init__(self, vocab_size, rank=0, world_size=1):
        if math.gcd(NEGATIVE_STRIDE, vocab_size) != 1:
            raise ValueError(f"sampled softmax: vocab_size {vocab_size} shares a factor with the stride "
                             f"{NEGATIVE_STRIDE}")
        self.vocab_size, self.rank, self.world_size = vocab_size, rank, world_size
        sweep = (NEGATIVE_STRIDE * torch.arange(vocab_size, dtype=torch.int64)) % vocab_size
        self.sweep = torch.cat([sweep, sweep])  # any window of it is one slice
        self.reset()

    def reset(self):
        self.offset = self.vocab_size * self.rank // self.world_size

    def candidates(self, count, targets):
        """Candidates of `count` classes for this step's targets (T,) (any device; built on the CPU)."""
        V = self.vocab_size
        targets = targets.detach().reshape(-1).cpu().long()
        if targets.numel() and not 0 <= int(targets.min()) <= int(targets.max()) < V:
            raise ValueError(f"sampled softmax: targets must lie in [0, {V})")
        mark = torch.zeros(V, dtype=torch.bool)
        mark[targets] = True
        n_targets = int(mark.sum())
        if not n_targets <= count <= V:
            raise ValueError(f"sampled softmax: {count} candidates for {n_targets} distinct targets in a "
                             f"vocabulary of {V}")
        if count > n_targets:
            mark[self._negatives(count - n_targets, mark)] = True
        classes = torch.nonzero(mark).flatten()
        vocab_pos = torch.full((V + 1,), NO_TARGET, dtype=torch.int64)
        vocab_pos[classes] = torch.arange(count)
        return Candidates(classes, vocab_pos)

    def _negatives(self, need, mark):
        draw = min(self.vocab_size, int(need * NEGATIVE_DRAW[0]) + NEGATIVE_DRAW[1])
        window = self.sweep[self.offset:self.offset + draw]
        self.offset = (self.offset + draw) % self.vocab_size
        window = window[~mark[window]]
        if window.numel() >= need:
            return window[:need]
        free = torch.nonzero(~mark).flatten()
        return free[::max(1, free.numel() // need)][:need]


def _logits(x, lm_head, classes, fp8):
    """(T, classes) logits, float32: lm_head's columns `classes` (all if None); fp8 = the record's training GEMM."""
    w = lm_head if classes is None else lm_head[:, classes]
    if fp8:
        return fp8_sites.lm_head_logits(x, w.t())
    return (x @ w.type_as(x)).float()


def training_loss(x_normed, lm_head, targets, *, mtp_weights, prefix_targets=None, prefix_weight=0.0,
                  candidates=None, fp8=False):
    """The record's training loss, summed over the T tokens (see the module docstring).

    x_normed (T, d) the final normed hidden state; lm_head (d, V) [in, out]; targets (T,) int64 classes;
    mtp_weights: w_0, w_1, ... (k = 0 is the next token); prefix_targets (T,) int64: prefix(targets), -1 none
    (None: no prefix term); candidates: a Candidates or None (full softmax); fp8: the LM head's fp8 GEMM
    (model/fp8.py lm_head_logits, training only). mtp_weights and prefix_weight may be tensors (the GPU path:
    a per-step value that is not a Python constant compiles once). Backward the returned sum as it is: the
    fp8 gradient's scales (and the record's optimizers) expect the gradient of the sum, not of a mean."""
    T = targets.numel()
    targets = targets.reshape(-1)
    classes = None if candidates is None else candidates.classes
    z = softcap(_logits(x_normed.reshape(T, -1), lm_head, classes, fp8))
    lse = torch.logsumexp(z, dim=1)
    if candidates is not None:
        targets = candidates.vocab_pos[targets]
        prefix_targets = None if prefix_targets is None else candidates.vocab_pos[prefix_targets.reshape(-1)]
    weights = torch.as_tensor(mtp_weights, dtype=torch.float32, device=z.device).reshape(-1)
    K = weights.numel()
    rows = torch.arange(T, device=z.device)
    ahead = rows[:, None] + torch.arange(K, device=z.device)[None, :]            # (T, K): i + k
    inside = ahead < T
    picked = z.gather(1, targets[ahead.clamp(max=T - 1)])                         # z_i[y_(i+k)]
    w = weights[None, :] * inside
    loss = (w * (lse[:, None] - picked)).sum()
    # the record's normaliser: S_i counts the weights of targets past the end too (value 0, gradient theirs)
    skipped = (weights[None, :] * ~inside).sum(dim=1)
    loss = loss + (skipped * (lse - lse.detach())).sum()
    if prefix_targets is not None:  # no branch on the weight's value: it may be a tensor (no recompiles)
        prefix_targets = prefix_targets.reshape(-1)
        has = prefix_targets >= 0
        z_prefix = z.gather(1, prefix_targets.clamp(min=0)[:, None])[:, 0]
        loss = loss + prefix_weight * ((lse - z_prefix) * has).sum()
    return loss


def unpack_mask_rows(canon_mask, rows, width):
    """(len(rows), width) bool: bits of the packed mask's rows (bit x & 7 of byte x >> 3)."""
    shifts = torch.arange(8, dtype=torch.uint8, device=canon_mask.device)
    return ((canon_mask[rows][:, :, None] >> shifts) & 1).reshape(len(rows), -1)[:, :width].bool()


def eval_loss(x_normed, lm_head, targets, prev_tokens, canon_mask=None, slab_rows=EVAL_SLAB_ROWS):
    """(summed next-token CE as a float32 0-d tensor, number of scored tokens). prev_tokens (T,) are the input
    tokens (row p of the mask); canon_mask uint8 (V, V / 8) or None; targets of -1 are not scored."""
    x = x_normed.reshape(-1, x_normed.shape[-1])
    targets, prev_tokens = targets.reshape(-1), prev_tokens.reshape(-1)
    V = lm_head.shape[1]
    if canon_mask is not None and canon_mask.shape != (V, V // 8):
        raise ValueError(f"canonical mask: expected shape ({V}, {V // 8}), got {tuple(canon_mask.shape)}")
    total = torch.zeros((), dtype=torch.float32, device=x.device)
    for lo in range(0, x.shape[0], slab_rows):
        hi = min(lo + slab_rows, x.shape[0])
        z = softcap(x[lo:hi] @ lm_head.type_as(x)).float()  # the soft-cap in the hidden state's dtype, then fp32
        if canon_mask is not None:
            z = z.masked_fill(unpack_mask_rows(canon_mask, prev_tokens[lo:hi], V), CANON_MASKED_Z)
        total = total + F.cross_entropy(z, targets[lo:hi], ignore_index=NO_TARGET, reduction="sum")
    return total, int((targets >= 0).sum())
