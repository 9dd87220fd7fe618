"""A key/value cache for generation: the model's forward over new positions only, both archs.

`forward_cached(model, idx, hints, cache)` runs GPT.forward's computation for the tokens idx
(1, T) that follow the cache's `length` positions, with the model's own modules and weights,
writing their keys and values into the cache and attending to every cached position. It gives
the logits GPT.forward would give at those positions over the whole sequence (tests compare
them for every backbone feature and both archs). Rotary and learned position embeddings take
absolute positions; windowed document attention builds its mask from the cached tokens.
`cache.truncate(n)` forgets positions n.. (the rejected part of a drafted run).
"""
import torch
import torch.nn.functional as F

from model.gpt import GPT, rms_norm
from model.hint_embedding import INJECT_EMBED, INJECT_HEAD, INJECT_MIDDLE


class KVCache:
    """Keys and values of every attention layer for up to `max_len` positions of one sequence."""

    def __init__(self, model: GPT, max_len: int | None = None):
        cfg = model.cfg
        self.max_len = max_len or cfg.max_seq_len
        p = next(model.parameters())
        shape = (1, self.max_len, cfg.n_head, cfg.n_embd // cfg.n_head)
        has_attn = [cfg.arch == "gpt2" or block.has_attention for block in model.blocks]
        self.k = [torch.zeros(shape, dtype=p.dtype, device=p.device) if a else None for a in has_attn]
        self.v = [torch.zeros(shape, dtype=p.dtype, device=p.device) if a else None for a in has_attn]
        self.tokens = torch.zeros(1, self.max_len, dtype=torch.long, device=p.device)
        self.length = 0

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.length:
            raise ValueError(f"truncate({n}): the cache holds {self.length} positions")
        self.length = n


def _rotate(rotary, x, pos0):
    """Rotary.forward for positions pos0.. (x: (1, T, H, hd)): in float32, returned in x's dtype."""
    T = x.size(1)
    cos, sin = rotary.cos[pos0:pos0 + T], rotary.sin[pos0:pos0 + T]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1).type_as(x)


def _mask(model, cache, pos0, T):
    """(1, 1, T, pos0 + T) boolean: which cached keys each new query attends to."""
    cfg = model.cfg
    n = pos0 + T
    q = torch.arange(pos0, n, device=cache.tokens.device)[:, None]
    k = torch.arange(n, device=cache.tokens.device)[None, :]
    allowed = k <= q
    if cfg.arch == "speedrun" and cfg.window_attn:
        bs = cfg.attn_block_size
        docs = (cache.tokens[0, :n] == cfg.bos_id).cumsum(0)
        allowed = allowed & ((q // bs - k // bs) < model.window_blocks) & (docs[pos0:n, None] == docs[None, :])
    return allowed[None, None]


def _attend_cached(q, k_new, v_new, cache, layer, pos0, mask):
    T = q.size(1)
    cache.k[layer][:, pos0:pos0 + T] = k_new
    cache.v[layer][:, pos0:pos0 + T] = v_new
    keys, values = cache.k[layer][:, :pos0 + T], cache.v[layer][:, :pos0 + T]
    y = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask)
    return y.transpose(1, 2).flatten(2)


def _speedrun_block(block, x, x0, ve, cache, layer, pos0, mask):
    if block.embed_mix is not None:
        x = block.embed_mix[0] * x + block.embed_mix[1] * x0
    if block.has_attention:
        h = rms_norm(x)
        heads = (*h.shape[:2], block.n_head, -1)
        v = block.v(h)  # one dtype into attention, v's (SpeedrunBlock.forward)
        q = _rotate(block.rotary, rms_norm(block.q(h).view(heads)), pos0).type_as(v)
        k = _rotate(block.rotary, rms_norm(block.k(h).view(heads)), pos0).type_as(v)
        if block.value_mix is not None:
            v = block.value_mix[0] * v if ve is None else block.value_mix[0] * v + block.value_mix[1] * ve.type_as(v)
        x = x + block.attn_proj(_attend_cached(q, k, v.view(heads), cache, layer, pos0, mask))
    return x + block.mlp_proj(F.relu(block.fc(rms_norm(x))).square())


def _gpt2_block(block, x, cache, layer, pos0, mask):
    h = block.ln_1(x)
    heads = (*h.shape[:2], block.n_head, -1)
    q, k, v = (t.view(heads) for t in block.c_attn(h).chunk(3, dim=-1))
    x = x + block.attn_proj(_attend_cached(q, k, v, cache, layer, pos0, mask))
    return x + block.mlp_proj(F.gelu(block.fc(block.ln_2(x)), approximate="tanh"))


@torch.no_grad()
def forward_cached(model: GPT, idx: torch.Tensor, hints, cache: KVCache) -> torch.Tensor:
    """(1, T, vocab) logits of the tokens idx (1, T) at positions cache.length.., which they
    extend; hints: the tuple of hint tensors GPT.forward takes after targets ((1, T, ...) each),
    or None for no hints. Advances cache.length by T."""
    cfg = model.cfg
    pos0, T = cache.length, idx.size(1)
    if idx.size(0) != 1:
        raise ValueError(f"forward_cached: one sequence at a time, got a batch of {idx.size(0)}")
    if pos0 + T > cache.max_len:
        raise ValueError(f"forward_cached: {pos0} cached + {T} new positions exceed the context of {cache.max_len}")
    if model.record_hints:
        raise ValueError("forward_cached: generation runs models of --hint-repr lengths (the record's input hint "
                         "sits inside x0, which this path does not build)")
    cache.tokens[:, pos0:pos0 + T] = idx
    mask = _mask(model, cache, pos0, T)
    hint = model._hint_vector(idx, *hints) if hints is not None else None
    if cfg.arch == "speedrun":
        x0 = rms_norm(model.wte(idx))
        x = model.hints.inject(x0, hint, INJECT_EMBED)
        ves = [table(idx) for table in model.value_embeds]
        n_encoder = cfg.n_layer // 2
        skips = []
        for i, block in enumerate(model.blocks):
            if model.skip_weights is not None and i >= n_encoder and skips:
                x = x + model.skip_weights[i - n_encoder] * skips.pop()
            x = _speedrun_block(block, x, x0, model._value_embedding(ves, i), cache, i, pos0, mask)
            if model.skip_weights is not None and i < n_encoder:
                skips.append(x)
            if i == model.middle_layer:
                x = model.hints.inject(x, hint, INJECT_MIDDLE)
    else:
        x = model.wte(idx) + model.wpe(torch.arange(pos0, pos0 + T, device=idx.device))
        x = model.hints.inject(x, hint, INJECT_EMBED)
        for i, block in enumerate(model.blocks):
            x = _gpt2_block(block, x, cache, i, pos0, mask)
            if i == model.middle_layer:
                x = model.hints.inject(x, hint, INJECT_MIDDLE)
    cache.length = pos0 + T
    return model._head(model.hints.inject(x, hint, INJECT_HEAD), None)
