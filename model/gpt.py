"""The transformer: a speedrun-style GPT and the llm.c GPT-2 baseline, both taking n-gram hints.

arch="speedrun" (modded-nanogpt style): token embedding followed by a parameter-free RMSNorm,
rotary position embeddings, RMSNorm on queries and keys (QK-norm), ReLU^2 MLP, zero-initialised
output projections and LM head, an untied LM head, and a soft-capped logit
`cap * tanh(logits / cap)`.
arch="gpt2" (llm.c's GPT-2 124M): learned position embeddings, LayerNorm, GELU(tanh) MLP,
biases, LM head tied to the token embedding, N(0, 0.02) init with residual projections scaled
by 1/sqrt(2 * n_layer), no soft-cap.

Both add the hint vector (hint_embedding.py) to the residual stream at three places:
  INJECT_EMBED  right after the embedding (after its RMSNorm for speedrun; after wte + wpe for gpt2),
  INJECT_MIDDLE after block n_layer // 2 - 1,
  INJECT_HEAD   after the last block, BEFORE the final norm, so the final norm sees the hint
                relative to the (depth-grown) residual and the LM head gets a normalised input.
Attention is F.scaled_dot_product_attention(is_causal=True) on every device (flash on GPU).
Logits and loss are float32.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.hint_embedding import INJECT_EMBED, INJECT_HEAD, INJECT_MIDDLE, HintEmbedding

ARCHS = ("speedrun", "gpt2")
# Vocabulary rows are padded to a multiple of 128 (llm.c / modded-nanogpt: 50257 -> 50304) so the
# LM-head matmul has an aligned shape; logits are sliced back to vocab_size.
VOCAB_PAD_MULTIPLE = 128
# RoFormer's base frequency.
ROPE_BASE = 10000.0
# modded-nanogpt's CastedLinear init: uniform with std 0.5 / sqrt(fan_in).
SPEEDRUN_INIT_GAIN = 0.5
# GPT-2 / llm.c init: N(0, 0.02) everywhere, residual projections scaled by 1/sqrt(2 * n_layer).
GPT2_INIT_STD = 0.02


@dataclass
class GPTConfig:
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 6
    n_embd: int = 768
    arch: str = "speedrun"          # "speedrun" or "gpt2"
    max_seq_len: int = 1024         # rotary table / learned position embedding length
    n_hint_lengths: int = 3         # K: hints per position (one per n-gram length)
    n_hint_kinds: int = 0           # required: the hint index's kind count, hints.n_kinds(n_hint_lengths)
    logit_softcap: float = 15.0     # speedrun only (0 disables); the gpt2 baseline has none

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 2:
            raise ValueError(f"n_embd={self.n_embd} must split into n_head={self.n_head} heads of even size")
        if self.n_layer < 2:
            raise ValueError("n_layer must be >= 2 (the middle hint injection sits between layers)")
        if self.n_hint_kinds <= 0:
            raise ValueError(f"n_hint_kinds={self.n_hint_kinds}: pass the hint index's kind count "
                             f"(hints.n_kinds(n_hint_lengths))")

    @property
    def padded_vocab_size(self) -> int:
        return math.ceil(self.vocab_size / VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    """Parameter-free RMSNorm over the last dimension."""
    return F.rms_norm(x, (x.size(-1),))


def speedrun_linear(n_in: int, n_out: int, zero: bool = False) -> nn.Linear:
    layer = nn.Linear(n_in, n_out, bias=False)
    if zero:
        nn.init.zeros_(layer.weight)
    else:
        bound = math.sqrt(3.0) * SPEEDRUN_INIT_GAIN / math.sqrt(n_in)
        nn.init.uniform_(layer.weight, -bound, bound)
    return layer


class Rotary(nn.Module):
    """Rotary position embedding for (B, T, H, head_dim) tensors; one instance shared by all layers."""

    def __init__(self, head_dim: int, max_seq_len: int):
        super().__init__()
        inv_freq = ROPE_BASE ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos()[:, None, :], persistent=False)  # (T, 1, head_dim/2)
        self.register_buffer("sin", angles.sin()[:, None, :], persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.size(1)
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """(B, T, H, hd) q, k, v -> (B, T, H * hd) causal attention output."""
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return y.transpose(1, 2).flatten(2)


class SpeedrunBlock(nn.Module):
    """Pre-norm block: QK-normed rotary attention and a ReLU^2 MLP, zero-init output projections."""

    def __init__(self, cfg: GPTConfig, rotary: Rotary):
        super().__init__()
        d = cfg.n_embd
        self.n_head = cfg.n_head
        self.rotary = rotary
        self.q, self.k, self.v = speedrun_linear(d, d), speedrun_linear(d, d), speedrun_linear(d, d)
        self.attn_proj = speedrun_linear(d, d, zero=True)
        self.fc = speedrun_linear(d, 4 * d)
        self.mlp_proj = speedrun_linear(4 * d, d, zero=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = rms_norm(x)
        heads = (*h.shape[:2], self.n_head, -1)
        q = self.rotary(rms_norm(self.q(h).view(heads)))
        k = self.rotary(rms_norm(self.k(h).view(heads)))
        x = x + self.attn_proj(causal_attention(q, k, self.v(h).view(heads)))
        return x + self.mlp_proj(F.relu(self.fc(rms_norm(x))).square())


class GPT2Block(nn.Module):
    """llm.c / GPT-2 block: LayerNorm, fused-QKV attention with biases, GELU(tanh) MLP."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        d = cfg.n_embd
        self.n_head = cfg.n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.attn_proj = nn.Linear(d, d)
        self.fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        heads = (*h.shape[:2], self.n_head, -1)
        q, k, v = (t.view(heads) for t in self.c_attn(h).chunk(3, dim=-1))
        x = x + self.attn_proj(causal_attention(q, k, v))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        d, vocab = cfg.n_embd, cfg.padded_vocab_size
        self.wte = nn.Embedding(vocab, d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.hints = HintEmbedding(d, cfg.n_hint_kinds)
        self.middle_layer = cfg.n_layer // 2 - 1   # INJECT_MIDDLE goes after this block
        if cfg.arch == "speedrun":
            rotary = Rotary(d // cfg.n_head, cfg.max_seq_len)
            self.blocks = nn.ModuleList(SpeedrunBlock(cfg, rotary) for _ in range(cfg.n_layer))
            nn.init.normal_(self.wte.weight, std=1.0)   # read through an RMSNorm, so unit scale
            nn.init.zeros_(self.lm_head.weight)         # modded-nanogpt: zero-init LM head
        else:
            self.wpe = nn.Embedding(cfg.max_seq_len, d)
            self.blocks = nn.ModuleList(GPT2Block(cfg) for _ in range(cfg.n_layer))
            self.ln_f = nn.LayerNorm(d)
            self.lm_head.weight = self.wte.weight       # tied
            self._init_gpt2_weights()

    def _init_gpt2_weights(self):
        residual_std = GPT2_INIT_STD / math.sqrt(2 * self.cfg.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith("_proj") else GPT2_INIT_STD
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=GPT2_INIT_STD)

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token (forward + backward): 6 per matmul weight, plus attention's
        12 x layers x width x seq_len (PaLM, Chowdhery et al. 2022, appendix B). Embedding
        lookups are not matmuls; the LM head is, tied or not."""
        n_matmul = sum(p.numel() for n, p in self.named_parameters() if n.startswith("blocks.") and p.ndim >= 2)
        n_matmul += self.lm_head.weight.numel()
        return 6 * n_matmul + 12 * self.cfg.n_layer * self.cfg.n_embd * seq_len

    def _hint_vector(self, idx, hint_tokens, hint_kinds):
        if hint_tokens is None and hint_kinds is None:
            return None
        expected = (*idx.shape, self.cfg.n_hint_lengths)
        if hint_tokens is None or hint_kinds is None or hint_tokens.shape != expected or hint_kinds.shape != expected:
            raise ValueError(f"hint_tokens and hint_kinds must both be None or both of shape {expected}")
        return self.hints(self.wte.weight, hint_tokens, hint_kinds)

    def forward(self, idx, targets=None, hint_tokens=None, hint_kinds=None):
        """idx, targets: (B, T) int64; hint_tokens, hint_kinds: (B, T, n_hint_lengths) int64, -1 = none.

        Returns the mean cross-entropy (float32 scalar) when targets is given, else (B, T, vocab)
        float32 logits.
        """
        cfg = self.cfg
        hint = self._hint_vector(idx, hint_tokens, hint_kinds)
        if cfg.arch == "speedrun":
            x = rms_norm(self.wte(idx))
        else:
            x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        x = self.hints.inject(x, hint, INJECT_EMBED)
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i == self.middle_layer:
                x = self.hints.inject(x, hint, INJECT_MIDDLE)
        x = self.hints.inject(x, hint, INJECT_HEAD)
        x = rms_norm(x) if cfg.arch == "speedrun" else self.ln_f(x)
        logits = self.lm_head(x)[..., : cfg.vocab_size].float()
        if cfg.arch == "speedrun" and cfg.logit_softcap > 0:
            logits = cfg.logit_softcap * torch.tanh(logits / cfg.logit_softcap)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
