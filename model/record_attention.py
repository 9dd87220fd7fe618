"""The record arch's attention core: everything between the Q/K/V projections and the output projection.

The model core (model/record_gpt.py) projects Q, K, V (V including its value embedding) and applies O
and the l_qkv / l_o scalars; attend() does the rest, in this order (the record's model/attention.py
CausalSelfAttention.forward and perf/kernels/qkv_rope.py):

 1. QK norm: per-head RMS over d_qk, in fp32, eps 1.19e-7, no gain.
 2. Rotary (model/yarn.py): the first rotary_dim dims of each head, adjacent pairs. Steps 1-3 run in fp32
    and leave q, k in their input dtype (the record's fused kernel computes in fp32 and stores bf16).
 3. Partial key offset (key_offset=True; the record's layers 3, 10): a key's dims from rotary_dim on
    (unrotated) are the previous packed token's normed key dims, same head; token 0 keeps its own.
    It ignores document boundaries. Its backward (each token's dims past rotary_dim get the next
    token's gradient, token 0 its own plus the next's) follows by autograd. It acts before pairing, so
    with paired heads too (the record never combines the two: its kernel asserts not both).
 4. Paired heads (paired=True; the record's layers 0, 2, 5): token t's heads h < H/2 go to position 2t,
    heads h >= H/2 to position 2t+1, as head h % (H/2) of an H/2-head stream of 2T positions, so heads
    h and h + H/2 share keys (with 4 heads: 0 & 2, 1 & 3). Every segment doubles (cu_seqlens x 2) and the
    window counts positions. The rotary angle of head h is that of position 2t + h % 2 (its parity,
    not its stream position), so within a shared stream two tokens t, s are 2(t - s) apart.
 5. Attention over the packed varlen rows: a query sees the keys of its own segment (cu_seqlens) that
    are at most `window_tokens` before it, itself included. That is FA3's causal window (ws, 0), the
    record's flash_attn_varlen_func(window_size=(bm_size, 0)) with bm_size = window blocks * 128:
        query i sees key j  iff  seg[j] == seg[i]  and  i - window_tokens <= j <= i
    so up to window_tokens + 1 keys. Paired: i, j are stream positions 2t + a, the window too, the same
    window_tokens the record passes its paired layers (in tokens about half of it).
    Softmax scale: rotary.softmax_scale (0.13 / 0.085 at step 0, grown by YaRN).
 6. XSA (xsa (T, H) given; the record's layers 1, 3): y <- y - tanh(a) * (<y, v> / max(|v|^2, 1e-8)) * v per
    token and head, v the head's own value (including the value embedding). The record applies it on
    non-paired layers only; here it is the same per-token formula on paired ones too.
 7. Output gate (gate (T, H) given; the record's layers 3, 10): y <- g * y per token and head.

Two kernels for step 5, with the same mask:
  "sdpa" (CPU, and the default off the GPU path): exact masked SDPA per segment, in chunks of queries over
    the keys their window reaches (memory ~ chunk * (chunk + window), never a T^2 mask).
  "flex" (default on the GPU path, model.device.gpu_paths_enabled()): FlexAttention with a block mask of
    (same segment) & causal & window, built from per-block summaries (no T^2 mask); compiled on CUDA,
    eager (unfused, forward only) on the CPU, where the tests compare it with "sdpa".
The record's patched FA3 varlen build is not used (it is a CUDA binary outside the package registries).

Interface (the contract's, plus the `kernel` switch):
    attend(q (T,H,dqk), k (T,H,dqk), v (T,H,dv), *, rotary, paired, key_offset, cu_seqlens (S+1,) int32,
           window_tokens, xsa=None, gate=None, kernel=None) -> (T, H*dv) in v's dtype
`paired` must equal rotary.paired (the rotary table is per pairing). cu_seqlens: segment boundaries from 0
to T, nondecreasing; repeated trailing T (the record's fixed-size padded table) are empty segments.
The attention-specific constants live here and in model/yarn.py; the layer topology (which layers are
paired, long-window, wide-qk, half-v) is the model core's.
"""
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from model.device import gpu_paths_enabled, torch_compile
from model.yarn import YarnRotary

# QK norm's eps: F.rms_norm's fp32 eps (the record's perf/kernels/qkv_rope.py: 1.1920928955078125e-7).
QK_NORM_EPS = torch.finfo(torch.float32).eps
# XSA's floor on |v|^2 (the record's model/attention.py: clamp_min(1e-8)).
XSA_MIN_VALUE_NORM2 = 1e-8
# FlexAttention's tile on the GPU path (the record's BLOCK_SIZE, config.py: 128).
FLEX_BLOCK_SIZE = 128
# Queries per masked SDPA call on the CPU path: bounds its score matrix to chunk x (chunk + window).
SDPA_QUERY_CHUNK = 512
KERNELS = ("sdpa", "flex")

_compiled_flex = []  # torch.compile'd flex_attention, made at the first CUDA call on the GPU path


def qk_norm(x: torch.Tensor) -> torch.Tensor:
    """Per-head RMS norm over the last dim, in fp32 (or wider: float64 stays float64), no gain (the record's
    fused norm/rotary kernel)."""
    return F.rms_norm(x.to(torch.promote_types(x.dtype, torch.float32)), (x.size(-1),), eps=QK_NORM_EPS)


def prepare_qk(q, k, rotary: YarnRotary, key_offset: bool):
    """QK norm, rotary and the partial key offset of (T, H, dqk) q and k; returned in q's dtype."""
    q_out = rotary.rotate(qk_norm(q))
    k_normed = qk_norm(k)
    k_out = rotary.rotate(k_normed)
    if key_offset:
        r = rotary.rotary_dim
        shifted = torch.cat((k_normed[:1, :, r:], k_normed[:-1, :, r:]))  # token 0 keeps its own
        k_out = torch.cat((k_out[..., :r], shifted), dim=-1)
    return q_out.to(q.dtype), k_out.to(k.dtype)


def to_pairs(x: torch.Tensor) -> torch.Tensor:
    """(T, H, d) -> (2T, H/2, d): token t's head h to position 2t + h // (H/2), head h % (H/2)."""
    T, H, d = x.shape
    return x.reshape(2 * T, H // 2, d)


def from_pairs(y: torch.Tensor) -> torch.Tensor:
    """The inverse of to_pairs: (2T, H/2, d) -> (T, H, d)."""
    n, half, d = y.shape
    return y.reshape(n // 2, 2 * half, d)


def segment_sdpa(q, k, v, cu_seqlens: torch.Tensor, window: int, scale: float,
                 query_chunk: int = SDPA_QUERY_CHUNK) -> torch.Tensor:
    """Exact attention over packed segments: (n, h, d) q, k and (n, h, dv) v -> (n, h, dv). One masked SDPA per
    chunk of up to `query_chunk` queries of a segment, over the keys its window can reach: the chunk's own and
    the `window` before it, within the segment (memory ~ chunk * (chunk + window), at most segment^2)."""
    bounds = cu_seqlens.tolist()
    outs = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        for lo in range(start, end, query_chunk):
            hi = min(lo + query_chunk, end)
            first_key = max(start, lo - window)
            qs = q[lo:hi].transpose(0, 1)  # (h, queries, d)
            ks, vs = k[first_key:hi].transpose(0, 1), v[first_key:hi].transpose(0, 1)
            gap = torch.arange(lo, hi, device=q.device)[:, None] - torch.arange(first_key, hi, device=q.device)
            mask = (gap >= 0) & (gap <= window)
            outs.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale).transpose(0, 1))
    return torch.cat(outs)


def segment_ids(cu_seqlens: torch.Tensor, n: int) -> torch.Tensor:
    """(n,) int32 segment index of each position 0..n-1 (cu_seqlens' empty segments get no positions)."""
    pos = torch.arange(n, dtype=cu_seqlens.dtype, device=cu_seqlens.device)
    return (torch.searchsorted(cu_seqlens, pos, right=True) - 1).to(torch.int32)


def _kv_blocks(dense: torch.Tensor):
    """(nq, nk) bool block map -> FlexAttention's (counts (1, 1, nq), indices (1, 1, nq, nk)), visible blocks first."""
    counts = dense.sum(dim=-1, dtype=torch.int32)
    indices = dense.to(torch.int8).argsort(dim=-1, descending=True, stable=True).to(torch.int32)
    return counts[None, None].contiguous(), indices[None, None].contiguous()


def varlen_block_mask(segments: torch.Tensor, window: int, block_size: int = FLEX_BLOCK_SIZE) -> BlockMask:
    """FlexAttention BlockMask of step 5's mask over n positions with segment ids `segments` (n,),
    nondecreasing. A key block is skipped when no pair of the block pair attends, "full" (no mask_mod)
    when every pair does, else partial (mask_mod per element)."""
    n = segments.numel()
    n_blocks = -(-n // block_size)
    start = torch.arange(n_blocks, device=segments.device) * block_size  # first position of each block
    stop = torch.clamp(start + block_size, max=n) - 1                     # last position of each block
    first, last = segments[start], segments[stop]
    qb, kb = torch.arange(n_blocks, device=segments.device)[:, None], torch.arange(n_blocks, device=segments.device)
    # segments are nondecreasing: the two blocks share one iff their ranges of ids overlap
    share = (first[:, None] <= last[None, :]) & (first[None, :] <= last[:, None])
    one_segment = (first == last)[:, None] & (first == last)[None, :] & (first[:, None] == first[None, :])
    nearest_gap = start[:, None] - stop[None, :]   # the closest query-key pair's distance
    farthest_gap = stop[:, None] - start[None, :]  # the farthest pair's
    visible = (kb <= qb) & (nearest_gap <= window) & share
    full = (kb < qb) & (farthest_gap <= window) & one_segment
    partial_counts, partial_idx = _kv_blocks(visible & ~full)
    full_counts, full_idx = _kv_blocks(full)

    def mask_mod(b, h, q_idx, kv_idx):
        gap = q_idx - kv_idx
        return (gap >= 0) & (gap <= window) & (segments[q_idx] == segments[kv_idx])

    return BlockMask.from_kv_blocks(partial_counts, partial_idx, full_counts, full_idx, BLOCK_SIZE=block_size,
                                    mask_mod=mask_mod, seq_lengths=(n, n))


def flex_varlen(q, k, v, cu_seqlens: torch.Tensor, window: int, scale: float,
                block_size: int = FLEX_BLOCK_SIZE) -> torch.Tensor:
    """segment_sdpa's result by FlexAttention: compiled on CUDA on the GPU path, traced into the caller's
    graph inside a compiled region, eager (unfused; torch has no CPU backward for it) otherwise."""
    block_mask = varlen_block_mask(segment_ids(cu_seqlens, q.size(0)), window, block_size)
    qh, kh, vh = (x.transpose(0, 1)[None] for x in (q, k, v))  # (1, h, n, d)
    if torch.compiler.is_compiling():
        y = flex_attention(qh, kh, vh, block_mask=block_mask, scale=scale)
    elif q.is_cuda and gpu_paths_enabled():
        if not _compiled_flex:
            _compiled_flex.append(torch_compile(flex_attention))
        y = _compiled_flex[0](qh, kh, vh, block_mask=block_mask, scale=scale)
    else:
        with warnings.catch_warnings():  # eager flex warns that it is unfused: off the GPU that is the point
            warnings.simplefilter("ignore", UserWarning)
            y = flex_attention(qh, kh, vh, block_mask=block_mask, scale=scale)
    return y[0].transpose(0, 1)


def apply_xsa(y: torch.Tensor, v: torch.Tensor, strength: torch.Tensor) -> torch.Tensor:
    """y - tanh(a) * (<y, v> / max(|v|^2, 1e-8)) * v per token and head; y, v (T, H, dv), strength a (T, H)."""
    dot = (y * v).sum(-1, keepdim=True)
    norm2 = v.square().sum(-1, keepdim=True).clamp_min(XSA_MIN_VALUE_NORM2)
    return y - torch.tanh(strength).to(y.dtype)[..., None] * (dot / norm2) * v


def _check(q, k, v, rotary, paired, key_offset, cu_seqlens, window_tokens, xsa_strength, gate, kernel):
    if q.ndim != 3 or k.shape != q.shape:
        raise ValueError(f"attend: q and k must both be (T, H, d_qk), got {tuple(q.shape)} and {tuple(k.shape)}")
    T, H, d_qk = q.shape
    if T == 0:
        raise ValueError("attend: no tokens (T = 0)")
    if v.ndim != 3 or v.shape[:2] != (T, H):
        raise ValueError(f"attend: v must be (T={T}, H={H}, d_v), got {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        raise ValueError(f"attend: q, k, v must share one float dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not isinstance(rotary, YarnRotary) or rotary.qk_dim != d_qk:
        raise ValueError(f"attend: rotary must be a YarnRotary of width d_qk={d_qk}, got {rotary!r}")
    if paired != rotary.paired:
        raise ValueError(f"attend: paired={paired} but the rotary table has paired={rotary.paired}")
    if paired and H % 2:
        raise ValueError(f"attend: paired heads need an even head count, got H={H}")
    if key_offset and d_qk <= rotary.rotary_dim:
        raise ValueError(f"attend: key_offset shifts the unrotated dims, but all {d_qk} dims rotate")
    if not isinstance(window_tokens, int) or window_tokens < 0:
        raise ValueError(f"attend: window_tokens must be an int >= 0, got {window_tokens!r}")
    for name, t in (("xsa", xsa_strength), ("gate", gate)):
        if t is not None and t.shape != (T, H):
            raise ValueError(f"attend: {name} must be (T={T}, H={H}) or None, got {tuple(t.shape)}")
    if kernel not in KERNELS:
        raise ValueError(f"attend: kernel must be one of {KERNELS} or None, got {kernel!r}")
    if cu_seqlens.ndim != 1 or cu_seqlens.dtype != torch.int32 or cu_seqlens.numel() < 2:
        raise ValueError(f"attend: cu_seqlens must be (S+1,) int32 with S >= 1, got {tuple(cu_seqlens.shape)} "
                         f"{cu_seqlens.dtype}")
    if not cu_seqlens.is_cuda and not torch.compiler.is_compiling():  # contents only where reading costs no sync
        bounds = cu_seqlens.tolist()
        if bounds[0] != 0 or bounds[-1] != T or any(b < a for a, b in zip(bounds[:-1], bounds[1:])):
            raise ValueError(f"attend: cu_seqlens must rise from 0 to T={T} without falling, got {bounds}")


def attend(q, k, v, *, rotary: YarnRotary, paired: bool, key_offset: bool, cu_seqlens: torch.Tensor,
           window_tokens: int, xsa: torch.Tensor | None = None, gate: torch.Tensor | None = None,
           kernel: str | None = None) -> torch.Tensor:
    """The attention core (see the module docstring): (T, H, d_qk) q, k, (T, H, d_v) v -> (T, H * d_v).
    kernel: "sdpa" or "flex"; None picks "flex" for CUDA tensors on the GPU path, else "sdpa"."""
    if kernel is None:
        kernel = "flex" if q.is_cuda and gpu_paths_enabled() else "sdpa"
    _check(q, k, v, rotary, paired, key_offset, cu_seqlens, window_tokens, xsa, gate, kernel)
    T, H, d_v = v.shape
    q, k = prepare_qk(q, k, rotary, key_offset)
    qa, ka, va, cu = q, k, v, cu_seqlens
    if paired:
        qa, ka, va, cu = to_pairs(q), to_pairs(k), to_pairs(v), 2 * cu_seqlens
    core = segment_sdpa if kernel == "sdpa" else flex_varlen
    y = core(qa, ka, va, cu, window_tokens, rotary.softmax_scale)
    if paired:
        y = from_pairs(y)
    if xsa is not None:
        y = apply_xsa(y, v, xsa)
    if gate is not None:
        y = y * gate.to(y.dtype)[..., None]
    return y.reshape(T, H * d_v)
