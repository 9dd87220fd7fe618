"""The record arch (model/record_gpt.py, model/record_residual.py) on a tiny instance.

The step-0 reference below is written from RECORD.md's formulas (sections 2-8) in plain torch: it reads the
model's parameters by name and computes every layer by hand (banks cut into heads by their documented
layout, every gate lane by its index, the mixes term by term); its attention is the dense reference of
tests/test_record_attention.py. It never calls RecordGPT's code, attend() or the residual networks. Every
zero-initialised weight is perturbed first (in the model, so the reference reads the same values), and
every lambda and bias moved off its init, so a swapped lane, layer or source changes the numbers.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from model.anvil import ANVIL_LABELS, Anvil
from model.ngram_table import NgramTable
from model.record_adam import ADAM_TABLE, RecordAdam
from model.record_gpt import RecordConfig, RecordGPT, RecordHints, describe
from model.record_loss import SampledSoftmax
from model.row_adam import ValueEmbedAdam
from tests.test_record_attention import reference as attention_reference

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DOCS = (7, 1, 13, 19)          # T = 40 packed tokens in four documents
T = sum(DOCS)
WINDOWS = (5, 12)              # short, long windows in tokens
D, H, HD, VOCAB, CELLS, F_MAX = 64, 4, 16, 200, 8, 3


def tiny_config(**kw):
    return RecordConfig(**{**dict(vocab_size=VOCAB, model_dim=D, n_head=H, head_dim=HD, mlp_hidden=96,
                                  gate_hidden=16, mix_group_width=16, n_hint_kinds=CELLS, fp8=False,
                                  initial_windows=WINDOWS), **kw})


def cu_seqlens(docs=DOCS):
    return torch.tensor([0, *torch.tensor(docs).cumsum(0).tolist()], dtype=torch.int32)


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, VOCAB, (T,), generator=g)
    targets = torch.randint(0, VOCAB, (T,), generator=g)
    ng = (0.5 * torch.randn(T, D, generator=g)).bfloat16()  # the table's output is bf16
    prefix = torch.where(torch.rand(T, generator=g) < 0.5, torch.randint(0, VOCAB, (T,), generator=g), -1)
    return idx, targets, ng, prefix


def cell_hints(seed=0, absent=False):
    g = torch.Generator().manual_seed(seed)
    cells = torch.randint(-1, CELLS, (T,), generator=g)
    followers = torch.randint(0, VOCAB, (T, F_MAX), generator=g)
    followers[torch.rand(T, F_MAX, generator=g) < 0.3] = -1
    counts = torch.randint(1, 9, (T, F_MAX), generator=g).float() * (followers >= 0)
    if absent:
        cells, followers, counts = torch.full_like(cells, -1), torch.full_like(followers, -1), torch.zeros_like(counts)
    return RecordHints(followers, cells, counts)


def perturbed_model(seed=1, **kw):
    """A tiny model whose zero-init weights are small random values and whose lambdas, scalars and biases
    sit off their inits."""
    torch.manual_seed(seed)
    m = RecordGPT(tiny_config(**kw))
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in m.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name == "mlp_bank":
                p[:, 1] = 0.05 * noise[:, 1]
            elif name in ("ve_gate_bank", "smear_gate") or name.endswith(("w2", "w2g", "cell_embedding")):
                p.copy_(0.3 * noise if name != "hints.cell_embedding" else 0.01 * noise)
            elif p.ndim <= 2 and p.numel() <= 4 * 17 and not name.startswith(("qk", "vo")):
                p.add_(0.1 * noise)  # lambdas, scalars, biases, the hint scales
        m.smear_lambda.fill_(0.4)
    return m


# ---------------------------------------------------------------------------------------------------------------
# The reference

def rms(x):
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + torch.finfo(x.dtype).eps)


def reference_hidden(m, idx, ng, hints, docs=DOCS, windows=WINDOWS):
    """The final normed hidden state (T, d), from RECORD.md's formulas."""
    P = dict(m.named_parameters())
    n, V = idx.numel(), m.cfg.padded_vocab_size
    E = P["embed.weight"]
    ng = ng.float()
    mlp = lambda x, s: F.relu(x @ P["mlp_bank"][s, 0].T).square() @ P["mlp_bank"][s, 1]
    net = lambda x, name, scale: (F.gelu(x @ P[name + ".w1"].T) @ P[name + ".w2"].T + P[name + ".b2"]) * scale

    # section 8: the hint, m_i = sum_c (n_c / max(1, sum n)) E[token_c] (detached); [cell >= 0] (a m + B)
    hint = torch.zeros(n, D)
    s_in = s_mid = s_out = 0.0
    if hints is not None:
        w = hints.weights * (hints.tokens >= 0)
        w = w / w.sum(-1, keepdim=True).clamp(min=1)
        mean = (w[..., None] * E.detach()[hints.tokens.clamp(min=0)]).sum(1)
        c = hints.kinds.clamp(min=0)
        a, B = P["hints.cell_scale"][c], P["hints.cell_embedding"][c]
        hint = (hints.kinds >= 0)[:, None] * (a[:, None] * mean + B)
        s_in, s_mid, s_out = P["hints.scales"]

    # section 4: embedding, smear, x0, the pre gate
    e = E[idx] + s_in * hint
    rows = [e[0]] + [e[t] + P["smear_lambda"] * torch.sigmoid(P["smear_gate"][0] @ e[t, :12]) * e[t - 1]
                     for t in range(1, n)]
    x0 = rms(torch.stack(rows))
    pre = net(x0, "pre_gate", P["gate_scale"])  # 17 lanes at 4 heads
    xsa = {1: pre[:, 0:4], 3: pre[:, 4:8]}
    out_gate = {3: pre[:, 8:12]}
    g_x0 = {0: pre[:, 12:13], 1: pre[:, 13:14], 2: pre[:, 14:15]}
    g_ng = {0: pre[:, 15:16], 1: pre[:, 16:17]}
    planes = P["value_embeds"].view(4, V, D)[:, idx]
    ve = {1: planes[0], 2: planes[1], 8: planes[2], 10: planes[3]}
    r, p, l_qkv, l_o = P["resid_lambdas"], P["post_lambdas"], P["attn_qkv_scale"], P["attn_out_scale"]

    def attention(i, x_in, aux, gain):
        slot = (0, 2, 5, 1, 8, 3, 10).index(i)
        dqk = HD if i in (3, 10) else HD // 2
        dv = HD // 2 if i in (1, 8) else HD
        qk = P["qk_bank"][slot * H:(slot + 1) * H].reshape(2 * H * HD, D)  # Q heads, then K heads
        Wq = torch.cat([qk[h * HD:h * HD + dqk] for h in range(H)])
        Wk = torch.cat([qk[(H + h) * HD:(H + h) * HD + dqk] for h in range(H)])
        Wv = torch.cat([P["vo_bank"][2 * slot][h * HD:h * HD + dv] for h in range(H)])
        Wo = torch.cat([P["vo_bank"][2 * slot + 1][:, h * HD:h * HD + dv] for h in range(H)], dim=1)
        q = (l_qkv[i] * x_in @ Wq.T).view(n, H, dqk)
        k = (l_qkv[i] * x_in @ Wk.T).view(n, H, dqk)
        v = (l_qkv[i] * x_in @ Wv.T).view(n, H, dv)
        if aux is not None:
            v = v + aux.view(n, H, HD)[..., :dv]
        table = m.rotaries.wide if i in (3, 10) else m.rotaries.paired if i in (0, 2, 5) else m.rotaries.narrow
        y = attention_reference(q, k, v, table, docs, windows[1] if i in (3, 10) else windows[0],
                                key_offset=i in (3, 10), xsa=xsa.get(i), gate=out_gate.get(i))
        return gain * (y @ Wo.T)

    x = x0 + g_ng[0] * ng
    cache = {0: x}
    for i in range(11):
        if i == 4:  # the post gate, 11 lanes
            post = net(x, "post_gate", P["gate_scale"])
            out_gate[10] = post[:, 0:4]
            g_x0.update({4: post[:, 4:5], 5: post[:, 5:6], 7: post[:, 6:7]})
            g_ng.update({4: post[:, 7:8], 5: post[:, 8:9], 9: post[:, 9:10]})
            g_skip = post[:, 10:11]
        if i == 7:
            x = x + s_mid * hint
        if i == 6:
            x = x + torch.sigmoid(P["skip_lambda"]) * g_skip * cache[3]
        elif i in (4, 7, 9):
            x = r[i, 0] * x + (g_x0[i] * x0 if i in (4, 7) else 0) + (g_ng[i] * ng if i in (4, 9) else 0)
        elif i == 10:
            cache[9] = x
            mu = net(x, "last_mix", 0.1).unbind(-1)
            mu = [c[:, None] for c in mu]
            v_extra = mu[0] * cache[0] + mu[1] * cache[7] + mu[2] * x
            x = (1 + mu[5]) * x + mu[3] * cache[0] + mu[4] * cache[7]
            head_gate = torch.cat([mu[6], mu[6], mu[7], mu[7]], dim=1)[..., None]  # heads 0, 1 | 2, 3
            aux = (head_gate * ve[10].view(n, H, HD)).reshape(n, D) + v_extra
            a = attention(10, rms(cache[7]), aux, l_o[10])
            x = mu[8] * x + mu[9] * a + mu[10] * cache[0] + mu[11] * ng
        else:
            x_in = rms(cache[7]) if i == 8 else rms(x)
            aux = None
            if i in (1, 2, 8):
                W = P["ve_gate_bank"][(1, 2, 8).index(i)]
                gate = 2 * torch.sigmoid(torch.cat([x_in[:, :6], ve[i][:, :6]], dim=1) @ W.T)
                aux = (gate[..., None] * ve[i].view(n, H, HD)).reshape(n, D)
            x = r[i, 0] * x + attention(i, x_in, aux, l_o[i] * p[i, 0])
            x = x + (g_x0[i] * x0 if i in (0, 1, 2, 5) else 0) + (g_ng[i] * ng if i in (1, 5) else 0)
        if i == 7:
            x = r[7, 1] * x
            cache[7] = x
            continue
        h_in = rms(x)
        if i == 10:
            x = mu[12] * x + mu[13] * mlp(h_in, 10)
        else:
            x = r[i, 1] * x + p[i, 1] * mlp(h_in, i)
        if i == 8:
            x = x + p[8, 1] * mlp(h_in, 11)
        if i == 3:
            cache[3] = x
    # the post-loop mix: 10 sources, per-token mu_k plus per-group delta_k,g
    sources = [cache[0], cache[7], cache[9], ve[1], cache[3], ve[2], ve[10], ve[8], h_in, rms(cache[7])]
    hid = F.gelu(x @ P["post_mix.w1"].T)
    mu = 0.1 * (hid @ P["post_mix.w2"].T + P["post_mix.b2"])
    width = m.cfg.mix_group_width
    out = x.clone()
    for grp in range(D // width):
        cols = slice(grp * width, (grp + 1) * width)
        delta = 0.1 * hid @ P["post_mix.w2g"][:, grp].T  # (T, 10)
        for k, src in enumerate(sources):
            out[:, cols] = out[:, cols] + (mu[:, k:k + 1] + delta[:, k:k + 1]) * src[:, cols]
    return rms(out + s_out * hint)


def reference_loss(m, idx, targets, ng, hints, mtp, prefix, prefix_weight):
    """Section 6: z = 23 sigmoid((norm(x) W + 5) / 7.5); sum_i sum_k w_k CE(z_i, y_(i+k)) + w_p CE(z_i, prefix)."""
    z = 23 * torch.sigmoid((reference_hidden(m, idx, ng, hints) @ m.lm_head + 5) / 7.5)
    lse = torch.logsumexp(z, dim=1)
    loss = 0.0
    for i in range(T):
        for k, w in enumerate(mtp):
            if i + k < T:
                loss = loss + w * (lse[i] - z[i, targets[i + k]])
        if prefix[i] >= 0:
            loss = loss + prefix_weight * (lse[i] - z[i, prefix[i]])
    return loss


# ---------------------------------------------------------------------------------------------------------------

def test_step0_forward_matches_the_reference():
    m = perturbed_model()
    idx, targets, ng, prefix = batch()
    hints = cell_hints()
    mtp = (1.0, 0.5, 0.25)
    got = m(idx, targets, cu_seqlens(), ng, windows=WINDOWS, mtp_weights=mtp, prefix_targets=prefix,
            prefix_weight=0.25, hints=hints)
    want = reference_loss(m, idx, targets, ng, hints, mtp, prefix, 0.25)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    # eval: plain next-token CE over the full vocabulary
    total, count = m.evaluate(idx, targets, cu_seqlens(), ng, windows=WINDOWS, hints=hints)
    torch.testing.assert_close(total, reference_loss(m, idx, targets, ng, hints, (1.0,), prefix, 0.0), rtol=1e-5, atol=1e-4)
    assert count == T


def test_gradients_match_the_reference():
    """Every parameter's gradient, model against reference (MTP weight 1 only: with more weights the record's
    normaliser quirk changes the last rows' gradient, model/record_loss.py)."""
    m = perturbed_model(seed=2)
    idx, targets, ng, prefix = batch(seed=2)
    hints = cell_hints(seed=2)
    params = [p for _, p in m.named_parameters()]
    got = torch.autograd.grad(m(idx, targets, cu_seqlens(), ng, windows=WINDOWS, prefix_targets=prefix,
                                prefix_weight=0.2, hints=hints), params)
    want = torch.autograd.grad(reference_loss(m, idx, targets, ng, hints, (1.0,), prefix, 0.2), params,
                               allow_unused=True)
    for (name, _), g, w in zip(m.named_parameters(), got, want):
        torch.testing.assert_close(g, torch.zeros_like(g) if w is None else w, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("hint_repr", ["record", "lengths"])
def test_absent_hints_are_bitwise_no_hints(hint_repr):
    m = perturbed_model(hint_repr=hint_repr)
    idx, targets, ng, prefix = batch()
    if hint_repr == "record":
        absent = cell_hints(absent=True)
    else:
        absent = RecordHints(torch.full((T, 3), -1), torch.full((T, 3), -1))

    def run(h):
        """The loss and the gradients of every parameter outside the hint module."""
        loss = m(idx, targets, cu_seqlens(), ng, windows=WINDOWS, mtp_weights=(1.0, 0.5), hints=h)
        params = [p for name, p in m.named_parameters() if not name.startswith("hints.")]
        return [loss, *torch.autograd.grad(loss, params)]

    for got, want in zip(run(absent), run(None)):
        assert torch.equal(got, want)
    assert torch.equal(m.evaluate(idx, targets, cu_seqlens(), ng, windows=WINDOWS, hints=absent)[0],
                       m.evaluate(idx, targets, cu_seqlens(), ng, windows=WINDOWS)[0])
    present = cell_hints() if hint_repr == "record" else RecordHints(torch.randint(0, VOCAB, (T, 3)),
                                                                     torch.randint(0, CELLS, (T, 3)))
    assert not torch.equal(run(present)[0], run(None)[0])  # and present hints do change it


def test_init_values():
    torch.manual_seed(0)
    m = RecordGPT(tiny_config())
    assert torch.equal(m.embed.weight, m.lm_head.T)
    assert abs(m.lm_head.std().item() - 0.005) < 0.0005
    assert torch.all(m.mlp_bank[:, 1] == 0) and torch.all(m.ve_gate_bank == 0) and torch.all(m.smear_gate == 0)
    bound = math.sqrt(3) * 0.5 / math.sqrt(D)
    assert 0.9 * bound < m.qk_bank.abs().max() <= bound and 0.9 * bound < m.mlp_bank[:, 0].abs().max() <= bound
    torch.testing.assert_close(m.resid_lambdas, torch.full((11, 2), math.sqrt(1.1)))
    # effective gate values at init: b2 * s_g (W2 = 0); the sheet's XSA 0, output 0.25, x0 0, n-gram 0.05, skip 0.5
    pre, post = m.pre_gate.b2 * m.gate_scale, m.post_gate.b2 * m.gate_scale
    torch.testing.assert_close(pre, torch.tensor([0.0] * 8 + [0.25] * 4 + [0.0] * 3 + [0.05] * 2))
    torch.testing.assert_close(post, torch.tensor([0.25] * 4 + [0.0] * 3 + [0.05] * 3 + [0.5]))
    torch.testing.assert_close(m.last_mix.b2 * 0.1, torch.tensor(
        [0, 0, 0, 0, 0, 0, 2, 2, math.sqrt(1.1), 1, 0, 0.05, math.sqrt(1.1), 1], dtype=torch.float32))
    torch.testing.assert_close(m.post_mix.b2 * 0.1, torch.tensor([0, -0.5] + [0] * 8, dtype=torch.float32))
    assert m.hints.scales.tolist() == pytest.approx([0.1, 8.0, 8.0])


def test_every_parameter_gets_a_finite_nonzero_gradient():
    for fp8 in (False, True):
        m = perturbed_model(seed=3, fp8=fp8)
        m.refresh_fp8()
        idx, targets, ng, prefix = batch(seed=3)
        m(idx, targets, cu_seqlens(), ng, windows=WINDOWS, mtp_weights=(1.0, 0.5), prefix_targets=prefix,
          prefix_weight=0.25, hints=cell_hints(seed=3)).backward()
        for name, p in m.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, (fp8, name)


def test_labelled_params_cover_every_parameter_once():
    m = RecordGPT(tiny_config(), world_size=2)
    labelled = m.labelled_params()
    assert set(labelled) == set(ANVIL_LABELS) | set(ADAM_TABLE) | {"value_embeds"}
    ids = [id(p) for ps in labelled.values() for p in ps]
    assert len(ids) == len(set(ids)) and set(ids) == {id(p) for p in m.parameters()}
    assert m.qk_bank.shape == (28, 2 * HD, D) and m.vo_bank.shape == (14, D, D)
    assert m.mlp_bank.shape == (12, 2, 96, D) and m.value_embeds.shape == (4 * 256, D)
    assert RecordGPT(tiny_config(), world_size=8).qk_bank.shape[0] == 32  # padded to whole units per rank
    assert RecordGPT(tiny_config(), world_size=8).vo_bank.shape[0] == 16


def test_optimizer_steps_reduce_the_loss():
    """ANVIL on the banks, RecordAdam on the rest, value_embeds' Adam and the n-gram table on their events,
    fp8 on: the loss of a repeated batch falls."""
    torch.manual_seed(4)
    m = RecordGPT(tiny_config(fp8=True))
    labelled = m.labelled_params()
    anvil, adam = Anvil(labelled), RecordAdam(labelled, untie_step=5)
    ve_adam = ValueEmbedAdam(m.value_embeds)
    table = NgramTable(rows=256, dim=D, seed=0)
    idx, targets, _, _ = batch(seed=4)
    losses = []
    for step in range(10):
        if step % 2 == 0:
            table.begin_cycle([idx, idx])
        loss = m(idx, targets, cu_seqlens(), table.embed(idx), windows=WINDOWS, mtp_weights=(1.0, 0.5))
        loss.backward()
        losses.append(loss.item())
        anvil.step(lr_scale=1.0, rail_beta=0.9, engaged=False)
        adam.step(step, 1.0)
        ve_adam.accumulate(m.value_embeds.grad)
        m.value_embeds.grad = None
        if step % 2 == 1:
            ve_adam.update(step, lr=0.008)
            table.end_cycle(step, lr=0.008)
        m.refresh_fp8()
        assert all(p.grad is None for p in m.parameters())
    assert losses[-1] < 0.8 * losses[0], losses


def test_window_changes_apply_yarn_unless_told_not_to():
    m = perturbed_model()
    idx, targets, ng, _ = batch()
    scale0 = m.rotaries.wide.softmax_scale
    m.evaluate(idx, targets, cu_seqlens(), ng, windows=(WINDOWS[0], 24))
    assert m.windows == (WINDOWS[0], 24)
    assert m.rotaries.wide.softmax_scale == pytest.approx(scale0 * (1 + 0.2 * math.log(2)))
    assert m.rotaries.narrow.softmax_scale == m.rotaries.narrow.base_softmax_scale  # short unchanged
    m.evaluate(idx, targets, cu_seqlens(), ng, windows=(WINDOWS[0], 40), yarn=False)
    assert m.windows == (WINDOWS[0], 40)
    assert m.rotaries.wide.softmax_scale == pytest.approx(scale0 * (1 + 0.2 * math.log(2)))
    state = m.state_dict()  # windows and rotary tables travel with the weights
    m.reset_windows()
    assert m.windows == WINDOWS and m.rotaries.wide.softmax_scale == scale0
    m.load_state_dict(state)
    assert m.windows == (WINDOWS[0], 40)
    assert m.rotaries.wide.softmax_scale == pytest.approx(scale0 * (1 + 0.2 * math.log(2)))


def test_fp8_forward_is_close_to_the_float_forward():
    m = perturbed_model(seed=5)
    idx, targets, ng, _ = batch(seed=5)
    exact = m(idx, targets, cu_seqlens(), ng, windows=WINDOWS)
    m.cfg.fp8 = True
    m.refresh_fp8()
    fp8 = m(idx, targets, cu_seqlens(), ng, windows=WINDOWS)
    assert fp8 != exact and abs(fp8 - exact) / exact < 0.02
    m.reset_fp8()  # the post-warm-up reset: exact weight scales from the current weights again
    assert m.fp8_mlp_scales.refreshes == 1 and torch.all(m.fp8_mlp_scales.post_scale == 1.0)


def test_bad_inputs_are_named():
    m = RecordGPT(tiny_config())
    idx, targets, ng, _ = batch()
    with pytest.raises(ValueError, match="ng must be"):
        m(idx, targets, cu_seqlens(), ng[:-1], windows=WINDOWS)
    with pytest.raises(ValueError, match="cu_seqlens"):
        m(idx, targets, cu_seqlens().long(), ng, windows=WINDOWS)
    with pytest.raises(ValueError, match="record hints"):
        m(idx, targets, cu_seqlens(), ng, windows=WINDOWS, hints=RecordHints(cell_hints().tokens, cell_hints().kinds))
    with pytest.raises(ValueError, match="n_head \\* head_dim"):
        RecordConfig(model_dim=64, n_head=4, head_dim=8)


def test_describe_at_the_records_size():
    card = describe()
    assert card["arch"] == "record" and card["n_layer"] == 11 and card["model_dim"] == 512
    assert card["n_head"] == 4 and card["head_dim"] == 128 and card["vocab_size"] == 50304
    assert card["attention_layers"] == [0, 1, 2, 3, 5, 8, 10] and card["mlp_layers"] == [0, 1, 2, 3, 4, 5, 6, 8, 9, 10]
    assert card["mlp_hidden"] == 1792 and card["value_embed_layers"] == [1, 2, 8, 10]
    assert card["ngram_table_rows"] == 84_602_880 and len(card["hint_inject"]) == 3
    params = card["params"]
    assert params["qk_bank"] == 32 * 256 * 512 and params["vo_bank"] == 16 * 512 * 512
    assert params["mlp_bank"] == 12 * 2 * 1792 * 512
    assert params["embed"] == params["lm_head"] == 50304 * 512 and params["value_embeds"] == 4 * 50304 * 512
    assert params["total"] == sum(v for k, v in params.items() if k != "total")


def test_sampled_softmax_over_every_class_is_the_full_softmax():
    m = perturbed_model(seed=6)
    idx, targets, ng, prefix = batch(seed=6)
    full = m(idx, targets, cu_seqlens(), ng, windows=WINDOWS, prefix_targets=prefix, prefix_weight=0.2)
    every = SampledSoftmax(m.cfg.padded_vocab_size).candidates(m.cfg.padded_vocab_size, targets)
    sampled = m(idx, targets, cu_seqlens(), ng, windows=WINDOWS, prefix_targets=prefix, prefix_weight=0.2,
                candidates=every)
    torch.testing.assert_close(sampled, full)
    fewer = SampledSoftmax(m.cfg.padded_vocab_size).candidates(64, targets)
    assert m(idx, targets, cu_seqlens(), ng, windows=WINDOWS, candidates=fewer) < full


def test_the_records_dtypes_train():
    """cast_to_record_dtypes(): bf16 matrices, tables and networks, float32 scalars, lambdas and hints; the fp8
    forward and backward run, with the record's cell hints read from the bf16 tied table, finite, close to the
    float32 model's loss."""
    m = perturbed_model(seed=7, fp8=True)
    idx, targets, ng, _ = batch(seed=7)
    hints = cell_hints(seed=7)
    want = m(idx, targets, cu_seqlens(), ng, windows=WINDOWS, hints=hints).item()
    m.cast_to_record_dtypes()
    m.refresh_fp8()
    for label, params in m.labelled_params().items():
        fp32 = label in ("scalars", "resid_lambdas", "post_lambdas", "s_g", "hint_scales", "hint_embed")
        assert all(p.dtype == (torch.float32 if fp32 else torch.bfloat16) for p in params), label
    loss = m(idx, targets, cu_seqlens(), ng, windows=WINDOWS, hints=hints)
    loss.backward()
    assert abs(loss.item() - want) / want < 0.05
    assert m.hints.cell_scale.grad is not None and m.hints.cell_scale.grad.abs().sum() > 0  # the hints took part
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


def test_hints_and_tokens_are_causal():
    """The eval loss of positions < t (targets -1 from t on are not scored) ignores every input from t on."""
    m = perturbed_model(seed=8)
    idx, targets, ng, _ = batch(seed=8)
    hints = cell_hints(seed=8)
    t = 20
    early = torch.where(torch.arange(T) < t, targets, -1)
    idx2, followers2, cells2 = idx.clone(), hints.tokens.clone(), hints.kinds.clone()
    idx2[t:] = torch.randint(0, VOCAB, (T - t,))
    followers2[t:, 0] = torch.randint(0, VOCAB, (T - t,))
    cells2[t:] = 3
    changed = RecordHints(followers2, cells2, hints.weights.clamp(min=1))
    with torch.no_grad():
        run = lambda tokens, tg, h: m.evaluate(tokens, tg, cu_seqlens(), ng, windows=WINDOWS, hints=h)[0]
        torch.testing.assert_close(run(idx, early, hints), run(idx2, early, changed), rtol=1e-6, atol=1e-6)
        up_to_t = torch.where(torch.arange(T) <= t, targets, -1)
        assert abs(run(idx, up_to_t, hints) - run(idx2, up_to_t, changed)) > 1e-3


def test_a_hinted_copy_task_learns():
    """Targets are random and always the single follower: with ANVIL and Adam the hinted loss falls well below
    log(vocabulary), where a model without hints stays."""
    torch.manual_seed(9)
    m = RecordGPT(tiny_config())
    labelled = m.labelled_params()
    anvil, adam = Anvil(labelled), RecordAdam(labelled, untie_step=1001)
    ng = torch.zeros(T, D)

    def copy_batch():
        idx, targets = torch.randint(0, VOCAB, (T,)), torch.randint(0, VOCAB, (T,))
        followers = torch.full((T, F_MAX), -1)
        followers[:, 0] = targets
        return idx, targets, RecordHints(followers, torch.full((T,), 5), (followers >= 0).float())

    for step in range(60):
        idx, targets, hints = copy_batch()
        m(idx, targets, cu_seqlens(), ng, windows=WINDOWS, hints=hints).backward()
        m.value_embeds.grad = None
        anvil.step(lr_scale=1.0, rail_beta=0.9, engaged=False)
        adam.step(step, 1.0)
    idx, targets, hints = copy_batch()
    with torch.no_grad():
        total, count = m.evaluate(idx, targets, cu_seqlens(), ng, windows=WINDOWS, hints=hints)
        plain, _ = m.evaluate(idx, targets, cu_seqlens(), ng, windows=WINDOWS)
    assert total / count < 0.5 * math.log(VOCAB) < plain / count, (total / count, plain / count)


# ---------------------------------------------------------------------------------------------------------------
# Two gloo ranks (run from tests/test_record_optim_gloo.py's one spawn)

GLOO_WORLD, GLOO_STEPS, GLOO_UNTIE = 2, 4, 1


def gloo_rank_loss(m, rank):
    idx, targets, ng, prefix = batch(seed=20 + rank)
    return m(idx, targets, cu_seqlens(), ng, windows=WINDOWS, mtp_weights=(1.0, 0.5), prefix_targets=prefix,
             prefix_weight=0.2, hints=cell_hints(seed=20 + rank))


def gloo_part(rank=0, world=1):
    """RecordGPT with ANVIL and RecordAdam (tied, untie, untied), its banks padded for two ranks: the weights after
    four steps. On `world` ranks each trains on its own batch; one process is fed what the collectives compute:
    ANVIL the mean of the ranks' gradients each step, Adam on odd steps the mean of each rank's two-step sum
    (with embed's sum, transposed, added into lm_head's per rank while tied), zeros on even steps. The spawn and
    the bitwise comparison are tests/test_record_optim_gloo.py's."""
    torch.manual_seed(11)
    m = RecordGPT(tiny_config(), world_size=GLOO_WORLD)
    labelled = m.labelled_params()
    anvil = Anvil(labelled, rank=rank, world_size=world)
    adam = RecordAdam(labelled, untie_step=GLOO_UNTIE, rank=rank, world_size=world)
    names = [name for name, _ in m.named_parameters()]
    params = dict(m.named_parameters())
    banks = {"qk_bank", "vo_bank", "mlp_bank"}
    sums = [dict.fromkeys(names, 0.0) for _ in range(GLOO_WORLD)]  # each rank's two-step Adam sums
    for step in range(GLOO_STEPS):
        if world > 1:
            gloo_rank_loss(m, rank).backward()
        else:
            for r in range(GLOO_WORLD):
                grads = torch.autograd.grad(gloo_rank_loss(m, r), list(params.values()))
                for name, g in zip(names, grads):
                    sums[r][name] = sums[r][name] + g if step % 2 else g  # 0 + g is g, bit for bit
                    if name in banks:
                        params[name].grad = g if r == 0 else (params[name].grad + g) / GLOO_WORLD
            for name in names:
                if name not in banks:
                    params[name].grad = torch.zeros_like(params[name])
            if step % 2:
                for name in names:
                    if name not in banks:
                        params[name].grad = (sums[0][name] + sums[1][name]) / GLOO_WORLD
                if step <= GLOO_UNTIE:  # tied: each rank adds embed's sum, transposed, into lm_head's first
                    params["lm_head"].grad = sum(sums[r]["lm_head"] + sums[r]["embed.weight"].T
                                                 for r in range(GLOO_WORLD)) / GLOO_WORLD
                    params["embed.weight"].grad = torch.zeros_like(params["embed.weight"])
        m.value_embeds.grad = None  # its Adam is not part of this test
        anvil.step(lr_scale=1.0, rail_beta=0.9, engaged=step >= 2)
        adam.step(step, 1.0)
    return {name: p.detach().clone() for name, p in m.named_parameters()}
