"""The later-record backbone features of the speedrun GPT, each on its own and all together:
shapes, causality, the exact no-op of absent hints, windowed document attention (FlexAttention
and the explicit SDPA mask agree), and the padded-width logits and loss. The tests that take
the `amp` fixture run twice: in float32 and under CPU bf16 autocast (what the GPU path runs
in bf16; tests/test_model_autocast.py checks its dtypes)."""
import contextlib
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from hints import n_kinds
from model import GPT, RECORD_BACKBONE, GPTConfig, build_optimizers
from model.attention import attend, document_ids, flex_attention_op, window_block_mask, window_mask

VOCAB, T, B, K, BLOCK, BOS = 500, 32, 2, 3, 4, 7   # VOCAB pads to 512: 12 pad columns
FEATURES = {
    "baseline": {},
    "unet_skips": dict(unet_skips=True),
    "embed_skips": dict(embed_skips=True),
    "value_embeds": dict(value_embeds=2),
    "window_attn": dict(window_attn=True),
    "no_attn_layers": dict(no_attn_layers=(1,)),
    "rope_half": dict(rope="half"),
    "record": RECORD_BACKBONE,
}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(params=["float32", "bf16-autocast"])
def amp(request):
    """The context the test's forwards run in: none (float32), then CPU bf16 autocast. Per forward,
    as the trainer enters it: autocast caches its bf16 copies of the weights until the outermost
    autocast region exits, so a region around optimizer steps would keep reading stale weights."""
    if request.param == "float32":
        return contextlib.nullcontext
    return lambda: torch.autocast("cpu", dtype=torch.bfloat16)


def tiny_model(features, seed=0, **overrides):
    torch.manual_seed(seed)
    n_layer = 8 if features is RECORD_BACKBONE else 4  # the record's block 7 has no attention
    cfg = dict(vocab_size=VOCAB, n_layer=n_layer, n_head=2, n_embd=32, max_seq_len=T, n_hint_lengths=K,
               n_hint_kinds=n_kinds(K), attn_block_size=BLOCK, bos_id=BOS, **features)
    cfg.update(overrides)
    return GPT(GPTConfig(**cfg))


def batch(generator=None):
    idx = torch.randint(0, VOCAB, (B, T), generator=generator)
    return idx, idx.roll(-1, 1)


def trained(features, steps=3, amp=contextlib.nullcontext, **overrides):
    """A model after a few steps, so zero-initialised weights and mixes (LM head, output
    projections, the embedding-skip weight of x0) are nonzero and every path carries signal;
    amp: the context of each forward."""
    model = tiny_model(features, **overrides)
    optimizers = build_optimizers(model, arch="speedrun")
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        idx, targets = batch(g)
        hints = torch.randint(-1, VOCAB, (B, T, K), generator=g)
        kinds = torch.randint(0, 126, (B, T, K), generator=g).masked_fill(hints < 0, -1)
        with amp():
            loss = model(idx, targets, hints, kinds)
        loss.backward()
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
    return model


@pytest.mark.parametrize("name", FEATURES)
def test_shapes_and_gradients(name, amp):
    """Shapes, and on a trained model (at init the zero head and projections leave most gradients
    exactly zero) every parameter is used: its gradient is finite and nonzero somewhere."""
    model = trained(FEATURES[name], amp=amp)
    idx, targets = batch()
    hints = torch.randint(-1, VOCAB, (B, T, K))
    with amp():
        logits = model(idx)
        loss = model(idx, targets, hints, torch.randint(0, 126, (B, T, K)))
    assert logits.shape == (B, T, VOCAB) and logits.dtype == torch.float32
    assert loss.shape == () and torch.isfinite(loss)
    loss.backward()
    n_blocks = model.cfg.n_layer
    if model.skip_weights is not None:
        assert model.skip_weights.shape == (n_blocks - n_blocks // 2,)
    assert len(model.value_embeds) == model.cfg.value_embeds
    assert all(not b.has_attention for i, b in enumerate(model.blocks) if i in model.cfg.no_attn_layers)
    for name, p in model.named_parameters():  # every parameter is used
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert (p.grad != 0).any(), name


@pytest.mark.parametrize("name", FEATURES)
def test_causal(name, amp):
    """Changing the token at position t leaves the logits of every earlier position unchanged."""
    model = trained(FEATURES[name], amp=amp)
    idx, _ = batch(torch.Generator().manual_seed(5))
    t = T // 2 + 1
    changed = idx.clone()
    changed[:, t] = (idx[:, t] + 1) % VOCAB
    with torch.no_grad(), amp():
        before, after = model(idx), model(changed)
    assert torch.equal(before[:, :t], after[:, :t])
    assert not torch.allclose(before[:, t], after[:, t])


@pytest.mark.parametrize("name", FEATURES)
def test_absent_hints_are_bitwise_no_hints(name, amp):
    model = trained(FEATURES[name], amp=amp)
    idx, targets = batch(torch.Generator().manual_seed(6))
    absent = torch.full((B, T, K), -1)
    kinds_only = torch.randint(0, 126, (B, T, K))  # a kind without a token is absent too
    with torch.no_grad(), amp():
        plain = model(idx)
        assert torch.equal(plain, model(idx, hint_tokens=absent, hint_kinds=absent))
        assert torch.equal(plain, model(idx, hint_tokens=absent, hint_kinds=kinds_only))
        assert torch.equal(model(idx, targets), model(idx, targets, absent, absent))


def test_loss_is_the_cross_entropy_of_the_real_columns(amp):
    """The padded-width loss equals, bitwise, the cross-entropy over the vocab_size real columns
    (the loss before the logits kept their padded width), and pad rows of the head get no gradient."""
    model = trained(FEATURES["baseline"], amp=amp)
    idx, targets = batch(torch.Generator().manual_seed(7))
    assert model.cfg.padded_vocab_size > VOCAB
    with torch.no_grad(), amp():
        sliced = F.cross_entropy(model(idx).reshape(-1, VOCAB), targets.reshape(-1))
        assert torch.equal(model(idx, targets), sliced)
    with amp():
        loss = model(idx, targets)
    loss.backward()
    assert (model.lm_head.weight.grad[VOCAB:] == 0).all()
    assert (model.lm_head.weight.grad[:VOCAB] != 0).any()


def test_window_and_documents_limit_what_a_position_sees(amp):
    model = trained(FEATURES["window_attn"], amp=amp)
    idx, _ = batch(torch.Generator().manual_seed(8))
    idx[idx == BOS] = BOS + 1
    changed = idx.clone()
    changed[:, 1] = (idx[:, 1] + 1) % VOCAB  # a token of block 0
    with torch.no_grad(), amp():
        model.set_window_blocks(1)  # a block sees only itself: nothing crosses a block boundary
        assert torch.equal(model(idx)[:, BLOCK:], model(changed)[:, BLOCK:])
        model.set_window_blocks(2)  # one block back per layer: block 0 reaches the next blocks
        assert not torch.allclose(model(idx)[:, BLOCK:2 * BLOCK], model(changed)[:, BLOCK:2 * BLOCK])
        # a BOS after the change starts a new document that no earlier token reaches
        model.set_window_blocks(T // BLOCK)
        idx[:, 5], changed[:, 5] = BOS, BOS
        assert torch.equal(model(idx)[:, 5:], model(changed)[:, 5:])
        assert not torch.allclose(model(idx)[:, 2:5], model(changed)[:, 2:5])


def test_full_window_without_documents_is_dense_causal_attention(amp):
    windowed = trained(FEATURES["window_attn"], amp=amp)
    dense = tiny_model({})
    dense.load_state_dict(windowed.state_dict())
    idx, _ = batch(torch.Generator().manual_seed(9))
    idx[idx == BOS] = BOS + 1
    with torch.no_grad(), amp():
        bf16 = torch.is_autocast_enabled("cpu")
        tol = 1e-2 if bf16 else 1e-5  # bf16: the explicit-mask and causal SDPA kernels may round apart (0 here)
        torch.testing.assert_close(windowed(idx), dense(idx), rtol=tol, atol=tol)


def documents_batch(T_, n_docs, generator):
    """(2, T_) tokens with BOS at random places (some long documents, so some blocks are full)."""
    idx = torch.randint(0, VOCAB, (2, T_), generator=generator)
    idx[idx == BOS] = BOS + 1
    for row in range(2):
        idx[row, torch.randint(1, T_, (n_docs,), generator=generator)] = BOS
    return idx


def test_window_mask_is_the_documented_rule():
    g = torch.Generator().manual_seed(10)
    idx = documents_batch(24, 3, g)
    window = torch.tensor(2)
    mask = window_mask(idx, window, 4, BOS)
    docs = document_ids(idx, BOS)
    for b in range(2):
        for q in range(24):
            for k in range(24):
                rule = k <= q and docs[b, q] == docs[b, k] and q // 4 - k // 4 < 2
                assert bool(mask[b, 0, q, k]) == rule


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [1, 3, 16])
def test_flex_attention_matches_the_explicit_mask(window, dtype):
    """FlexAttention with the BlockMask (the GPU path; eager and unfused on the CPU) gives the
    outputs of SDPA with the explicit boolean mask, in float32 and in bf16 (the GPU's dtype)."""
    g = torch.Generator().manual_seed(window)
    T_, H, hd, bs = 128, 2, 16, 8
    idx = documents_batch(T_, 4, g)
    q, k, v = (torch.randn(2, T_, H, hd, generator=g).to(dtype) for _ in range(3))
    w = torch.tensor(window, dtype=torch.int32)
    explicit = attend(q, k, v, window_mask(idx, w, bs, BOS))
    block_mask = window_block_mask(idx, w, bs, BOS)
    flex = flex_attention_op(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask)
    assert flex.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: 8 bits of mantissa
    torch.testing.assert_close(flex.transpose(1, 2).flatten(2), explicit, rtol=tol, atol=tol)
    # and the block mask skips blocks: fewer visited than the causal triangle
    n = T_ // bs
    visited = block_mask.kv_num_blocks.sum() + block_mask.full_kv_num_blocks.sum()
    assert visited < 2 * n * (n + 1) // 2


@pytest.mark.parametrize("window", [1, 3, 16])
def test_block_mask_summarises_the_explicit_mask(window):
    """Each (query block, key block) pair is skipped when no token pair in it attends, 'full' (no
    mask_mod) when every pair does, and partial otherwise. (Eager FlexAttention applies mask_mod
    to full blocks too, so the output comparison above cannot see a wrong 'full'.)"""
    g = torch.Generator().manual_seed(100 + window)
    T_, bs = 128, 8
    idx = documents_batch(T_, 4, g)
    w = torch.tensor(window, dtype=torch.int32)
    n = T_ // bs
    explicit = window_mask(idx, w, bs, BOS)[:, 0].view(2, n, bs, n, bs)
    allowed_all, allowed_any = explicit.all(dim=(2, 4)), explicit.any(dim=(2, 4))
    block_mask = window_block_mask(idx, w, bs, BOS)

    def dense(counts, indices):
        out = torch.zeros(2, n, n, dtype=torch.bool)
        for b in range(2):
            for qb in range(n):
                out[b, qb, indices[b, 0, qb, :counts[b, 0, qb]].long()] = True
        return out

    full = dense(block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
    partial = dense(block_mask.kv_num_blocks, block_mask.kv_indices)
    assert torch.equal(full, allowed_all)
    assert torch.equal(partial, allowed_any & ~allowed_all)
    assert partial.any() and (~allowed_any).any() and (full.any() or window == 1)  # window 1: only diagonal blocks


def test_value_embeddings_feed_the_first_and_last_blocks():
    model = tiny_model(dict(value_embeds=2), n_layer=6)
    tables = ["a", "b"]
    assert [model._value_embedding(tables, i) for i in range(6)] == ["a", "b", None, None, "a", "b"]


@pytest.mark.parametrize("bad, match", [
    (dict(arch="gpt2", unet_skips=True), "speedrun-only"),
    (dict(value_embeds=3), "value_embeds"),
    (dict(no_attn_layers=(4,)), "no_attn_layers"),
    (dict(rope="quarter"), "rope"),
])
def test_config_rejects_bad_features(bad, match):
    base = dict(vocab_size=VOCAB, n_layer=4, n_head=2, n_embd=32, n_hint_kinds=n_kinds(K))
    with pytest.raises(ValueError, match=match):
        GPTConfig(**{**base, **bad})


def test_window_needs_whole_blocks():
    model = tiny_model(FEATURES["window_attn"])
    with pytest.raises(ValueError, match="attn_block_size"):
        model(torch.randint(0, VOCAB, (1, T - 1)))
    with pytest.raises(ValueError, match="window"):
        model.set_window_blocks(0)


def test_record_backbone_is_a_config():
    cfg = GPTConfig(**RECORD_BACKBONE, n_hint_kinds=n_kinds(3))
    assert cfg.speedrun_features() == ["unet_skips", "embed_skips", "value_embeds", "window_attn",
                                       "no_attn_layers", "rope"]
    assert dataclasses.asdict(cfg)["no_attn_layers"] == (7,)
