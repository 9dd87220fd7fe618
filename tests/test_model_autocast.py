"""What the GPU runs in bf16, run on the CPU: the record backbone (12 layers, 3 value-embedding
tables, block 7 without attention, windowed document attention, hints) forward and backward under
CPU bf16 autocast, with the embedding tables in float32 (the CPU model under autocast) and in bf16
(the GPU path's tables, GPT.cast_embeddings). FlexAttention's fused backward refuses query, key
and value of different dtypes, so every attention call must get one dtype; every gradient must be
finite and nonzero somewhere. The model is trained a few steps first: at init the LM head and the
output projections are zero, so most gradients are exactly zero and every loss is ln(vocab).
The other backbone tests run under autocast too (tests/test_model_backbone.py)."""
import copy
import math

import pytest
import torch

import model.gpt as gpt_module
from hints import n_kinds
from model import GPT, RECORD_BACKBONE, GPTConfig, build_optimizers

VOCAB, T, B, K, BLOCK, BOS = 500, 64, 2, 3, 8, 7
N_LAYER = 12  # the record's depth: value embeddings on blocks 0-2 and 9-11, block 7 without attention

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def record_model(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=VOCAB, n_layer=N_LAYER, n_head=2, n_embd=64, max_seq_len=T, n_hint_lengths=K,
                         n_hint_kinds=n_kinds(K), attn_block_size=BLOCK, bos_id=BOS, **RECORD_BACKBONE))


def trained_record_model(steps=5):
    """record_model() after `steps` optimizer steps on record_batch() under CPU bf16 autocast (float32
    tables): the head, the projections and every mix are nonzero, gradients and losses move, and
    the loss on that batch is far below ln(vocab)."""
    model = record_model()
    optimizers = build_optimizers(model, arch="speedrun")
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(*record_batch())
        loss.backward()
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
    return model


@pytest.fixture(scope="module")
def trained_state():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return trained_record_model().state_dict()
    finally:
        torch.set_num_threads(threads)


def trained_copy(state):
    model = record_model()
    model.load_state_dict(copy.deepcopy(state))
    return model


def record_batch(seed=1):
    """Tokens with documents (BOS at a few places), targets, and hints with some absent."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, VOCAB, (B, T), generator=g)
    idx[idx == BOS] = BOS + 1
    idx[:, torch.randint(1, T, (3,), generator=g)] = BOS
    hint_tokens = torch.randint(-1, VOCAB, (B, T, K), generator=g)
    hint_kinds = torch.randint(0, n_kinds(K), (B, T, K), generator=g).masked_fill(hint_tokens < 0, -1)
    return idx, idx.roll(-1, 1), hint_tokens, hint_kinds


@pytest.fixture
def attention_dtypes(monkeypatch):
    """The (q, k, v) dtypes of every attention call the model makes (the real attend runs)."""
    calls, attend = [], gpt_module.attend

    def recording(q, k, v, mask):
        calls.append((q.dtype, k.dtype, v.dtype))
        return attend(q, k, v, mask)

    monkeypatch.setattr(gpt_module, "attend", recording)
    return calls


@pytest.mark.parametrize("tables", ["float32", "bfloat16"])
def test_record_backbone_under_bf16_autocast(tables, attention_dtypes, trained_state):
    model = trained_copy(trained_state)
    if tables == "bfloat16":
        model.cast_embeddings(torch.bfloat16)
        assert {p.dtype for p in [model.wte.weight, *model.value_embeds.parameters()]} == {torch.bfloat16}
        assert model.lm_head.weight.dtype == torch.float32  # the head stays float32, as in the record
    model.set_window_blocks(3)  # a window shorter than the sequence: the windowed mask matters
    idx, targets, hint_tokens, hint_kinds = record_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(idx, targets, hint_tokens, hint_kinds)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    n_attention = N_LAYER - len(RECORD_BACKBONE["no_attn_layers"])
    assert len(attention_dtypes) == n_attention
    mixed = [i for i, dtypes in enumerate(attention_dtypes) if set(dtypes) != {torch.bfloat16}]
    assert not mixed, f"attention calls {mixed} of {n_attention} got mixed or non-bf16 (q, k, v): " \
                      f"{[attention_dtypes[i] for i in mixed]}"
    loss.backward()
    for name, p in model.named_parameters():  # every parameter is used: its gradient carries signal
        assert p.grad is not None, name
        assert p.grad.dtype == p.dtype, name
        assert torch.isfinite(p.grad).all(), name
        assert (p.grad != 0).any(), name


def test_bf16_tables_match_float32_tables_closely(trained_state):
    """Casting the tables to bf16 rounds each of their entries to bf16 and changes nothing else; the
    trained model's loss then moves only by bf16 rounding."""
    idx, targets, hint_tokens, hint_kinds = record_batch()
    plain, cast = trained_copy(trained_state), trained_copy(trained_state).cast_embeddings(torch.bfloat16)
    tables = ["wte.weight"] + [f"value_embeds.{i}.weight" for i in range(len(plain.value_embeds))]
    cast_state = cast.state_dict()
    for name, tensor in plain.state_dict().items():
        if name in tables:
            assert cast_state[name].dtype == torch.bfloat16 and torch.equal(cast_state[name], tensor.to(torch.bfloat16)), name
        else:
            assert torch.equal(cast_state[name], tensor), name
    losses = []
    for model in (plain, cast):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            losses.append(model(idx, targets, hint_tokens, hint_kinds).item())
    assert losses[0] < math.log(VOCAB) - 1  # trained: not the zero head's ln(vocab)
    # bf16 rounding of the tables moves it by ~1e-3; a token table scaled by 100 by ~0.1, a value table by ~1
    assert losses[0] == pytest.approx(losses[1], abs=1e-2)


def test_float32_without_autocast(attention_dtypes):
    """Without autocast everything stays float32 (the CPU path): attention gets float32 q, k, v."""
    model = record_model()
    model(*record_batch()).backward()
    assert attention_dtypes and all(set(c) == {torch.float32} for c in attention_dtypes)
