"""The hint path of model/: exact no-op when absent, gradients, causality, and that it is usable."""
import math

import pytest
import torch

from hints import n_kinds
from model import GPT, GPTConfig, build_optimizers

VOCAB, T, B, K = 512, 32, 4, 3
N_KINDS = n_kinds(K)
ARCHS = ("speedrun", "gpt2")
USED_KINDS = torch.tensor([3, 17, 42, 99])  # kind 0 unused: absent hints must not reach it either


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_model(arch, seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=VOCAB, n_layer=4, n_head=2, n_embd=64, arch=arch, max_seq_len=T,
                         n_hint_lengths=K, n_hint_kinds=N_KINDS))


def random_hints(batch=B, present=0.5, generator=None):
    """Hints at about `present` of the (position, length) slots, kinds drawn from USED_KINDS."""
    tokens = torch.randint(0, VOCAB, (batch, T, K), generator=generator)
    kinds = USED_KINDS[torch.randint(0, len(USED_KINDS), (batch, T, K), generator=generator)]
    absent = torch.rand((batch, T, K), generator=generator) >= present
    return tokens.masked_fill(absent, -1), kinds.masked_fill(absent, -1)


def train(model, arch, steps, hinted=True, lr_scale=1.0, batch=B):
    """Train on random tokens whose target is hinted (kind 5, longest length); return final batch loss."""
    optimizers = build_optimizers(model, arch=arch, lr_scale=lr_scale)
    for _ in range(steps):
        idx, targets, ht, hk = copy_task_batch(batch)
        loss = model(idx, targets, ht, hk) if hinted else model(idx, targets)
        loss.backward()
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
    return loss.item()


def copy_task_batch(batch):
    idx = torch.randint(0, VOCAB, (batch, T))
    targets = torch.randint(0, VOCAB, (batch, T))
    ht = torch.full((batch, T, K), -1)
    hk = torch.full((batch, T, K), -1)
    ht[..., K - 1] = targets
    hk[..., K - 1] = 5
    return idx, targets, ht, hk


@pytest.mark.parametrize("arch", ARCHS)
def test_absent_hints_are_bitwise_no_hints(arch):
    model = tiny_model(arch)
    train(model, arch, steps=2)  # make every weight nonzero (the speedrun LM head starts at zero)
    idx = torch.randint(0, VOCAB, (B, T))
    absent = torch.full((B, T, K), -1)
    # kinds present but tokens absent (and vice versa) also count as absent
    kinds_only = USED_KINDS[torch.randint(0, len(USED_KINDS), (B, T, K))]
    with torch.no_grad():
        plain = model(idx)
        assert torch.equal(plain, model(idx, hint_tokens=absent, hint_kinds=absent))
        assert torch.equal(plain, model(idx, hint_tokens=absent, hint_kinds=kinds_only))
        assert torch.equal(model(idx, idx), model(idx, idx, absent, absent))


@pytest.mark.parametrize("arch", ARCHS)
def test_hint_parameter_gradients(arch):
    model = tiny_model(arch)
    # One step first: the speedrun LM head is zero-initialised, so at step 0 no gradient reaches
    # anything upstream of it (hint parameters included); after one step it does.
    train(model, arch, steps=1)
    idx, targets = torch.randint(0, VOCAB, (B, T)), torch.randint(0, VOCAB, (B, T))
    model(idx, targets, *random_hints()).backward()
    hints = model.hints
    used = torch.zeros(N_KINDS, dtype=torch.bool)
    used[USED_KINDS] = True
    for grad in (hints.trust_amount.grad, hints.trust_embedding.grad, hints.scales.grad):
        assert torch.isfinite(grad).all()
    assert (hints.trust_amount.grad[used] != 0).all()
    assert (hints.trust_embedding.grad[used] != 0).any(dim=1).all()
    assert (hints.scales.grad != 0).all()
    assert (hints.trust_amount.grad[~used] == 0).all()
    assert (hints.trust_embedding.grad[~used] == 0).all()


def test_gpt2_hint_gradients_at_step_zero():
    model = tiny_model("gpt2")
    idx, targets = torch.randint(0, VOCAB, (B, T)), torch.randint(0, VOCAB, (B, T))
    model(idx, targets, *random_hints()).backward()
    assert (model.hints.scales.grad != 0).all()
    assert (model.hints.trust_amount.grad[USED_KINDS] != 0).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_hints_matter_and_are_causal(arch):
    model = tiny_model(arch)
    train(model, arch, steps=3)
    idx = torch.randint(0, VOCAB, (B, T))
    ht, hk = random_hints(present=0.7)
    t = T // 2
    ht2, hk2 = ht.clone(), hk.clone()
    ht2[:, t] = torch.randint(0, VOCAB, (B, K))
    hk2[:, t] = USED_KINDS[0]
    with torch.no_grad():
        plain = model(idx)
        hinted = model(idx, hint_tokens=ht, hint_kinds=hk)
        perturbed = model(idx, hint_tokens=ht2, hint_kinds=hk2)
    assert not torch.allclose(plain, hinted)
    assert torch.equal(hinted[:, :t], perturbed[:, :t])
    assert not torch.allclose(hinted[:, t], perturbed[:, t])


def test_rejects_mismatched_hints():
    model = tiny_model("speedrun")
    idx = torch.randint(0, VOCAB, (B, T))
    with pytest.raises(ValueError):
        model(idx, hint_tokens=torch.full((B, T, K), -1))
    with pytest.raises(ValueError):
        model(idx, hint_tokens=torch.full((B, T, K + 1), -1), hint_kinds=torch.full((B, T, K + 1), -1))


@pytest.mark.parametrize("arch, lr_scale", [("speedrun", 1.0), ("gpt2", 10.0)])
def test_always_right_hint_is_learned(arch, lr_scale):
    # Targets are random, so without hints nothing beats log(VOCAB); the hint is always the target.
    # gpt2 gets lr x10: llm.c's 6e-4 is tuned for ~19k steps, this test has 80.
    steps, chance = 80, math.log(VOCAB)
    hinted = tiny_model(arch)
    train(hinted, arch, steps, hinted=True, lr_scale=lr_scale, batch=8)
    unhinted = tiny_model(arch)
    train(unhinted, arch, steps, hinted=False, lr_scale=lr_scale, batch=8)
    torch.manual_seed(1234)
    idx, targets, ht, hk = copy_task_batch(16)
    with torch.no_grad():
        assert hinted(idx, targets, ht, hk).item() < 1.0
        assert unhinted(idx, targets).item() > chance - 0.5
