"""Causal self-attention and its masks: dense causal, or sliding-window with document masking.

Dense causal attention is F.scaled_dot_product_attention(is_causal=True) on every device.

Sliding-window document-masked attention (the modded-nanogpt records from November 2024 on):
query q may attend to key k when
  k <= q                                  (causal)
  doc[k] == doc[q]                        (same document: doc = number of BOS tokens up to and
                                           including the position, so a BOS starts a document)
  q // block - k // block < window_blocks (block-granular sliding window; the window grows
                                           during training, see model.optim.attention_window_blocks)
Every query sees at least itself, so no row of the mask is empty.
Two implementations of exactly this mask:
  * GPU path: FlexAttention with a BlockMask built from block-level summaries of the documents
    (which key blocks are skipped, fully visible, or need the token-level mask_mod);
  * otherwise: SDPA with the explicit (B, 1, T, T) boolean mask (slow for long sequences, exact).
tests/test_model_backbone.py checks that both give the same outputs (FlexAttention also runs,
unfused, on the CPU).

Compilation (GPU path). compile_attention(), called once at model set-up, compiles flex_attention
and the BlockMask builder. Inside a compiled block (GPT.compile_regions) or model, dynamo traces
flex_attention and the builder into the caller's graph instead (nothing is compiled inside a
compiled region); outside one, the compiled forms run. The mask is built once per forward (one
batch), by the compiled builder: a few fused kernels, not dozens of eager ones. A new BlockMask
each step (its mask_mod a new closure, the window a tensor) does not recompile the blocks.
"""
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from model.device import gpu_paths_enabled, torch_compile

# GPT-2's <|endoftext|> (id 50256): FineWeb shards put it before every document.
BOS_ID = 50256
# FlexAttention's tile (the records' BLOCK_SIZE): the window grows in steps of this many tokens.
ATTN_BLOCK_SIZE = 128

_compiled = {}  # "flex", "block_mask": their torch.compile'd forms, set by compile_attention()


def document_ids(idx: torch.Tensor, bos_id: int) -> torch.Tensor:
    """(B, T) document index of each position: BOS tokens seen up to and including it."""
    return (idx == bos_id).cumsum(dim=1, dtype=torch.int32)


def window_mask(idx: torch.Tensor, window_blocks: torch.Tensor, block_size: int, bos_id: int) -> torch.Tensor:
    """The explicit (B, 1, T, T) boolean mask (True = attend) of windowed document attention."""
    T = idx.size(1)
    docs = document_ids(idx, bos_id)
    pos = torch.arange(T, device=idx.device)
    q, k = pos[:, None], pos[None, :]
    allowed = (k <= q) & ((q // block_size - k // block_size) < window_blocks)
    return (allowed & (docs[:, :, None] == docs[:, None, :])).unsqueeze(1)


def _dense_to_kv_blocks(dense: torch.Tensor):
    """(B, nq, nk) bool block map -> FlexAttention's (counts (B, 1, nq), indices (B, 1, nq, nk))."""
    counts = dense.sum(dim=-1, dtype=torch.int32)
    indices = dense.to(torch.int8).argsort(dim=-1, descending=True, stable=True).to(torch.int32)
    return counts.unsqueeze(1).contiguous(), indices.unsqueeze(1).contiguous()


def window_block_mask(idx: torch.Tensor, window_blocks: torch.Tensor, block_size: int, bos_id: int) -> BlockMask:
    """FlexAttention BlockMask of windowed document attention for inputs idx (B, T)."""
    B, T = idx.shape
    docs = document_ids(idx, bos_id)
    n_blocks = T // block_size
    first, last = docs[:, ::block_size], docs[:, block_size - 1::block_size]  # (B, n_blocks)
    blk = torch.arange(n_blocks, device=idx.device)
    qb, kb = blk[:, None], blk[None, :]
    in_window = (qb - kb) < window_blocks
    # documents are nondecreasing along a row: two blocks share one iff their ranges overlap
    share_doc = (first[:, :, None] <= last[:, None, :]) & (first[:, None, :] <= last[:, :, None])
    one_doc = first == last
    same_single_doc = one_doc[:, :, None] & one_doc[:, None, :] & (first[:, :, None] == first[:, None, :])
    visible = (kb <= qb) & in_window & share_doc             # some pair in the block pair attends
    full = (kb < qb) & in_window & same_single_doc           # every pair attends: no mask_mod needed
    partial_counts, partial_idx = _dense_to_kv_blocks(visible & ~full)
    full_counts, full_idx = _dense_to_kv_blocks(full)

    def mask_mod(b, h, q_idx, kv_idx):
        in_win = (q_idx // block_size - kv_idx // block_size) < window_blocks
        return (kv_idx <= q_idx) & in_win & (docs[b, q_idx] == docs[b, kv_idx])

    return BlockMask.from_kv_blocks(partial_counts, partial_idx, full_counts, full_idx,
                                    BLOCK_SIZE=block_size, mask_mod=mask_mod)


def compile_attention() -> None:
    """On the GPU path, compile flex_attention and window_block_mask once (idempotent; lazy:
    torch.compile builds each graph at its first call). A no-op off the GPU path."""
    if gpu_paths_enabled() and not _compiled:
        _compiled["flex"] = torch_compile(flex_attention)
        _compiled["block_mask"] = torch_compile(window_block_mask)


def flex_attention_op(q, k, v, block_mask: BlockMask) -> torch.Tensor:
    """flex_attention on (B, H, T, hd) tensors: traced into the caller's graph inside a compiled
    region, compiled on the GPU path (compile_attention), eager (unfused) otherwise."""
    if torch.compiler.is_compiling():
        return flex_attention(q, k, v, block_mask=block_mask)
    if q.is_cuda and "flex" in _compiled:
        return _compiled["flex"](q, k, v, block_mask=block_mask)
    with warnings.catch_warnings():  # eager flex warns that it is unfused; on CPU that is the point
        warnings.simplefilter("ignore", UserWarning)
        return flex_attention(q, k, v, block_mask=block_mask)


def build_mask(idx: torch.Tensor, window_blocks: torch.Tensor | None, block_size: int, bos_id: int):
    """The mask object `attend` takes: None (dense causal, when window_blocks is None), a
    FlexAttention BlockMask (GPU path) or a boolean (B, 1, T, T) tensor (otherwise)."""
    if window_blocks is None:
        return None
    if idx.size(1) % block_size:
        raise ValueError(f"windowed attention needs seq_len divisible by attn_block_size={block_size}, "
                         f"got {idx.size(1)}")
    if gpu_paths_enabled() and idx.is_cuda:
        compiled = _compiled.get("block_mask") if not torch.compiler.is_compiling() else None
        return (compiled or window_block_mask)(idx, window_blocks, block_size, bos_id)
    return window_mask(idx, window_blocks, block_size, bos_id)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor:
    """(B, T, H, hd) q, k, v and a build_mask() mask -> (B, T, H * hd) attention output."""
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if mask is None:
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif isinstance(mask, BlockMask):
        y = flex_attention_op(q, k, v, mask)
    else:
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return y.transpose(1, 2).flatten(2)
