"""The record arch ("record"): the hinted record's 11-layer model (the record's model/gpt.py GPT;
RECORD.md sections 2-8), composed of this repo's parts:

  model/record_attention.py  attend(): QK norm, rotary + YaRN (model/yarn.py), key offset, paired
                             heads, the varlen window mask, XSA, output gates
  model/record_residual.py   the gate networks, the layer-10 and post-loop mixes, the value-embedding
                             gates, the smear
  model/record_loss.py       soft-cap, the training loss (MTP, prefix, sampled softmax), the eval loss
  model/fp8.py               the fp8 sites (QKV, MLP, LM head), training only
  model/hint_cells.py / hint_embedding.py   the hint vector ("record" cells / "lengths")
The hashed n-gram table is not part of the model (model/ngram_table.py): the forward takes its output
ng (T, d).

Shape (the record's at the defaults; RecordConfig makes every size a field, the topology is fixed):
  11 layers, width d, H heads of nominal width head_dim (H * head_dim == d); attention on 0,1,2,3,5,8,10;
  query/key width head_dim on the long-window layers 3, 10, head_dim/2 elsewhere; value/output width
  head_dim/2 on 1, 8, head_dim elsewhere; paired heads on 0, 2, 5; relu^2 MLP on all but 7, plus a
  parallel MLP on 8 (bank slot 11). Banks (the optimizer's units, model/anvil.py):
    qk_bank  [7 H (padded to world_size), 2 head_dim, d]: bank slot j (layer ATTN_BANK_ORDER[j]) owns H
             units, its Q heads then its K heads two at a time; narrow layers read each head's first rows
    vo_bank  [14 (padded), H head_dim, d]: slot j's V (out, in) at 2j, its O (d, H head_dim) at 2j + 1
    mlp_bank [12, 2, hidden, d]: slot = layer (7 unused), 11 = layer 8's parallel MLP; [s, 0] = W_fc,
             [s, 1] = W_proj, MLP(x) = relu(x W_fc^T)^2 W_proj
  Init: Q/K/V/O and W_fc uniform in +-sqrt(3) * 0.5 / sqrt(d); W_proj, the pads 0; lm_head [d, V]
  N(0, embed_std^2) and embed = lm_head^T; value_embeds [4 V, d] 0.01 N(0, 1).

The residual stream (norm = RMS norm without gain; g = a gate lane of record_residual's networks):
  e = E[x] + s_in hint;  e_t += l_sm sigmoid(w_sm . e_t[:12]) e_(t-1);  x0 = norm(e)
  pre gate from x0;  x = x0 + g_ng0 ng = cache[0]
  layer i:  i = 4: post gate from x.  i = 7: x += s_mid hint.
    i = 6:      x += sigmoid(l_skip) g_skip cache[3]
    4, 7, 9:    x = r_a,i x (+ g_x0,i x0 on 4, 7) (+ g_ng,i ng on 4, 9)
    attention:  input norm(x), on 8 and 10 norm(cache[7]); V += its value embedding (gated) on 1, 2, 8, 10
                (its first d_v dims per head);  x = r_a,i x + p_a,i l_o,i O(attn) (+ g_x0,i x0 on 0, 1, 2, 5)
                (+ g_ng,i ng on 1, 5).  Layer 10 (the mix mu = LastLayerMix(x), cache[9] = x):
                V += [mu6 (heads < H/2), mu7] ve10 + mu0 cache[0] + mu1 cache[7] + mu2 x;
                x = (1 + mu5) x + mu3 cache[0] + mu4 cache[7];  x = mu8 x + mu9 l_o O(attn) + mu10 cache[0] + mu11 ng
    MLP (not 7): x = r_m,i x + p_m,i MLP(norm(x)) (layer 8 also + p_m,8 MLP_11(norm(x)); layer 10
                x = mu12 x + mu13 MLP(norm(x)));  layer 7: x = r_m,7 x = cache[7];  cache[3] after layer 3
  post-loop mix of (cache[0], cache[7], cache[9], ve1, cache[3], ve2, ve10, ve8, layer 10's norm(x),
  norm(cache[7])); x += s_out hint; the loss on norm(x) (lm_head tied to embed at init).
Init values: r = sqrt(1.1), p = 1, l_qkv = 0.5, l_o = 1, l_sm = 0, w_sm = 0, l_skip = -1.5, the gates'
and mixes' in model/record_residual.py, the hints' 0.1 / 8 / 8 (model/hint_cells.py).

Precision: the forward runs in the dtype of embed.weight (float32 on the CPU; cast_to_record_dtypes()
makes the record's bf16 / fp32 split). FP8 (RecordConfig.fp8) in the training forward only, through
model/fp8.py: the GPU path behind model.device.gpu_paths_enabled(), a CPU round trip otherwise; the MLP's
scale state needs refresh_fp8() after every optimizer update of mlp_bank (and after a reset).
"""
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from model import fp8 as fp8_sites
from model.hint_cells import SITE_SCALE_INIT, CellHints
from model.hint_embedding import INJECT_EMBED, INJECT_HEAD, INJECT_MIDDLE, HintEmbedding
from model.ngram_table import NGRAM_ROWS
from model.record_attention import attend
from model.record_loss import eval_loss, training_loss
from model.record_residual import (GATE_SCALE_INIT, POST_LANES, PRE_LANES, RESID_LAMBDA_INIT, SMEAR_CHANNELS,
                                   VE_GATE_CHANNELS, GateNetwork, LastLayerMix, PostLoopMix, smear,
                                   value_embed_gate)
from model.yarn import RecordRotaries

ARCH = "record"
HINT_REPRS = ("record", "lengths")
# The record's topology (its model/gpt.py): fixed, the layers' roles refer to each other.
N_LAYER = 11
ATTN_LAYERS = (0, 1, 2, 3, 5, 8, 10)
LONG_LAYERS = (3, 10)                     # long window, partial key offset, query/key width head_dim
PAIRED_LAYERS = (0, 2, 5)
HALF_V_LAYERS = (1, 8)                    # value/output width head_dim / 2
ATTN_BANK_ORDER = (0, 2, 5, 1, 8, 3, 10)  # bank slot j belongs to layer ATTN_BANK_ORDER[j]
LATE_LAYERS = (8, 10)                     # attend over norm(cache[7])
NO_MLP_LAYERS = (7,)
PARALLEL_MLP_LAYER, PARALLEL_MLP_SLOT = 8, 11
MLP_SLOTS = 12
VALUE_EMBED_LAYERS = (1, 2, 8, 10)        # one value-embedding plane each, in this order
VE_GATE_LAYERS = (1, 2, 8)                # ve_gate_bank rows; layer 10's gate comes from its mix
X0_LAYERS = (0, 1, 2, 4, 5, 7)            # x0 re-injection, gated
NG_LAYERS = (1, 4, 5, 9)                  # n-gram injection in the loop (layer 0's is before it; 10 via mu11)
SKIP_LAYER, SKIP_SOURCE = 6, 3
MIDDLE_LAYER = 7                          # cache[7], the middle hint
POST_GATE_LAYER = 4
LAST_LAYER = 10
# Inits (the record's model/gpt.py init_misc, init_attn)
QKV_SCALE_INIT, OUT_SCALE_INIT = 0.5, 1.0  # l_qkv, l_o
SKIP_LAMBDA_INIT = -1.5                    # l_skip: sigmoid(-1.5) ~ 0.18
BANK_INIT_GAIN = 0.5                       # uniform in +-sqrt(3) * 0.5 / sqrt(d)
VALUE_EMBED_STD = 0.01
# The record's lm_head N(0, 0.005^2) (embed = lm_head^T at init).
EMBED_STD = 0.005
VOCAB_PAD_MULTIPLE = 128
# The record's first training windows in tokens (1 and 3 blocks of 128): what the rotary tables start at.
INITIAL_WINDOWS = (128, 384)
HINT_POINTS = ("embedding, before the smear and norm (s_in)", "layer 7's start (s_mid)",
               "after the post-loop mix, before the final norm (s_out)")


@dataclass
class RecordConfig:
    vocab_size: int = 50257
    model_dim: int = 512
    n_head: int = 4
    head_dim: int = 128               # nominal (wide) head width; n_head * head_dim == model_dim
    mlp_hidden: int = 1792            # 3.5 * model_dim
    gate_hidden: int = 64             # the gate and mix networks' hidden width
    mix_group_width: int = 64         # channels per group of the post-loop mix
    hint_repr: str = "record"         # "record" (cells) or "lengths"
    n_hint_kinds: int = 126           # cells (hints.n_cells(3)) or kinds (hints.n_kinds(K) for "lengths")
    ngram_table_rows: int = NGRAM_ROWS  # the table outside the model (model/ngram_table.py); for describe()
    embed_std: float = EMBED_STD
    fp8: bool = True                  # fp8 in the training forward (model/fp8.py)
    fp8_exact_refreshes: int = fp8_sites.MLP_EXACT_SCALE_REFRESHES  # the MLP's exact fp8 weight scales; scaled with the run
    initial_windows: tuple = INITIAL_WINDOWS

    def __post_init__(self):
        if self.hint_repr not in HINT_REPRS:
            raise ValueError(f"RecordConfig.hint_repr must be one of {HINT_REPRS}, got {self.hint_repr!r}")
        if self.n_head * self.head_dim != self.model_dim:
            raise ValueError(f"RecordConfig: n_head * head_dim = {self.n_head} * {self.head_dim} must equal "
                             f"model_dim = {self.model_dim} (V and O share one bank shape)")
        if self.n_head % 2 or self.head_dim % 8:
            raise ValueError(f"RecordConfig: n_head must be even (paired heads) and head_dim a multiple of 8, "
                             f"got {self.n_head}, {self.head_dim}")
        if self.model_dim < 12 or self.model_dim % self.mix_group_width:
            raise ValueError(f"RecordConfig: model_dim {self.model_dim} must be >= 12 (the smear gate) and a "
                             f"multiple of mix_group_width {self.mix_group_width}")
        if self.n_hint_kinds < 1 or self.vocab_size < 2:
            raise ValueError("RecordConfig: n_hint_kinds and vocab_size must be positive")
        self.initial_windows = tuple(int(w) for w in self.initial_windows)

    @property
    def padded_vocab_size(self) -> int:
        return -(-self.vocab_size // VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE

    def widths(self, layer: int) -> tuple[int, int]:
        """(query/key, value/output) head width of an attention layer."""
        narrow = self.head_dim // 2
        return (self.head_dim if layer in LONG_LAYERS else narrow, narrow if layer in HALF_V_LAYERS else self.head_dim)


class RecordHints(NamedTuple):
    """One rank's hints over its packed tokens (T positions), -1 = none.
    record:  tokens = the followers (T, F) int64, kinds = the cells (T,) int64, weights = the followers'
             counts (T, F) float;
    lengths: tokens = the hinted tokens (T, K) int64, kinds = their kinds (T, K) int64, weights None."""
    tokens: torch.Tensor
    kinds: torch.Tensor
    weights: torch.Tensor | None = None


def norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),))


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _uniform(shape, bound: float) -> torch.Tensor:
    return torch.empty(shape).uniform_(-bound, bound)


class RecordGPT(nn.Module):
    """The record arch (module docstring). world_size pads the banks to whole ANVIL units per rank."""

    def __init__(self, cfg: RecordConfig, *, world_size: int = 1):
        super().__init__()
        if world_size < 1 or (2 * MLP_SLOTS) % world_size:
            raise ValueError(f"RecordGPT: world_size {world_size} must divide the {2 * MLP_SLOTS} MLP matrices")
        self.cfg, self.world_size = cfg, world_size
        d, H, hd, V = cfg.model_dim, cfg.n_head, cfg.head_dim, cfg.padded_vocab_size
        bound = math.sqrt(3) * BANK_INIT_GAIN / math.sqrt(d)
        # output head and tied embedding
        self.lm_head = nn.Parameter(torch.randn(d, V) * cfg.embed_std)
        self.embed = nn.Embedding(V, d)
        with torch.no_grad():
            self.embed.weight.copy_(self.lm_head.T)
        self.value_embeds = nn.Parameter(VALUE_EMBED_STD * torch.randn(len(VALUE_EMBED_LAYERS) * V, d))
        # banks, padded to whole units per rank
        n_qk, n_vo = len(ATTN_BANK_ORDER) * H, 2 * len(ATTN_BANK_ORDER)
        self.qk_bank = nn.Parameter(torch.cat([_uniform((n_qk, 2 * hd, d), bound),
                                               torch.zeros(_round_up(n_qk, world_size) - n_qk, 2 * hd, d)]))
        self.vo_bank = nn.Parameter(torch.cat([_uniform((n_vo, H * hd, d), bound),
                                               torch.zeros(_round_up(n_vo, world_size) - n_vo, H * hd, d)]))
        self.mlp_bank = nn.Parameter(torch.stack([_uniform((MLP_SLOTS, cfg.mlp_hidden, d), bound),
                                                  torch.zeros(MLP_SLOTS, cfg.mlp_hidden, d)], dim=1))
        self.fp8_mlp_scales = fp8_sites.Fp8MLPScales(MLP_SLOTS, cfg.fp8_exact_refreshes)
        # scalars and lambdas
        self.attn_qkv_scale = nn.Parameter(torch.full((N_LAYER,), QKV_SCALE_INIT))
        self.attn_out_scale = nn.Parameter(torch.full((N_LAYER,), OUT_SCALE_INIT))
        self.smear_lambda = nn.Parameter(torch.zeros(()))
        self.skip_lambda = nn.Parameter(torch.tensor(SKIP_LAMBDA_INIT))
        self.smear_gate = nn.Parameter(torch.zeros(1, SMEAR_CHANNELS))
        self.resid_lambdas = nn.Parameter(torch.full((N_LAYER, 2), RESID_LAMBDA_INIT))  # [:, 0] attention, [:, 1] MLP
        self.post_lambdas = nn.Parameter(torch.ones(N_LAYER, 2))
        self.ve_gate_bank = nn.Parameter(torch.zeros(len(VE_GATE_LAYERS), H, 2 * VE_GATE_CHANNELS))
        # gate and mix networks (model/record_residual.py)
        self.gate_scale = nn.Parameter(torch.tensor(GATE_SCALE_INIT))  # s_g
        self.pre_gate = GateNetwork(d, H, PRE_LANES, cfg.gate_hidden)
        self.post_gate = GateNetwork(d, H, POST_LANES, cfg.gate_hidden)
        self.last_mix = LastLayerMix(d, cfg.gate_hidden)
        self.post_mix = PostLoopMix(d, cfg.gate_hidden, cfg.mix_group_width)
        # hints at the record's three points, scales 0.1 / 8 / 8 at init
        if cfg.hint_repr == "record":
            # one tied table (the head reads embed^T) and a residual of rms 1: the record's units, every factor 1
            self.hints = CellHints(d, cfg.n_hint_kinds, table_std=cfg.embed_std, embed_std=cfg.embed_std, residual_rms=1.0)
        else:
            self.hints = HintEmbedding(d, cfg.n_hint_kinds)
            with torch.no_grad():
                self.hints.scales.copy_(torch.tensor(SITE_SCALE_INIT))
        self.rotaries = RecordRotaries(hd)
        self.windows = cfg.initial_windows
        if self.lm_head.device.type != "meta":
            self.refresh_fp8()

    # ---- what the optimizers, the loop and --describe read ----

    def labelled_params(self) -> dict[str, list[nn.Parameter]]:
        """{label: [parameters]}: every parameter under exactly one label, the labels model/anvil.py,
        model/record_adam.py (ADAM_TABLE), model/row_adam.py and model/tail_average.py take."""
        fixed = {"lm_head": "lm_head", "embed.weight": "embed", "value_embeds": "value_embeds",
                 "qk_bank": "qk_bank", "vo_bank": "vo_bank", "mlp_bank": "mlp_bank",
                 "attn_qkv_scale": "scalars", "attn_out_scale": "scalars", "smear_lambda": "scalars",
                 "skip_lambda": "scalars", "smear_gate": "smear_gate", "resid_lambdas": "resid_lambdas",
                 "post_lambdas": "post_lambdas", "ve_gate_bank": "ve_gate_bank", "gate_scale": "s_g",
                 "post_mix.w2g": "mudd_w2g"}
        out: dict[str, list] = {}
        for name, p in self.named_parameters():
            module, _, leaf = name.rpartition(".")
            if name in fixed:
                label = fixed[name]
            elif module in ("pre_gate", "post_gate"):
                label = f"mudd_gate_{leaf}"
            elif module in ("last_mix", "post_mix"):
                label = f"mudd_{leaf}"
            elif module == "hints":
                label = "hint_embed" if p.ndim == 2 else "hint_scales"
            else:
                raise AssertionError(f"RecordGPT.labelled_params: no label for parameter {name}")
            out.setdefault(label, []).append(p)
        return out

    def describe(self) -> dict:
        cfg = self.cfg
        params = {label: sum(p.numel() for p in ps) for label, ps in sorted(self.labelled_params().items())}
        params["total"] = sum(params.values())
        return {"arch": ARCH, "n_layer": N_LAYER, "model_dim": cfg.model_dim, "n_head": cfg.n_head,
                "head_dim": cfg.head_dim, "vocab_size": cfg.padded_vocab_size,
                "attention_layers": list(ATTN_LAYERS),
                "mlp_layers": [i for i in range(N_LAYER) if i not in NO_MLP_LAYERS],
                "parallel_mlp_layers": [PARALLEL_MLP_LAYER], "mlp_hidden": cfg.mlp_hidden,
                "head_widths": {i: list(cfg.widths(i)) for i in ATTN_LAYERS},
                "value_embed_layers": list(VALUE_EMBED_LAYERS), "ngram_table_rows": cfg.ngram_table_rows,
                "hint_repr": cfg.hint_repr, "hint_inject": list(HINT_POINTS), "fp8": cfg.fp8, "params": params}

    @torch.no_grad()
    def refresh_fp8(self) -> None:
        """The MLP's fp8 scales from the current mlp_bank (after init, a reset, and every update of it)."""
        self.fp8_mlp_scales.refresh(self.mlp_bank[:, 0], self.mlp_bank[:, 1])

    def set_windows(self, windows, *, yarn: bool = True) -> None:
        """The attention windows (short, long) in tokens; with yarn, a changed window rescales its rotary
        tables (YaRN: short -> the narrow and paired tables, long -> the wide one). The final validation's
        long window is set with yarn=False (the record: no rescale for 13 -> 20 blocks)."""
        short, long = (int(w) for w in windows)
        if short < 1 or long < 1:
            raise ValueError(f"RecordGPT.set_windows: windows must be >= 1 token, got {windows!r}")
        if yarn:
            self.rotaries.apply_window_change(short=(self.windows[0], short), long=(self.windows[1], long))
        self.windows = (short, long)

    def reset_windows(self) -> None:
        """The step-0 rotary tables and windows (the post-warm-up reset)."""
        self.rotaries.reset()
        self.windows = self.cfg.initial_windows

    def reset_fp8(self) -> None:
        """The MLP's fp8 scale state from scratch (the post-warm-up reset), refreshed from the current weights."""
        self.fp8_mlp_scales.reset()
        self.refresh_fp8()

    def get_extra_state(self):
        return {"windows": list(self.windows)}

    def set_extra_state(self, state) -> None:
        self.windows = tuple(int(w) for w in state["windows"])

    @torch.no_grad()
    def cast_to_record_dtypes(self) -> "RecordGPT":
        """The record's split (RECORD.md section 7): matrices, tables and the mix/gate networks in bf16;
        scalars, lambdas, s_g and the hint parameters stay float32."""
        keep = {"scalars", "resid_lambdas", "post_lambdas", "s_g", "hint_scales", "hint_embed"}
        for label, params in self.labelled_params().items():
            if label not in keep:
                for p in params:
                    p.data = p.data.bfloat16()
        return self

    # ---- forward ----

    def forward(self, idx, targets, cu_seqlens, ng, *, windows, mtp_weights=(1.0,), prefix_targets=None,
                prefix_weight=0.0, candidates=None, hints: RecordHints | None = None, yarn: bool = True):
        """The training loss of one rank's packed batch: a float32 0-d tensor, the SUM over its T tokens
        (model/record_loss.py training_loss; backward it as is).

        idx, targets: (T,) int64 input and target tokens; cu_seqlens: (S+1,) int32 attention segment starts
        from 0 to T (documents and the 2,560-token splits: data/packed_loader.py segment_starts); ng: (T, d)
        the n-gram table's output for idx (model/ngram_table.py NgramTable.embed); windows: (short, long)
        attention windows in tokens (StepPlan.window_tokens; a change applies YaRN unless yarn=False, see
        set_windows); mtp_weights: w_0, w_1, ... (StepPlan.mtp_weights); prefix_targets: (T,) int64
        prefix(targets), -1 none, or None (no prefix term); prefix_weight: StepPlan.prefix_weight;
        candidates: model/record_loss.py Candidates (sampled softmax) or None (full softmax); hints:
        RecordHints or None. FP8 when cfg.fp8."""
        x = self._trunk(idx, cu_seqlens, ng, hints, windows, yarn, fp8=self.cfg.fp8)
        return training_loss(x, self.lm_head, targets, mtp_weights=mtp_weights, prefix_targets=prefix_targets,
                             prefix_weight=prefix_weight, candidates=candidates, fp8=self.cfg.fp8)

    def evaluate(self, idx, targets, cu_seqlens, ng, *, windows, hints: RecordHints | None = None,
                 canon_mask=None, yarn: bool = True):
        """The eval loss of one rank's packed batch: (summed next-token CE, a float32 0-d tensor; number of
        scored tokens). Arguments as forward's; canon_mask: the canonical mask, uint8 (V, V / 8)
        (data/canonical_mask.py), or None. No fp8; wrap it in torch.no_grad() for validation."""
        x = self._trunk(idx, cu_seqlens, ng, hints, windows, yarn, fp8=False)
        return eval_loss(x, self.lm_head, targets, idx, canon_mask)

    def _hint_vector(self, idx, hints):
        if hints is None:
            return None
        T = idx.numel()
        if self.cfg.hint_repr == "record":
            if (hints.weights is None or hints.kinds.shape != (T,) or hints.tokens.ndim != 2
                    or hints.tokens.shape[0] != T or hints.weights.shape != hints.tokens.shape):
                raise ValueError(f"RecordGPT: record hints need tokens and weights (T={T}, F) and kinds (T,), "
                                 f"got {tuple(hints.tokens.shape)}, {tuple(hints.kinds.shape)}, "
                                 f"{None if hints.weights is None else tuple(hints.weights.shape)}")
            vec = self.hints(self.embed.weight, idx[None], hints.tokens[None], hints.weights[None], hints.kinds[None])
        else:
            if hints.tokens.ndim != 2 or hints.tokens.shape[0] != T or hints.kinds.shape != hints.tokens.shape:
                raise ValueError(f"RecordGPT: lengths hints need tokens and kinds (T={T}, K), got "
                                 f"{tuple(hints.tokens.shape)}, {tuple(hints.kinds.shape)}")
            vec = self.hints(self.embed.weight, idx[None], hints.tokens[None], hints.kinds[None])
        return vec[0].to(self.embed.weight.dtype)

    def _check(self, idx, cu_seqlens, ng):
        T, d = idx.numel(), self.cfg.model_dim
        if idx.ndim != 1 or T == 0:
            raise ValueError(f"RecordGPT: idx must be a non-empty 1-D packed batch, got shape {tuple(idx.shape)}")
        if ng.shape != (T, d):
            raise ValueError(f"RecordGPT: ng must be (T={T}, d={d}), got {tuple(ng.shape)}")
        if cu_seqlens.ndim != 1 or cu_seqlens.dtype != torch.int32:
            raise ValueError(f"RecordGPT: cu_seqlens must be (S+1,) int32, got {tuple(cu_seqlens.shape)} "
                             f"{cu_seqlens.dtype}")

    def _trunk(self, idx, cu_seqlens, ng, hints, windows, yarn, fp8):
        """The final normed hidden state (T, d) (module docstring)."""
        self._check(idx, cu_seqlens, ng)
        if tuple(windows) != self.windows:
            self.set_windows(windows, yarn=yarn)
        cfg = self.cfg
        T, H, hd, V = idx.numel(), cfg.n_head, cfg.head_dim, cfg.padded_vocab_size
        dt = self.embed.weight.dtype
        hint = self._hint_vector(idx, hints)
        ng = ng.to(dt)
        e = self.embed(idx)
        if hint is not None:
            e = self.hints.inject(e, hint, INJECT_EMBED)
        x0 = norm(smear(e, self.smear_gate, self.smear_lambda))
        gates = self.pre_gate(x0, self.gate_scale)
        planes = self.value_embeds.view(len(VALUE_EMBED_LAYERS), V, -1)[:, idx].to(dt)
        ve = dict(zip(VALUE_EMBED_LAYERS, planes.unbind(0)))
        resid, post = self.resid_lambdas.to(dt), self.post_lambdas.to(dt)
        x = x0 + gates["ng", 0] * ng
        cache = {0: x}
        late_in = mu = None
        for i in range(N_LAYER):
            if i == POST_GATE_LAYER:
                gates.update(self.post_gate(x, self.gate_scale))
            if i == MIDDLE_LAYER and hint is not None:
                x = self.hints.inject(x, hint, INJECT_MIDDLE)
            if i == SKIP_LAYER:
                x = x + torch.sigmoid(self.skip_lambda).to(dt) * gates["skip", i] * cache[SKIP_SOURCE]
            elif i not in ATTN_LAYERS:
                x = self._inject(i, resid[i, 0] * x, x0, ng, gates)
            else:
                if i in LATE_LAYERS:
                    late_in = norm(cache[MIDDLE_LAYER]) if late_in is None else late_in
                    attn_in = late_in
                else:
                    attn_in = norm(x)
                if i == LAST_LAYER:
                    cache[9] = x
                    mu = self.last_mix(x)
                    v_extra = (mu[0] * cache[0] + mu[1] * cache[MIDDLE_LAYER] + mu[2] * x).view(T, H, hd)
                    x = (1 + mu[5]) * x + mu[3] * cache[0] + mu[4] * cache[MIDDLE_LAYER]
                    ve_gate = torch.cat([mu[6], mu[7]], dim=-1).repeat_interleave(H // 2, dim=-1)
                    aux_v = ve_gate[..., None] * ve[i].view(T, H, hd) + v_extra
                elif i in VE_GATE_LAYERS:
                    gate = value_embed_gate(attn_in, ve[i], self.ve_gate_bank[VE_GATE_LAYERS.index(i)])
                    aux_v = gate[..., None] * ve[i].view(T, H, hd)
                else:
                    aux_v = None
                out = self._attention(i, attn_in, aux_v, cu_seqlens, gates, fp8,
                                      o_gain=None if i == LAST_LAYER else post[i, 0])
                if i == LAST_LAYER:
                    x = mu[8] * x + mu[9] * out + mu[10] * cache[0] + mu[11] * ng
                else:
                    x = self._inject(i, resid[i, 0] * x + out, x0, ng, gates)
            if i in NO_MLP_LAYERS:
                x = resid[i, 1] * x
                cache[i] = x
                continue
            mlp_in = norm(x)
            out = self._mlp(mlp_in, i, fp8)
            if i == LAST_LAYER:
                x = mu[12] * x + mu[13] * out
            else:
                x = resid[i, 1] * x + post[i, 1] * out
            if i == PARALLEL_MLP_LAYER:
                x = x + post[i, 1] * self._mlp(mlp_in, PARALLEL_MLP_SLOT, fp8)
            if i == SKIP_SOURCE:
                cache[i] = x
        sources = [cache[0], cache[MIDDLE_LAYER], cache[9], ve[1], cache[SKIP_SOURCE], ve[2], ve[10], ve[8],
                   mlp_in, late_in]
        x = self.post_mix(x, sources)
        if hint is not None:
            x = self.hints.inject(x, hint, INJECT_HEAD)
        return norm(x)

    @staticmethod
    def _inject(i, x, x0, ng, gates):
        if i in X0_LAYERS:
            x = x + gates["x0", i] * x0
        if i in NG_LAYERS:
            x = x + gates["ng", i] * ng
        return x

    def _attn_weights(self, layer):
        """(packed [Q; K; V] (2 H qk + H v, d), O (d, H v)) of an attention layer, cut to its widths."""
        cfg = self.cfg
        H, hd, d = cfg.n_head, cfg.head_dim, cfg.model_dim
        qk_dim, v_dim = cfg.widths(layer)
        slot = ATTN_BANK_ORDER.index(layer)
        qk = self.qk_bank[slot * H:(slot + 1) * H].reshape(2 * H, hd, d)[:, :qk_dim].reshape(2 * H * qk_dim, d)
        v = self.vo_bank[2 * slot].view(H, hd, d)[:, :v_dim].reshape(H * v_dim, d)
        o = self.vo_bank[2 * slot + 1].view(d, H, hd)[:, :, :v_dim].reshape(d, H * v_dim)
        return torch.cat([qk, v]), o

    def _attention(self, layer, x_normed, aux_v, cu_seqlens, gates, fp8, o_gain):
        cfg = self.cfg
        T, H = x_normed.shape[0], cfg.n_head
        qk_dim, v_dim = cfg.widths(layer)
        w_qkv, w_o = self._attn_weights(layer)
        l_qkv = self.attn_qkv_scale[layer]
        if fp8:
            qkv = fp8_sites.qkv_linear(x_normed, w_qkv, gain=l_qkv)
        else:
            qkv = F.linear(x_normed, (l_qkv * w_qkv).type_as(x_normed))
        q, k, v = qkv.split([H * qk_dim, H * qk_dim, H * v_dim], dim=-1)
        q, k, v = q.reshape(T, H, qk_dim), k.reshape(T, H, qk_dim), v.reshape(T, H, v_dim)
        if aux_v is not None:
            v = v + aux_v[..., :v_dim].type_as(v)
        paired, long = layer in PAIRED_LAYERS, layer in LONG_LAYERS
        y = attend(q, k, v, rotary=self.rotaries.table(qk_dim, paired), paired=paired, key_offset=long,
                   cu_seqlens=cu_seqlens, window_tokens=self.windows[1] if long else self.windows[0],
                   xsa=gates.get(("xsa", layer)), gate=gates.get(("out_gate", layer)))
        o_scale = self.attn_out_scale[layer] if o_gain is None else self.attn_out_scale[layer] * o_gain
        return F.linear(y, (o_scale * w_o).type_as(y))

    def _mlp(self, x_normed, slot, fp8):
        w_fc, w_proj = self.mlp_bank[slot, 0], self.mlp_bank[slot, 1]
        if fp8:
            return fp8_sites.fp8_mlp(x_normed, w_fc, w_proj, self.fp8_mlp_scales, slot)
        return F.relu(F.linear(x_normed, w_fc.type_as(x_normed))).square() @ w_proj.type_as(x_normed)


def describe(cfg: RecordConfig | None = None, world_size: int = 8) -> dict:
    """RecordGPT.describe() of a model built on the meta device (no memory; the record's size by default,
    its banks padded for `world_size` ranks)."""
    with torch.device("meta"):
        return RecordGPT(cfg or RecordConfig(), world_size=world_size).describe()
