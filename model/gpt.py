"""The transformer: a speedrun-style GPT and the llm.c GPT-2 baseline, both taking n-gram hints.

arch="speedrun" (modded-nanogpt style): token embedding followed by a parameter-free RMSNorm,
rotary position embeddings, RMSNorm on queries and keys (QK-norm), ReLU^2 MLP, zero-initialised
output projections and LM head, an untied LM head, and a soft-capped logit
`cap * tanh(logits / cap)`. That is the record of November 2024 that untied embedding and head.
The later records' backbone features are GPTConfig fields, each off by default
(RECORD_BACKBONE turns on the set of the record of 2025-01-04; docs/design.md names it):
  unet_skips    U-net: the first n_layer // 2 blocks are encoders whose outputs the decoder
                blocks add back in reverse order, each through a learned weight (init 1);
  embed_skips   every block first mixes in the normalised token embedding x0:
                x = a * x + b * x0, learned (a, b) initialised to (1, 0);
  value_embeds  N extra embedding tables; the first N and the last N blocks add table i's
                row of the input token to their attention values: v = a * v + b * ve
                (learned (a, b) = (0.5, 0.5) in every attention block);
  window_attn   sliding-window causal attention with document masking at BOS tokens
                (model/attention.py); the window, in blocks of attn_block_size tokens, is set
                per step through set_window_blocks() and grows during training;
  no_attn_layers  blocks with only the MLP;
  rope="half"   rotary on half the head dims with frequencies (1/1024)^[0..1], the other half
                left unrotated (rope="full": RoFormer's base 10000 on every dim).
arch="gpt2" (llm.c's GPT-2 124M): learned position embeddings, LayerNorm, GELU(tanh) MLP,
biases, LM head tied to the token embedding, N(0, 0.02) init with residual projections scaled
by 1/sqrt(2 * n_layer), no soft-cap.

Both add a hint vector to the residual stream at three places, in one of two representations
(GPTConfig.hint_repr), each reading the hinted tokens' rows, detached, from the table the LM head
reads (`lm_head.weight`; gpt2 ties it to wte), never from an untied input table the head does not
see (hint_cells.py says why):
  "record"   the record's (hint_cells.py): one cell per position and its followers' distribution;
             INJECT_EMBED into the raw embedding before its RMSNorm, so x0 carries the hint;
             INJECT_MIDDLE after record_middle_layer(n_layer) blocks (the record: 7 of 11);
  "lengths"  this repo's first one (hint_embedding.py): one hint per n-gram length, summed;
             INJECT_EMBED after the embedding's RMSNorm, the embedding skip x0 without the hint;
             INJECT_MIDDLE after block n_layer // 2 - 1 (the last encoder block; its U-net skip
             is taken before the hint is added, so the hint enters once).
  INJECT_HEAD (both) after the last block, BEFORE the final norm, so the final norm sees the hint
             relative to the (depth-grown) residual and the LM head gets a normalised input.
For gpt2 INJECT_EMBED is after wte + wpe in both.
Logits keep the padded vocabulary width (a multiple of 128) through the soft-cap and the loss;
the pad columns are filled with -inf before the cross-entropy (exactly the loss over the real
columns), and the logits returned without targets are a view of the real columns. float32.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import ATTN_BLOCK_SIZE, BOS_ID, attend, build_mask, compile_attention
from model.device import configure_compile, gpu_paths_enabled, maybe_compile
from model.hint_cells import RECORD_TABLE_STD, CellHints, record_middle_layer
from model.hint_embedding import INJECT_EMBED, INJECT_HEAD, INJECT_MIDDLE, HintEmbedding

ARCHS = ("speedrun", "gpt2")
HINT_REPRS = ("record", "lengths")  # see the module docstring
ROPES = ("full", "half")
# Vocabulary rows are padded to a multiple of 128 (llm.c / modded-nanogpt: 50257 -> 50304) so the
# LM-head matmul and the logits rows have aligned shapes.
VOCAB_PAD_MULTIPLE = 128
# RoFormer's base frequency.
ROPE_BASE = 10000.0
# The records' half-truncated rotary (from 2024-12-17): head_dim / 4 frequencies spaced
# geometrically from 1 down to 1/1024, then head_dim / 4 zero frequencies.
HALF_ROPE_MIN_FREQ = 1 / 1024
# The 2025-01-04 record's CastedLinear keeps nn.Linear's init: uniform in +-1/sqrt(fan_in), i.e.
# std 1/sqrt(3 fan_in) (later records use std 0.5/sqrt(fan_in)).
SPEEDRUN_INIT_GAIN = 1 / math.sqrt(3.0)
# GPT-2 / llm.c init: N(0, 0.02) everywhere, residual projections scaled by 1/sqrt(2 * n_layer).
GPT2_INIT_STD = 0.02
# Initial mixes of the records: block (x, x0) = (1, 0), attention (v, value embedding) = (0.5, 0.5).
EMBED_SKIP_INIT = (1.0, 0.0)
VALUE_MIX_INIT = (0.5, 0.5)

# The backbone of modded-nanogpt's record of 2025-01-04 ("Lower logit softcap from 30 to 15",
# 3.4 minutes on 8xH100, val loss 3.2785 at step 1390; records/track_1_short/2025-01-04_SoftCap):
# U-net and embedding skips, 3 value-embedding tables on blocks 0-2 and 9-11, block 7 without
# attention, half-truncated rotary, sliding-window document-masked attention, soft-cap 15.
RECORD_BACKBONE = dict(unet_skips=True, embed_skips=True, value_embeds=3, window_attn=True,
                       no_attn_layers=(7,), rope="half")


@dataclass
class GPTConfig:
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 6
    n_embd: int = 768
    arch: str = "speedrun"          # "speedrun" or "gpt2"
    max_seq_len: int = 1024         # rotary table / learned position embedding length
    n_hint_lengths: int = 3         # K: n-gram lengths (lengths: hints per position)
    n_hint_kinds: int = 0           # required: the kind count, hints.n_kinds(K) (lengths) or hints.n_cells(K) (record)
    hint_repr: str = "lengths"      # "record" or "lengths" (the module docstring)
    logit_softcap: float = 15.0     # speedrun only (0 disables); the gpt2 baseline has none
    head_init_std: float = 0.0      # speedrun only: the LM head's init std; 0: zeros (modded-nanogpt), the
                                    # hinted record's 0.005 (model/hint_cells.py RECORD_TABLE_STD)
    # later-record backbone features (speedrun only; see the module docstring)
    unet_skips: bool = False
    embed_skips: bool = False
    value_embeds: int = 0
    window_attn: bool = False
    attn_block_size: int = ATTN_BLOCK_SIZE
    bos_id: int = BOS_ID
    no_attn_layers: tuple = ()
    rope: str = "full"

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        if self.hint_repr not in HINT_REPRS:
            raise ValueError(f"hint_repr must be one of {HINT_REPRS}, got {self.hint_repr!r}")
        if self.rope not in ROPES:
            raise ValueError(f"rope must be one of {ROPES}, got {self.rope!r}")
        head_multiple = 4 if self.rope == "half" else 2  # rotary pairs; "half" rotates half of them
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % head_multiple:
            raise ValueError(f"n_embd={self.n_embd} must split into n_head={self.n_head} heads of a size "
                             f"divisible by {head_multiple} (rope={self.rope!r})")
        if self.n_layer < 2:
            raise ValueError("n_layer must be >= 2 (the middle hint injection sits between layers)")
        if self.n_hint_kinds <= 0:
            raise ValueError(f"n_hint_kinds={self.n_hint_kinds}: pass the hint index's kind count "
                             f"(hints.n_kinds(n_hint_lengths))")
        self.no_attn_layers = tuple(sorted(int(i) for i in self.no_attn_layers))
        if not 0 <= self.value_embeds <= self.n_layer // 2:
            raise ValueError(f"value_embeds={self.value_embeds} must be in [0, n_layer // 2 = {self.n_layer // 2}] "
                             f"(the first and the last value_embeds blocks read them)")
        if any(not 0 <= i < self.n_layer for i in self.no_attn_layers):
            raise ValueError(f"no_attn_layers={self.no_attn_layers} must be block indices in [0, {self.n_layer})")
        if self.head_init_std < 0:
            raise ValueError(f"head_init_std must be >= 0 (0: a zero-initialised head), got {self.head_init_std}")
        if self.attn_block_size < 1:
            raise ValueError(f"attn_block_size must be >= 1, got {self.attn_block_size}")
        if self.arch == "gpt2" and self.speedrun_features():
            raise ValueError(f"{', '.join(self.speedrun_features())} are speedrun-only features (arch='gpt2')")

    def speedrun_features(self) -> list[str]:
        """Names of the later-record features this config turns on."""
        on = dict(unet_skips=self.unet_skips, embed_skips=self.embed_skips, value_embeds=self.value_embeds > 0,
                  window_attn=self.window_attn, no_attn_layers=bool(self.no_attn_layers), rope=self.rope != "full",
                  head_init_std=self.head_init_std > 0)
        return [name for name, enabled in on.items() if enabled]

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


def rotary_frequencies(head_dim: int, rope: str) -> torch.Tensor:
    """The head_dim / 2 angular frequencies of the rotary embedding."""
    if rope == "full":
        return ROPE_BASE ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    rotated = HALF_ROPE_MIN_FREQ ** torch.linspace(0, 1, head_dim // 4, dtype=torch.float32)
    return torch.cat([rotated, rotated.new_zeros(head_dim // 4)])


class Rotary(nn.Module):
    """Rotary position embedding for (B, T, H, head_dim) tensors; one instance shared by all layers."""

    def __init__(self, head_dim: int, max_seq_len: int, rope: str = "full"):
        super().__init__()
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), rotary_frequencies(head_dim, rope))
        self.register_buffer("cos", angles.cos()[:, None, :], persistent=False)  # (T, 1, head_dim/2)
        self.register_buffer("sin", angles.sin()[:, None, :], persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Rotates in float32, as the 2025-01-04 record does (bf16 has 8 bits of mantissa: the angles
        of far positions would lose their low bits), and returns x's dtype."""
        T = x.size(1)
        cos, sin = self.cos[:T], self.sin[:T]
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1).type_as(x)


class SpeedrunBlock(nn.Module):
    """Pre-norm block: QK-normed rotary attention (unless attention=False) and a ReLU^2 MLP,
    zero-init output projections; optional embedding skip and value-embedding mix."""

    def __init__(self, cfg: GPTConfig, rotary: Rotary, attention: bool = True):
        super().__init__()
        d = cfg.n_embd
        self.n_head = cfg.n_head
        self.rotary = rotary
        self.has_attention = attention
        if attention:
            self.q, self.k, self.v = speedrun_linear(d, d), speedrun_linear(d, d), speedrun_linear(d, d)
            self.attn_proj = speedrun_linear(d, d, zero=True)
            self.value_mix = nn.Parameter(torch.tensor(VALUE_MIX_INIT)) if cfg.value_embeds else None
        self.fc = speedrun_linear(d, 4 * d)
        self.mlp_proj = speedrun_linear(4 * d, d, zero=True)
        self.embed_mix = nn.Parameter(torch.tensor(EMBED_SKIP_INIT)) if cfg.embed_skips else None

    def forward(self, x, x0=None, ve=None, mask=None):
        """x: residual (B, T, d); x0: normalised embedding; ve: value embedding (B, T, d) or None;
        mask: model.attention.build_mask() of the inputs (None: dense causal)."""
        if self.embed_mix is not None:
            x = self.embed_mix[0] * x + self.embed_mix[1] * x0
        if self.has_attention:
            h = rms_norm(x)
            heads = (*h.shape[:2], self.n_head, -1)
            # one dtype into attention (FlexAttention's backward refuses a mix): v's, i.e. the Linear's
            # output, bf16 under autocast. Embedding lookups are not autocast and rms_norm's autocast
            # dtype differs between torch versions, so ve, q and k are cast to it.
            v = self.v(h)
            q = self.rotary(rms_norm(self.q(h).view(heads))).type_as(v)
            k = self.rotary(rms_norm(self.k(h).view(heads))).type_as(v)
            if self.value_mix is not None:
                v = self.value_mix[0] * v if ve is None else self.value_mix[0] * v + self.value_mix[1] * ve.type_as(v)
            x = x + self.attn_proj(attend(q, k, v.view(heads), mask))
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
        x = x + self.attn_proj(attend(q, k, v, None))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        d, vocab = cfg.n_embd, cfg.padded_vocab_size
        self.wte = nn.Embedding(vocab, d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.record_hints = cfg.hint_repr == "record"
        # the scales at init of the table the hints read (the LM head's rows), of the input embedding
        # and of the residual stream at the input (hint_cells.py, "Units")
        if cfg.arch == "speedrun":
            table_std, embed_std, residual_rms = cfg.head_init_std or RECORD_TABLE_STD, 1.0, 1.0
        else:
            table_std = embed_std = residual_rms = GPT2_INIT_STD
        if self.record_hints:
            self.hints = CellHints(d, cfg.n_hint_kinds, table_std, embed_std, residual_rms)
            self.middle_layer = record_middle_layer(cfg.n_layer)  # INJECT_MIDDLE goes after this block
        else:
            self.hints = HintEmbedding(d, cfg.n_hint_kinds, token_units=residual_rms / table_std)
            self.middle_layer = cfg.n_layer // 2 - 1
        # True on the pad columns of the logits (filled with -inf before the loss)
        self.register_buffer("pad_columns", torch.arange(vocab) >= cfg.vocab_size, persistent=False)
        if cfg.arch == "speedrun":
            rotary = Rotary(d // cfg.n_head, cfg.max_seq_len, cfg.rope)
            self.blocks = nn.ModuleList(SpeedrunBlock(cfg, rotary, attention=i not in cfg.no_attn_layers)
                                        for i in range(cfg.n_layer))
            self.value_embeds = nn.ModuleList(nn.Embedding(vocab, d) for _ in range(cfg.value_embeds))
            n_decoder = cfg.n_layer - cfg.n_layer // 2
            self.skip_weights = nn.Parameter(torch.ones(n_decoder)) if cfg.unet_skips else None
            # the attention window in blocks of attn_block_size tokens (set_window_blocks; all of
            # max_seq_len until set); a tensor, so a compiled model does not recompile as it grows
            full = math.ceil(cfg.max_seq_len / cfg.attn_block_size)
            self.register_buffer("window_blocks", torch.tensor(full, dtype=torch.int32), persistent=False)
            if cfg.window_attn:
                compile_attention()  # the GPU path's FlexAttention and mask builder, once, at set-up
            nn.init.normal_(self.wte.weight, std=1.0)   # read through an RMSNorm, so unit scale
            if cfg.head_init_std > 0:
                nn.init.normal_(self.lm_head.weight, std=cfg.head_init_std)
            else:
                nn.init.zeros_(self.lm_head.weight)     # modded-nanogpt: zero-init LM head
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

    def compile_regions(self) -> "GPT":
        """On the GPU path, torch.compile every block and the head (norm, LM head, soft-cap, loss)
        in place, instead of the whole model: backward is then one autograd node per region, so
        gradients complete block by block and GradSync's hooks start their reductions while
        backward goes on (a whole-model compile hands every gradient over at its very end).
        Parameter names are unchanged. A no-op off the GPU path."""
        if gpu_paths_enabled():
            configure_compile()  # the blocks share one forward: model/device.py's RECOMPILE_LIMIT
            for block in self.blocks:
                block.compile(dynamic=False)
            self._head = maybe_compile(self._head)
        return self

    def cast_embeddings(self, dtype: torch.dtype) -> "GPT":
        """Keep the embedding tables (token and value embeddings) in `dtype`: bf16 on the GPU path,
        as the 2025-01-04 record keeps them. Their lookups are not autocast, so float32 tables would
        put float32 rows into a bf16 step; bf16 tables also halve their gradients' all-reduce
        (model/grad_sync.py). The LM head stays float32 (the record's too). speedrun only: gpt2 ties
        its token table to its LM head."""
        if self.cfg.arch != "speedrun":
            raise ValueError("cast_embeddings: the speedrun arch only (gpt2 ties wte to its LM head)")
        self.wte.to(dtype)
        self.value_embeds.to(dtype)
        return self

    def set_window_blocks(self, blocks: int) -> None:
        """Attention window (window_attn) in blocks of attn_block_size tokens; >= 1."""
        if blocks < 1:
            raise ValueError(f"the attention window must be >= 1 block, got {blocks}")
        self.window_blocks.fill_(blocks)

    def _hint_vector(self, idx, hint_tokens, hint_kinds, hint_weights=None):
        if hint_tokens is None and hint_kinds is None:
            return None
        if self.record_hints:
            if (hint_tokens is None or hint_kinds is None or hint_weights is None or hint_kinds.shape != idx.shape
                    or hint_tokens.shape[:2] != idx.shape or hint_tokens.ndim != 3 or hint_weights.shape != hint_tokens.shape):
                raise ValueError(f"record hints: followers and weights (*{tuple(idx.shape)}, F) and cells "
                                 f"{tuple(idx.shape)}, all given or none")
            return self.hints(self.lm_head.weight, idx, hint_tokens, hint_weights, hint_kinds)
        expected = (*idx.shape, self.cfg.n_hint_lengths)
        if hint_tokens is None or hint_kinds is None or hint_tokens.shape != expected or hint_kinds.shape != expected:
            raise ValueError(f"hint_tokens and hint_kinds must both be None or both of shape {expected}")
        return self.hints(self.lm_head.weight, idx, hint_tokens, hint_kinds)

    def _value_embedding(self, ves, layer):
        """The value embedding block `layer` reads: table i for block i and block n_layer - n + i."""
        n = len(ves)
        if layer < n:
            return ves[layer]
        if layer >= self.cfg.n_layer - n:
            return ves[layer - (self.cfg.n_layer - n)]
        return None

    def _speedrun_blocks(self, x, x0, idx, hint):
        cfg = self.cfg
        mask = build_mask(idx, self.window_blocks if cfg.window_attn else None, cfg.attn_block_size, cfg.bos_id)
        ves = [table(idx) for table in self.value_embeds]
        n_encoder = cfg.n_layer // 2
        skips = []
        for i, block in enumerate(self.blocks):
            if self.skip_weights is not None and i >= n_encoder and skips:
                x = x + self.skip_weights[i - n_encoder] * skips.pop()
            x = block(x, x0, self._value_embedding(ves, i), mask)
            if self.skip_weights is not None and i < n_encoder:
                skips.append(x)
            if i == self.middle_layer:
                x = self.hints.inject(x, hint, INJECT_MIDDLE)
        return x

    def forward(self, idx, targets=None, hint_tokens=None, hint_kinds=None, hint_weights=None):
        """idx, targets: (B, T) int64. Hints, -1 = none:
          lengths: hint_tokens, hint_kinds (B, T, n_hint_lengths) int64;
          record:  hint_tokens the followers (B, T, F) int64, hint_kinds the cells (B, T) int64,
                   hint_weights the followers' counts (B, T, F).

        Returns the mean cross-entropy (float32 scalar) when targets is given, else (B, T, vocab)
        float32 logits.
        """
        cfg = self.cfg
        hint = self._hint_vector(idx, hint_tokens, hint_kinds, hint_weights)
        if cfg.arch == "speedrun" and self.record_hints:  # the hint inside x0
            x0 = rms_norm(self.hints.inject(self.wte(idx), hint, INJECT_EMBED))
            x = self._speedrun_blocks(x0, x0, idx, hint)
        elif cfg.arch == "speedrun":
            x0 = rms_norm(self.wte(idx))
            x = self._speedrun_blocks(self.hints.inject(x0, hint, INJECT_EMBED), x0, idx, hint)
        else:
            x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
            x = self.hints.inject(x, hint, INJECT_EMBED)
            for i, block in enumerate(self.blocks):
                x = block(x)
                if i == self.middle_layer:
                    x = self.hints.inject(x, hint, INJECT_MIDDLE)
        return self._head(self.hints.inject(x, hint, INJECT_HEAD), targets)

    def _head(self, x, targets):
        """Final norm, LM head, soft-cap; the loss when targets is given, else the real columns."""
        cfg = self.cfg
        x = rms_norm(x) if cfg.arch == "speedrun" else self.ln_f(x)
        logits = self.lm_head(x).float()                     # (B, T, padded vocab): aligned rows
        if cfg.arch == "speedrun" and cfg.logit_softcap > 0:
            logits = cfg.logit_softcap * torch.tanh(logits / cfg.logit_softcap)
        if targets is None:
            return logits[..., : cfg.vocab_size]
        if cfg.padded_vocab_size > cfg.vocab_size:
            logits = logits.masked_fill(self.pad_columns, float("-inf"))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
