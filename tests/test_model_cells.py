"""The record's hint representation (model/hint_cells.py) in both archs: an exact no-op without a
match, gradients to the cell parameters and none into the token tables through the followers, the injection
points (the input hint inside x0, the middle at 7/11 depth), causality and the optimizer groups."""
import pytest
import torch

from model import GPT, GPTConfig, build_optimizers
from model.hint_cells import CELL_SCALE_INIT, SITE_SCALE_INIT, record_middle_layer
from model.optim import HINT_BETAS, HINT_CELL_LR, HINT_SCALE_LR

VOCAB, T, B, F = 512, 32, 4, 2
N_CELLS = 126
ARCHS = ("speedrun", "gpt2")
USED_CELLS = torch.tensor([3, 17, 42, 99])

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_model(arch, seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=VOCAB, n_layer=4, n_head=2, n_embd=64, arch=arch, max_seq_len=T,
                         n_hint_lengths=3, n_hint_kinds=N_CELLS, hint_repr="record", **kw))


def random_cells(batch=B, present=0.6, generator=None):
    """(followers, weights, cells): a match at about `present` of the positions, 1-2 followers."""
    followers = torch.randint(0, VOCAB, (batch, T, F), generator=generator)
    weights = torch.randint(1, 9, (batch, T, F), generator=generator).float()
    cells = USED_CELLS[torch.randint(0, len(USED_CELLS), (batch, T), generator=generator)]
    none = torch.rand((batch, T), generator=generator) >= present
    one = torch.rand((batch, T), generator=generator) < 0.5  # only one distinct follower here
    followers[..., 1] = followers[..., 1].masked_fill(one | none, -1)
    weights[..., 1] = weights[..., 1].masked_fill(one | none, 0)
    followers[..., 0] = followers[..., 0].masked_fill(none, -1)
    weights[..., 0] = weights[..., 0].masked_fill(none, 0)
    return followers, weights, cells.masked_fill(none, -1)


def train(model, arch, steps):
    """A few steps where the target is the single follower (so every weight becomes nonzero)."""
    optimizers = build_optimizers(model, arch=arch)
    for _ in range(steps):
        idx, targets = torch.randint(0, VOCAB, (B, T)), torch.randint(0, VOCAB, (B, T))
        followers = torch.full((B, T, F), -1)
        followers[..., 0] = targets
        weights = (followers >= 0).float() * 3
        cells = torch.full((B, T), 5)
        model(idx, targets, followers, cells, weights).backward()
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("arch", ARCHS)
def test_no_match_is_bitwise_no_hints(arch):
    model = tiny_model(arch)
    train(model, arch, steps=2)  # every parameter nonzero (the speedrun LM head starts at zero)
    idx = torch.randint(0, VOCAB, (B, T))
    none_f, none_w, none_c = torch.full((B, T, F), -1), torch.zeros(B, T, F), torch.full((B, T), -1)
    followers, weights, _ = random_cells(present=1.0)  # followers present, but no cell: still nothing
    with torch.no_grad():
        plain = model(idx)
        assert torch.equal(plain, model(idx, None, none_f, none_c, none_w))
        assert torch.equal(plain, model(idx, None, followers, none_c, weights))
        assert torch.equal(model(idx, idx), model(idx, idx, none_f, none_c, none_w))
        assert not torch.equal(plain, model(idx, None, *_reorder(random_cells())))


def _reorder(cells):
    followers, weights, c = cells
    return followers, c, weights  # forward's order: hint_tokens, hint_kinds, hint_weights


@pytest.mark.parametrize("arch", ARCHS)
def test_gradients_reach_cells_not_the_tables_through_followers(arch):
    model = tiny_model(arch)
    train(model, arch, steps=1)
    idx, targets = torch.randint(0, VOCAB, (B, T)), torch.randint(0, VOCAB, (B, T))
    followers, weights, cells = random_cells()
    model(idx, targets, followers, cells, weights).backward()
    h = model.hints
    used = torch.zeros(N_CELLS, dtype=torch.bool)
    used[USED_CELLS] = True
    assert (h.cell_scale.grad[used] != 0).all() and (h.cell_scale.grad[~used] == 0).all()
    assert (h.cell_embedding.grad[used] != 0).any(dim=1).all() and (h.cell_embedding.grad[~used] == 0).all()
    assert (h.scales.grad != 0).all()
    # the followers' rows are read detached from the table the LM head reads: no path back into it
    hint = h(model.lm_head.weight, idx, followers, weights, cells)
    assert torch.autograd.grad(hint.sum(), model.lm_head.weight, allow_unused=True)[0] is None
    if arch == "speedrun":  # untied: wte rows that are only followers (never inputs) get no gradient at all
        only_followers = torch.zeros(model.wte.weight.shape[0], dtype=torch.bool)
        only_followers[followers[followers >= 0]] = True
        only_followers[idx.flatten()] = False
        assert only_followers.any() and (model.wte.weight.grad[only_followers] == 0).all()


def test_weights_are_a_count_weighted_mean():
    model = tiny_model("speedrun", head_init_std=0.005)  # the record's head init: rows to average
    h = model.hints
    table = model.lm_head.weight
    idx = torch.zeros(1, 1, dtype=torch.long)
    f = torch.tensor([[[7, 9]]])
    c = torch.tensor([[3]])
    got = h(table, idx, f, torch.tensor([[[3.0, 1.0]]]), c)
    want = CELL_SCALE_INIT * (0.75 * table[7] + 0.25 * table[9])
    torch.testing.assert_close(got[0, 0], want.detach())
    # scaling the counts leaves the mean unchanged; a padded follower (-1, 0) adds nothing
    torch.testing.assert_close(h(table, idx, f, torch.tensor([[[6.0, 2.0]]]), c), got)
    one = h(table, idx, torch.tensor([[[7, -1]]]), torch.tensor([[[5.0, 0.0]]]), c)
    torch.testing.assert_close(one[0, 0], CELL_SCALE_INIT * table[7].detach())


def test_inits_and_optimizer_groups():
    for arch in ARCHS:
        model = tiny_model(arch)
        assert torch.equal(model.hints.scales.detach(), torch.tensor(SITE_SCALE_INIT))
        assert (model.hints.cell_scale == CELL_SCALE_INIT).all() and (model.hints.cell_embedding == 0).all()
        (opt, *_) = build_optimizers(model, arch=arch)
        groups = {id(p): g for g in opt.param_groups for p in g["params"]}
        for p, lr in ((model.hints.cell_embedding, HINT_CELL_LR), (model.hints.cell_scale, HINT_SCALE_LR),
                      (model.hints.scales, HINT_SCALE_LR)):
            g = groups[id(p)]
            assert g["lr"] == lr and tuple(g["betas"]) == HINT_BETAS and g["weight_decay"] == 0.0
        covered = [id(p) for o in build_optimizers(model, arch=arch) for g in o.param_groups for p in g["params"]]
        assert sorted(covered) == sorted({id(p) for p in model.parameters()})  # every parameter exactly once


def test_middle_layer_rule():
    assert record_middle_layer(11) == 6  # the record: before layer 7 of 11
    assert record_middle_layer(12) == 7
    assert record_middle_layer(4) == 2
    assert record_middle_layer(2) == 0


def test_input_hint_is_inside_x0():
    """With embedding skips every block re-adds x0: the record's input hint rides along with it."""
    model = tiny_model("speedrun", embed_skips=True)
    train(model, "speedrun", steps=2)
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda m, args: seen.append(args[1].clone()))
    idx = torch.randint(0, VOCAB, (B, T))
    followers, weights, cells = random_cells(present=1.0)
    with torch.no_grad():
        model(idx)
        model(idx, None, followers, cells, weights)
        with torch.no_grad():
            model.hints.scales[0] = 0.0  # no input hint: x0 is the plain embedding again
        model(idx, None, followers, cells, weights)
    assert not torch.equal(seen[0], seen[1])
    assert torch.equal(seen[0], seen[2])


@pytest.mark.parametrize("arch", ARCHS)
def test_hints_are_causal(arch):
    model = tiny_model(arch)
    train(model, arch, steps=3)
    idx = torch.randint(0, VOCAB, (B, T))
    followers, weights, cells = random_cells(present=0.8)
    t = T // 2
    f2, c2 = followers.clone(), cells.clone()
    f2[:, t, 0] = torch.randint(0, VOCAB, (B,))
    c2[:, t] = USED_CELLS[0]
    with torch.no_grad():
        hinted = model(idx, None, followers, cells, weights.clamp_min(1))
        perturbed = model(idx, None, f2, c2, weights.clamp_min(1))
    assert torch.equal(hinted[:, :t], perturbed[:, :t])
    assert not torch.allclose(hinted[:, t], perturbed[:, t])


def test_rejects_mismatched_hints():
    model = tiny_model("speedrun")
    idx = torch.randint(0, VOCAB, (B, T))
    followers, weights, cells = random_cells()
    with pytest.raises(ValueError, match="record hints"):
        model(idx, None, followers, cells, None)
    with pytest.raises(ValueError, match="record hints"):
        model(idx, None, followers, cells.unsqueeze(-1), weights)


def test_a_hinted_copy_task_learns():
    """Targets always equal the single follower: the hinted loss must fall well below log(VOCAB)."""
    model = tiny_model("speedrun")
    train(model, "speedrun", steps=40)
    idx, targets = torch.randint(0, VOCAB, (B, T)), torch.randint(0, VOCAB, (B, T))
    followers = torch.full((B, T, F), -1)
    followers[..., 0] = targets
    with torch.no_grad():
        loss = model(idx, targets, followers, torch.full((B, T), 5), (followers >= 0).float()).item()
    assert loss < 0.5 * torch.log(torch.tensor(float(VOCAB))).item()
