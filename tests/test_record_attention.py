"""The record arch's attention core (model/record_attention.py, model/yarn.py) against a dense reference
written here from the record's description: a T x T (paired: 2T x 2T) mask of same-document keys within the
window as FA3's causal (ws, 0) window counts them, paired heads expanded by hand, rotary pair by pair. Both
kernels (per-segment SDPA; FlexAttention, eager on the CPU) on several documents and windows, every
combination of paired / key offset / XSA / gate; gradients against the reference's and by gradcheck; the
rotary frequencies and YaRN updates against the formulas."""
import itertools
import math

import pytest
import torch

from model.record_attention import (QK_NORM_EPS, attend, flex_varlen, prepare_qk, segment_ids, segment_sdpa,
                                    to_pairs, varlen_block_mask)
from model.yarn import NARROW_SOFTMAX_SCALE, WIDE_SOFTMAX_SCALE, RecordRotaries, YarnRotary

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DOCS = (7, 1, 13, 19)  # document lengths of the packed row: T = 40
T, H, R = sum(DOCS), 4, 8  # tokens, heads, rotary dims
WINDOWS = (0, 3, 10, 100)
COMBOS = list(itertools.product([False, True], repeat=4))  # paired, key_offset, xsa, gate


def cu_seqlens(docs, pad=2):
    """Segment starts of `docs` plus the end, then `pad` repeats of T (the record's padded table)."""
    ends = list(itertools.accumulate(docs))
    return torch.tensor([0, *ends] + [ends[-1]] * pad, dtype=torch.int32)


def doc_of_token(docs):
    return torch.tensor([d for d, n in enumerate(docs) for _ in range(n)])


# ---------------------------------------------------------------------------------------------------------------
# The reference. It reads the table's current frequencies and scale (its state; tested on their own below).

def ref_rotate(x, angle, freqs, factor_dtype):
    """x (..., d); angle (...) positions; pairs (2j, 2j+1) of the first 2*len(freqs) dims rotate by angle * w_j,
    cos and sin rounded as the record's tables store them."""
    out = x.clone()
    for j, w in enumerate(freqs.tolist()):
        theta = angle.float() * torch.tensor(w, dtype=torch.float32)
        c = theta.cos().to(factor_dtype).to(x.dtype)
        s = theta.sin().to(factor_dtype).to(x.dtype)
        a, b = x[..., 2 * j], x[..., 2 * j + 1]
        out[..., 2 * j] = c * a + s * b
        out[..., 2 * j + 1] = c * b - s * a
    return out


def reference(q, k, v, table, docs, window, key_offset, xsa=None, gate=None):
    """Dense attention over the whole packed row, with every rule written out."""
    dt = torch.promote_types(q.dtype, torch.float32)
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    Tn, Hn, d_qk = q.shape
    rms = lambda x: x / torch.sqrt(x.square().mean(-1, keepdim=True) + QK_NORM_EPS)
    qn, kn = rms(q), rms(k)
    tok = torch.arange(Tn)
    doc = doc_of_token(docs)
    r = 2 * table.freqs.numel()
    if not table.paired:
        angle = tok[:, None].expand(Tn, Hn)
    else:  # head h of token t rotates by its parity's position: 2t (even heads) or 2t + 1 (odd heads)
        angle = torch.stack([2 * tok + (h % 2) for h in range(Hn)], dim=1)
    qr = ref_rotate(qn, angle, table.freqs, table.factor_dtype)
    kr = ref_rotate(kn, angle, table.freqs, table.factor_dtype)
    if key_offset:  # unrotated key dims from the previous packed token (any document); token 0 its own
        kr = kr.clone()
        kr[1:, :, r:] = kn[:-1, :, r:]
    y = torch.empty(Tn, Hn, v.size(-1), dtype=dt)
    if not table.paired:
        i, j = tok[:, None], tok[None, :]
        mask = (doc[:, None] == doc[None, :]) & (j <= i) & (i - j <= window)
        for h in range(Hn):
            s = (qr[:, h] @ kr[:, h].T) * table.softmax_scale
            y[:, h] = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v[:, h]
    else:  # stream g: position 2t holds token t's head g, position 2t + 1 its head g + H/2
        half = Hn // 2
        pos = torch.arange(2 * Tn)
        pdoc = doc[pos // 2]
        i, j = pos[:, None], pos[None, :]
        mask = (pdoc[:, None] == pdoc[None, :]) & (j <= i) & (i - j <= window)
        for g in range(half):
            token, head = pos // 2, g + (pos % 2) * half  # who sits at each stream position
            qs, ks, vs = qr[token, head], kr[token, head], v[token, head]
            s = (qs @ ks.T) * table.softmax_scale
            y[token, head] = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ vs
    if xsa is not None:  # per token and head: y - tanh(a) <y, v> / max(|v|^2, 1e-8) v
        coef = torch.tanh(xsa.to(dt)) * (y * v).sum(-1) / torch.clamp((v * v).sum(-1), min=1e-8)
        y = y - coef[..., None] * v
    if gate is not None:
        y = y * gate.to(dt)[..., None]
    return y.reshape(Tn, -1)


def case(paired, key_offset, xsa, gate, *, dtype=torch.float32, factor_dtype=torch.float32, seed=0, grow=True,
         tokens=T, heads=H, rotary=R):
    """A table and inputs: d_qk = rotary (fully rotating) or 2 * rotary (key offset needs unrotated dims);
    d_v != d_qk on either side, as the record's 64/128 layers. grow: after one YaRN step, so the frequencies
    and scale are not the step-0 ones."""
    d_qk = 2 * rotary if key_offset else rotary
    d_v = rotary if key_offset else 2 * rotary
    table = YarnRotary(d_qk, rotary, paired=paired, softmax_scale=0.3, factor_dtype=factor_dtype)
    if grow:
        table.apply_window_change(3, 10)
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)
    q, k, v = rand(tokens, heads, d_qk), rand(tokens, heads, d_qk), rand(tokens, heads, d_v)
    a = rand(tokens, heads) if xsa else None
    gt = rand(tokens, heads).sigmoid() if gate else None
    return table, q, k, v, a, gt


def run(table, q, k, v, a, g, docs, window, key_offset, kernel):
    return attend(q, k, v, rotary=table, paired=table.paired, key_offset=key_offset, cu_seqlens=cu_seqlens(docs),
                  window_tokens=window, xsa=a, gate=g, kernel=kernel)


# ---------------------------------------------------------------------------------------------------------------
# Forward: both kernels, every combination, several windows and document layouts.

@pytest.mark.parametrize("paired,key_offset,xsa,gate", COMBOS)
@pytest.mark.parametrize("kernel", ["sdpa", "flex"])
def test_matches_the_dense_reference(paired, key_offset, xsa, gate, kernel):
    table, q, k, v, a, g = case(paired, key_offset, xsa, gate)
    for docs, window in [(DOCS, w) for w in WINDOWS] + [((T,), 5), ((1,) * T, 2)]:
        out = run(table, q, k, v, a, g, docs, window, key_offset, kernel)
        want = reference(q, k, v, table, docs, window, key_offset, a, g)
        assert out.shape == (T, H * v.size(-1)) and out.dtype == v.dtype
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5, msg=f"docs={docs} window={window}")


@pytest.mark.parametrize("paired", [False, True])
def test_flex_block_mask_matches_the_dense_mask(paired):
    """The block summaries: every "full" block pair is all visible, every block pair with a visible key is
    listed, at tiles small enough that all three kinds occur; and the FlexAttention output agrees."""
    n = 2 * T if paired else T
    pdoc = doc_of_token(DOCS).repeat_interleave(2) if paired else doc_of_token(DOCS)
    seg = segment_ids(cu_seqlens(DOCS) * (2 if paired else 1), n)
    assert torch.equal(seg.long(), pdoc)
    # windows 1, 5, 9: the nearest pair of some block pair is exactly `window` apart (one visible pair)
    for window, block in itertools.product((0, 1, 3, 5, 9, 10, 100), (4, 8, 128)):
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        dense = (pdoc[:, None] == pdoc[None, :]) & (j <= i) & (i - j <= window)
        bm = varlen_block_mask(seg, window, block)
        nb = -(-n // block)
        listed = torch.zeros(nb, nb, dtype=torch.bool)
        full = torch.zeros(nb, nb, dtype=torch.bool)
        for counts, idx, into in ((bm.kv_num_blocks, bm.kv_indices, listed),
                                  (bm.full_kv_num_blocks, bm.full_kv_indices, full)):
            for qb in range(nb):
                into[qb, idx[0, 0, qb, :counts[0, 0, qb]].long()] = True
        assert not (listed & full).any()
        kinds = set()
        for qb, kb in itertools.product(range(nb), range(nb)):
            tile = dense[qb * block:(qb + 1) * block, kb * block:(kb + 1) * block]
            if full[qb, kb]:
                assert tile.all(), (window, block, qb, kb)
                kinds.add("full")
            elif tile.any():
                assert listed[qb, kb], (window, block, qb, kb)
                kinds.add("partial")
            else:
                kinds.add("skipped" if not listed[qb, kb] else "partial")
        if block == 4 and window == 10:
            assert kinds == {"full", "partial", "skipped"}
    table, q, k, v, a, g = case(paired, False, True, True)
    qp, kp = prepare_qk(q, k, table, False)
    cu = cu_seqlens(DOCS)
    vp = v
    if paired:
        qp, kp, vp, cu = to_pairs(qp), to_pairs(kp), to_pairs(v), 2 * cu
    for block in (4, 8):
        torch.testing.assert_close(flex_varlen(qp, kp, vp, cu, 10, 0.3, block_size=block),
                                   segment_sdpa(qp, kp, vp, cu, 10, 0.3), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("paired", [False, True])
@pytest.mark.parametrize("kernel", ["sdpa", "flex"])
def test_which_keys_a_query_sees(paired, kernel):
    """Independent of the reference: with q = 0 every visible key weighs the same, and one-hot values name the
    stream positions, so the output is 1/count on exactly the keys i - window <= j <= i of the query's document
    (window + 1 keys where the document allows). Paired: position 2t + h // (H/2) of stream h % (H/2)."""
    window, docs = 3, (5, 9)
    n_tok = sum(docs)
    n = 2 * n_tok if paired else n_tok
    table = YarnRotary(R, R, paired=paired, softmax_scale=0.5, factor_dtype=torch.float32)
    q = torch.zeros(n_tok, H, R)
    k = torch.randn(n_tok, H, R)
    v = torch.zeros(n_tok, H, n)
    for t in range(n_tok):
        for h in range(H):
            v[t, h, 2 * t + h // (H // 2) if paired else t] = 1
    y = run(table, q, k, v, None, None, docs, window, False, kernel).view(n_tok, H, n)
    starts = [0, docs[0] * (2 if paired else 1)]
    for t in range(n_tok):
        for h in range(H):
            p = 2 * t + h // (H // 2) if paired else t
            first = max(s for s in starts if s <= p)
            visible = list(range(max(first, p - window), p + 1))
            want = torch.zeros(n)
            want[visible] = 1 / len(visible)
            torch.testing.assert_close(y[t, h], want, msg=f"t={t} h={h}")
    assert len(visible) == window + 1


def test_bf16_inputs_keep_their_dtype():
    """The GPU path's dtype: bf16 in, bf16 out, near the fp32 reference; with the record's bf16 cos/sin."""
    table, q, k, v, a, g = case(True, False, True, True, dtype=torch.bfloat16, factor_dtype=torch.bfloat16)
    out = run(table, q, k, v, a, g, DOCS, 10, False, "sdpa")
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference(q, k, v, table, DOCS, 10, False, a, g), rtol=0.05, atol=0.05)


def test_record_factor_rounding():
    """cos/sin rounded to bf16 as the record's tables are: the core and the reference agree to fp32 precision
    only when both round (the rounding matters at that precision)."""
    table, q, k, v, a, g = case(False, True, False, False, factor_dtype=torch.bfloat16)
    out = run(table, q, k, v, a, g, DOCS, 10, True, "sdpa")
    torch.testing.assert_close(out, reference(q, k, v, table, DOCS, 10, True), rtol=1e-5, atol=1e-5)
    table.factor_dtype = torch.float32
    unrounded = reference(q, k, v, table, DOCS, 10, True)
    assert (out - unrounded).abs().max() > 1e-4


def test_sdpa_query_chunks():
    """The CPU kernel's query chunks (each over the keys its window reaches) change nothing."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(T, 2, d, generator=g) for d in (8, 8, 16))
    cu = cu_seqlens(DOCS)
    for window, chunk in itertools.product((0, 2, 5, 100), (1, 3, 7)):
        torch.testing.assert_close(segment_sdpa(q, k, v, cu, window, 0.3, query_chunk=chunk),
                                   segment_sdpa(q, k, v, cu, window, 0.3, query_chunk=T), rtol=1e-6, atol=1e-6)


def test_flex_path_traces_into_one_graph():
    """The GPU path compiles attend(): dynamo traces it whole (fullgraph, no data-dependent breaks), here with the
    eager backend on the CPU, and the traced forward equals the untraced one."""
    table = YarnRotary(2 * R, R, paired=True, softmax_scale=0.3, factor_dtype=torch.float32)
    _, q, k, v, a, g = case(True, True, True, True)
    fn = lambda q, k, v, a, g: run(table, q, k, v, a, g, DOCS, 10, True, "flex")
    torch._dynamo.reset()
    try:
        traced = torch.compile(fn, backend="eager", fullgraph=True)
        torch.testing.assert_close(traced(q, k, v, a, g), fn(q, k, v, a, g), rtol=0, atol=0)
    finally:
        torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------------------------
# Gradients.

@pytest.mark.parametrize("paired,key_offset,xsa,gate", COMBOS)
def test_gradients_match_the_reference(paired, key_offset, xsa, gate):
    table, q, k, v, a, g = case(paired, key_offset, xsa, gate, seed=1)
    leaves = [x.requires_grad_() for x in (q, k, v, a, g) if x is not None]
    weights = torch.randn(T, H * v.size(-1), generator=torch.Generator().manual_seed(2))
    got = torch.autograd.grad((run(table, q, k, v, a, g, DOCS, 10, key_offset, "sdpa") * weights).sum(), leaves)
    want = torch.autograd.grad((reference(q, k, v, table, DOCS, 10, key_offset, a, g) * weights).sum(), leaves)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("paired,key_offset", list(itertools.product([False, True], repeat=2)))
def test_gradcheck_float64(paired, key_offset):
    docs = (3, 1, 4)
    table, q, k, v, a, g = case(paired, key_offset, True, True, dtype=torch.float64, seed=3, tokens=sum(docs),
                                rotary=4)
    inputs = tuple(x.requires_grad_() for x in (q, k, v, a, g))
    fn = lambda q, k, v, a, g: run(table, q, k, v, a, g, docs, 2, key_offset, "sdpa")
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-4, fast_mode=True)


# ---------------------------------------------------------------------------------------------------------------
# Rotary frequencies and YaRN.

@pytest.mark.parametrize("rotary_dim", [64, 8])
def test_rotary_frequencies(rotary_dim):
    half = rotary_dim // 2
    want = torch.tensor([1024.0 ** (-i / (half - 1)) for i in range(half)], dtype=torch.float64)
    table = YarnRotary(rotary_dim, rotary_dim, paired=False, softmax_scale=0.13)
    torch.testing.assert_close(table.freqs.double(), want, rtol=1e-6, atol=0)
    if rotary_dim == 64:  # the record's w_i = 1024^(-i/31)
        assert table.freqs[31].item() == pytest.approx(1 / 1024, rel=1e-6)


def test_paired_relative_angle():
    """Within a shared stream, two tokens t, s are rotated 2(t - s) apart: q.k is unchanged when both move."""
    table = YarnRotary(R, R, paired=True, softmax_scale=0.13, factor_dtype=torch.float32)
    x = torch.randn(1, 1, R).expand(12, 4, R).contiguous()
    rot = table.rotate(x)
    dot = lambda t, s, h1, h2: (rot[t, h1] * rot[s, h2]).sum()
    # heads 0 and 2 share stream 0 and rotate by 2t; heads 1 and 3 by 2t + 1
    assert torch.allclose(dot(5, 2, 0, 2), dot(9, 6, 2, 0), atol=1e-5)
    assert torch.allclose(rot[3, 0], rot[3, 2]) and torch.allclose(rot[3, 1], rot[3, 3])
    plain = YarnRotary(R, R, paired=False, softmax_scale=0.13, factor_dtype=torch.float32).rotate(x)
    assert torch.allclose(rot[3, 0], plain[6, 0], atol=1e-6) and torch.allclose(rot[3, 1], plain[7, 0], atol=1e-6)


def yarn_by_hand(freqs, scale, old, new):
    """RECORD.md section 3's formula in Python floats."""
    out = []
    for w in freqs:
        rho = old * w / (2 * math.pi)
        gamma = min(max((rho - 1) / 31, 0.0), 1.0)
        out.append(w * (old / new + gamma * (1 - old / new)))
    return out, scale * (1 + 0.2 * math.log(new / old))


def test_yarn_updates_follow_the_formula():
    """The record's window changes (blocks of 128 tokens): short 1 -> 3 -> 5 -> 6, long 3 -> 7 -> 11 -> 13, none
    for the final 13 -> 20; the final scales are RECORD.md's 0.1811 and 0.1120."""
    rot = RecordRotaries(128)
    short, long = [128, 384, 640, 768], [384, 896, 1408, 1664]
    by_hand = {"narrow": ([1024.0 ** (-i / 31) for i in range(32)], 0.13), "wide": None}
    by_hand["wide"] = (list(by_hand["narrow"][0]), 0.085)
    for step in range(3):
        rot.apply_window_change((short[step], short[step + 1]), (long[step], long[step + 1]))
        by_hand["narrow"] = yarn_by_hand(*by_hand["narrow"], short[step], short[step + 1])
        by_hand["wide"] = yarn_by_hand(*by_hand["wide"], long[step], long[step + 1])
        for name, table in (("narrow", rot.narrow), ("paired", rot.paired), ("wide", rot.wide)):
            freqs, scale = by_hand["wide" if name == "wide" else "narrow"]
            want = torch.tensor(freqs, dtype=torch.float64)
            torch.testing.assert_close(table.freqs.double(), want, rtol=2e-6, atol=0)
            assert table.softmax_scale == pytest.approx(scale, rel=1e-12)
    assert rot.narrow.softmax_scale == pytest.approx(0.1811, abs=5e-5)
    assert rot.wide.softmax_scale == pytest.approx(0.1120, abs=5e-5)
    # the lowest frequencies interpolate fully, the highest not at all
    w0 = 1024.0 ** (-31 / 31)
    assert rot.wide.freqs[-1].item() == pytest.approx(w0 * 384 / 1664, rel=1e-5)
    assert rot.wide.freqs[0].item() == 1.0


def test_reset_and_state_dict():
    rot = RecordRotaries(16)
    fresh = {name: t.freqs.clone() for name, t in rot.named_children()}
    rot.apply_window_change((128, 384), (384, 896))
    assert not torch.equal(rot.wide.freqs, fresh["wide"]) and rot.wide.softmax_scale > WIDE_SOFTMAX_SCALE
    state = rot.state_dict()
    other = RecordRotaries(16)
    other.load_state_dict(state)
    for name in fresh:
        assert torch.equal(getattr(other, name).freqs, getattr(rot, name).freqs)
        assert getattr(other, name).softmax_scale == getattr(rot, name).softmax_scale
    address = rot.wide.freqs.data_ptr()
    rot.reset()
    assert rot.wide.freqs.data_ptr() == address
    for name, t in rot.named_children():
        assert torch.equal(t.freqs, fresh[name])
    assert rot.narrow.softmax_scale == rot.paired.softmax_scale == NARROW_SOFTMAX_SCALE
    assert rot.wide.softmax_scale == WIDE_SOFTMAX_SCALE


def test_window_change_routes_to_the_tables():
    rot = RecordRotaries(16)
    rot.apply_window_change((128, 128), (384, 896))  # only the long window moved
    assert rot.narrow.softmax_scale == rot.paired.softmax_scale == NARROW_SOFTMAX_SCALE
    assert rot.wide.softmax_scale > WIDE_SOFTMAX_SCALE
    assert rot.table(8, True) is rot.paired and rot.table(8, False) is rot.narrow and rot.table(16, False) is rot.wide
    with pytest.raises(ValueError, match="no rotary table"):
        rot.table(16, True)


# ---------------------------------------------------------------------------------------------------------------
# Bad input.

def test_bad_input_names_the_argument():
    table, q, k, v, a, g = case(False, False, False, False)
    ok = dict(rotary=table, paired=False, key_offset=False, cu_seqlens=cu_seqlens(DOCS), window_tokens=3)
    attend(q, k, v, **ok)
    bad = [
        (dict(cu_seqlens=cu_seqlens(DOCS).long()), "cu_seqlens"),
        (dict(cu_seqlens=torch.tensor([0, 5, 3, T], dtype=torch.int32)), "cu_seqlens"),
        (dict(cu_seqlens=torch.tensor([0, 5], dtype=torch.int32)), "cu_seqlens"),
        (dict(paired=True), "paired"),
        (dict(key_offset=True), "key_offset"),
        (dict(window_tokens=-1), "window_tokens"),
        (dict(xsa=torch.zeros(T, H + 1)), "xsa"),
        (dict(gate=torch.zeros(T)), "gate"),
        (dict(kernel="fa3"), "kernel"),
        (dict(rotary=YarnRotary(16, 8, paired=False, softmax_scale=0.1)), "rotary"),
    ]
    for change, word in bad:
        with pytest.raises(ValueError, match=word):
            attend(q, k, v, **{**ok, **change})
    with pytest.raises(ValueError, match="v must be"):
        attend(q, k, v[:, :2], **ok)
    for qk_dim, rotary_dim in ((8, 2), (8, 5), (8, 10)):
        with pytest.raises(ValueError, match="rotary_dim"):
            YarnRotary(qk_dim, rotary_dim, paired=False, softmax_scale=0.1)
