"""Tests for model/record_loss.py: the training loss against a plain per-position loop (MTP, prefix term,
the record's normaliser), sampled softmax against the full softmax and against the loop over the candidates,
the candidate rule against a plain statement of it, and the eval loss with the canonical mask."""
import math

import pytest
import torch

from model import record_loss as rl

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V, T, D = 64, 24, 16


def plain_softcap(logit):
    return 23 * torch.sigmoid((logit + 5) / 7.5)


def plain_training_loss(x, w, targets, mtp, prefix, wp, classes=None):
    """The stated loss, position by position (classes: the columns the softmax runs over, all if None)."""
    classes = list(range(w.shape[1])) if classes is None else list(classes)
    total = 0.0
    for i in range(len(targets)):
        z = plain_softcap(x[i] @ w[:, classes])
        lse = torch.logsumexp(z, 0)
        for k, wk in enumerate(mtp):
            if i + k < len(targets):
                total = total + wk * (lse - z[classes.index(int(targets[i + k]))])
        p = int(prefix[i])
        if p >= 0 and p in classes:
            total = total + wp * (lse - z[classes.index(p)])
    return total


def records_row_gradient(z, targets, mtp, prefix, wp):
    """The record's kernel's dL/dz, row by row: S_i softmax(z_i) minus each present target's weight, where
    S_i sums EVERY MTP weight (past the end too) and w_p where the prefix target exists."""
    g = torch.zeros_like(z)
    for i in range(z.shape[0]):
        p = int(prefix[i])
        s = sum(mtp) + (wp if p >= 0 else 0.0)
        g[i] = s * torch.softmax(z[i], 0)
        for k, wk in enumerate(mtp):
            if i + k < z.shape[0]:
                g[i, int(targets[i + k])] -= wk
        if p >= 0:
            g[i, p] -= wp
    return g


@pytest.fixture
def batch():
    torch.manual_seed(0)
    x = torch.randn(T, D)
    w = torch.randn(D, V) * 0.3
    targets = torch.randint(0, V, (T,))
    prefix = torch.randint(-1, V, (T,))
    prefix[::3] = -1  # a third without a prefix token
    return x, w, targets, prefix


def test_softcap():
    logits = torch.tensor([-1e4, -5.0, 0.0, 1e4])
    z = rl.softcap(logits)
    assert z[0] == 0 and z[1] == 11.5 and z[3] == 23
    assert z[2].item() == pytest.approx(23 / (1 + math.exp(-5 / 7.5)))


def test_training_loss_equals_the_per_position_loop_and_the_records_gradient(batch):
    x, w, targets, prefix = batch
    mtp, wp = (1.0, 0.5, 0.25), 0.25
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    loss = rl.training_loss(xs, ws, targets, mtp_weights=mtp, prefix_targets=prefix, prefix_weight=wp)
    torch.testing.assert_close(loss, plain_training_loss(x, w, targets, mtp, prefix, wp))
    loss.backward()
    # the gradient: the record's row gradient through the soft-cap and the matmul
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    z = plain_softcap(xr @ wr)
    z.backward(records_row_gradient(z.detach(), targets, mtp, prefix, wp))
    torch.testing.assert_close(xs.grad, xr.grad)
    torch.testing.assert_close(ws.grad, wr.grad)
    # ... which is the stated loss's gradient except on the last len(mtp) - 1 rows
    xp = x.clone().requires_grad_()
    plain_training_loss(xp, w, targets, mtp, prefix, wp).backward()
    torch.testing.assert_close(xs.grad[:T - 2], xp.grad[:T - 2])
    assert not torch.allclose(xs.grad[T - 2:], xp.grad[T - 2:])


def test_terms_switch_off(batch):
    x, w, targets, prefix = batch
    next_token = torch.nn.functional.cross_entropy(plain_softcap(x @ w), targets, reduction="sum")
    for kwargs in ({}, {"prefix_targets": prefix}, {"prefix_targets": torch.full((T,), -1), "prefix_weight": 0.3}):
        torch.testing.assert_close(rl.training_loss(x, w, targets, mtp_weights=(1.0,), **kwargs), next_token)
    zero_weight = rl.training_loss(x, w, targets, mtp_weights=(1.0, 0.0))  # a ramped-off MTP term adds nothing
    torch.testing.assert_close(zero_weight, next_token)


def full_candidates(vocab):
    return rl.Candidates(torch.arange(vocab), torch.cat([torch.arange(vocab), torch.tensor([-1])]))


def test_sampled_softmax_over_the_whole_vocabulary_is_the_full_softmax(batch):
    x, w, targets, prefix = batch
    grads = []
    for candidates in (None, full_candidates(V), rl.SampledSoftmax(V).candidates(V, targets)):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        loss = rl.training_loss(xs, ws, targets, mtp_weights=(1.0, 0.5), prefix_targets=prefix, prefix_weight=0.2,
                                candidates=candidates)
        loss.backward()
        grads.append((loss.detach(), xs.grad, ws.grad))
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            torch.testing.assert_close(a, b)


def test_sampled_softmax_over_a_subset_normalises_over_it_and_drops_outside_prefixes(batch):
    x, w, targets, prefix = batch
    candidates = rl.SampledSoftmax(V).candidates(40, targets)
    classes = candidates.classes.tolist()
    assert set(targets.tolist()) <= set(classes) and len(classes) == 40 and classes == sorted(classes)
    assert any(int(p) >= 0 and int(p) not in classes for p in prefix)  # some prefix targets fall outside C
    ws = w.clone().requires_grad_()
    loss = rl.training_loss(x, ws, targets, mtp_weights=(1.0, 0.5), prefix_targets=prefix, prefix_weight=0.2,
                            candidates=candidates)
    torch.testing.assert_close(loss, plain_training_loss(x, w, targets, (1.0, 0.5), prefix, 0.2, classes=classes))
    loss.backward()
    outside = torch.ones(V, dtype=torch.bool)
    outside[candidates.classes] = False
    assert (ws.grad[:, outside] == 0).all() and (ws.grad[:, ~outside] != 0).any()


def plain_candidates(vocab, rank, world, steps):
    """The rule, stated plainly: per step (count, targets) -> sorted C; the sweep k * 20011 mod V from
    k = V * rank // world, a window of int(1.7 * need) + 256 (at most V) per step, members skipped, else
    evenly strided free classes."""
    order = [(k * 20011) % vocab for k in range(vocab)]
    k0 = vocab * rank // world
    out = []
    for count, targets in steps:
        members = set(targets)
        need = count - len(members)
        if need > 0:
            draw = min(vocab, int(need * 1.7) + 256)
            window = [order[(k0 + j) % vocab] for j in range(draw)]
            k0 = (k0 + draw) % vocab
            fresh = [c for c in window if c not in members]
            if len(fresh) >= need:
                members |= set(fresh[:need])
            else:
                free = [c for c in range(vocab) if c not in members]
                members |= set(free[::max(1, len(free) // need)][:need])
        out.append(sorted(members))
    return out


@pytest.mark.parametrize("vocab, rank, world", [(50304, 3, 8), (50304, 0, 1), (997, 1, 2)])
def test_the_candidate_rule(vocab, rank, world):
    gen = torch.Generator().manual_seed(rank)
    steps = []
    for count, n_targets in ((vocab // 5, vocab // 20), (vocab // 5, vocab // 20), (vocab // 2, vocab // 3),
                             (vocab // 5, vocab // 6)):
        steps.append((count, torch.randint(0, vocab, (n_targets,), generator=gen).tolist()))
    steps.append((len(set(steps[-1][1])), steps[-1][1]))  # as many candidates as targets: nothing drawn
    sampler = rl.SampledSoftmax(vocab, rank, world)
    expected = plain_candidates(vocab, rank, world, steps)
    for (count, targets), want in zip(steps, expected):
        c = sampler.candidates(count, torch.tensor(targets))
        assert c.classes.tolist() == want
        assert (c.vocab_pos[c.classes] == torch.arange(count)).all() and (c.vocab_pos >= 0).sum() == count
    sampler.reset()  # the post-warm-up reset restarts the sweep: the same candidates again
    assert sampler.candidates(*[torch.tensor(v) if i else v for i, v in enumerate(steps[0])]).classes.tolist() \
        == expected[0]


def test_the_candidate_rule_falls_back_to_strided_free_classes():
    """When the window holds too few non-members, the rest are evenly strided free classes."""
    vocab, need = 997, 20
    draw = int(need * 1.7) + 256
    window = [(k * 20011) % vocab for k in range(draw)]
    targets = torch.tensor(window)  # every class of this step's window is a target: it yields no negative
    got = rl.SampledSoftmax(vocab).candidates(draw + need, targets).classes.tolist()
    want = plain_candidates(vocab, 0, 1, [(draw + need, window)])[0]
    free = sorted(set(range(vocab)) - set(window))
    assert got == want and sorted(set(got) - set(window)) == free[::len(free) // need][:need]
    with pytest.raises(ValueError, match=f"candidates for {draw} distinct targets"):
        rl.SampledSoftmax(vocab).candidates(draw - 1, targets)


def test_candidate_counts_by_stage():
    assert [rl.candidate_count(0, s, 0, 160) for s in (0, 159)] == [10240, 10240]
    assert [rl.candidate_count(2, s, 340, 526) for s in (340, 401, 402, 463, 464, 525)] == \
        [14336, 14336, 14336, 14336, 24576, 24576]
    assert rl.candidate_count(3, 530, 526, 560) == 0 and rl.candidate_count(4, 565, 560, 570) == 0


def plain_eval_loss(x, w, targets, prev, mask_bits):
    total = 0.0
    for i in range(len(targets)):
        z = plain_softcap(x[i] @ w)
        if mask_bits is not None:
            z = torch.where(mask_bits[int(prev[i])], torch.tensor(-60.0), z)
        total = total + torch.logsumexp(z, 0) - z[int(targets[i])]
    return total


def pack(bits):
    """(V, V) bool -> the packed (V, V / 8) uint8 layout: bit x & 7 of byte x >> 3."""
    return (bits.view(V, V // 8, 8).to(torch.uint8) << torch.arange(8, dtype=torch.uint8)).sum(-1).to(torch.uint8)


def test_eval_loss_with_and_without_the_canonical_mask(batch):
    x, w, targets, _ = batch
    prev = torch.randint(0, V, (T,))
    bits = torch.rand(V, V) < 0.3
    bits[prev, targets] = False  # the tokenizer emitted these pairs, so the mask never holds them
    plain = plain_eval_loss(x, w, targets, prev, None)
    masked = plain_eval_loss(x, w, targets, prev, bits)
    total, n = rl.eval_loss(x, w, targets, prev)
    assert n == T
    torch.testing.assert_close(total, plain)
    total, n = rl.eval_loss(x, w, targets, prev, pack(bits))
    torch.testing.assert_close(total, masked)
    assert masked < plain  # masking classes the tokenizer never emits can only lower the loss
    total_slabs, _ = rl.eval_loss(x, w, targets, prev, pack(bits), slab_rows=5)  # slabs give the same sum
    torch.testing.assert_close(total_slabs, masked)
    scored = targets.clone()
    scored[:4] = -1
    total, n = rl.eval_loss(x, w, scored, prev, pack(bits))
    assert n == T - 4
    torch.testing.assert_close(total, plain_eval_loss(x[4:], w, targets[4:], prev[4:], bits))
    bits[prev[0], targets[0]] = True  # a target the mask holds costs logsumexp + 60 (the record's -60)
    total, _ = rl.eval_loss(x, w, targets, prev, pack(bits))
    torch.testing.assert_close(total, plain_eval_loss(x, w, targets, prev, bits))
    with pytest.raises(ValueError, match="canonical mask: expected shape"):
        rl.eval_loss(x, w, targets, prev, pack(bits)[:, :4])


def test_the_fp8_training_loss_is_within_fp8_error_of_float32(batch):
    x, w, targets, prefix = batch
    w = w * 0.05  # lm_head magnitudes near the record's (std 0.005), inside e4m3's range at its 2/448 scale
    args = dict(mtp_weights=(1.0, 0.5), prefix_targets=prefix, prefix_weight=0.2)
    exact = rl.training_loss(x, w, targets, **args)
    xs = x.clone().requires_grad_()
    loss = rl.training_loss(xs, w, targets, fp8=True, **args)
    loss.backward()
    assert abs(loss.item() - exact.item()) < 0.02 * exact.item()  # e4m3 logits: a few percent on each logit
    assert torch.isfinite(xs.grad).all() and xs.grad.abs().sum() > 0
