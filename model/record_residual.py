"""The record arch's residual machinery: the small networks that gate and mix the residual stream
(the record's model/gpt.py init_mudd, init_mudd_gate, forward_mudd*, the value-embedding gates and
the smear; RECORD.md section 4). The layer loop that applies them is model/record_gpt.py's.

Every network here is  y = (W2 gelu(W1 x) + b2) * scale  with W1 [hidden, d] uniform in
+-1/sqrt(d) (torch's kaiming_uniform(a=sqrt(5)), the record's init), W2 = 0, and b2 stored divided by
`scale` (the record stores its biases "pre-scaled": the effective bias is b2 * scale, so at init
y = the effective bias on every token).

  GateNetwork  the two per-token gate networks, scale = s_g (one learned scalar shared by both, 0.1 at
               init). The pre gate reads x0 and serves layers 0-3; the post gate reads the residual
               entering layer 4 and serves layers 4-10. Their lanes (PRE_LANES, POST_LANES, per head
               where the width is "heads"), in the record's order, and effective inits:
                 pre:  XSA strength of layers 1, 3 (0); output gate of layer 3 (0.25); x0 gates of
                       layers 0, 1, 2 (0); n-gram gates of layers 0, 1 (0.05)   -> 3 H + 5 = 17 lanes
                 post: output gate of layer 10 (0.25); x0 gates of 4, 5, 7 (0); n-gram gates of 4, 5,
                       9 (0.05); the layer-6 skip gate (0.5)                    -> H + 7 = 11 lanes
  LastLayerMix the layer-10 dense mix ("MUDD"), scale fixed 0.1: 14 coefficients mu0..mu13 from the
               residual entering layer 10 (LAST_MIX_INIT gives the effective inits; the layer loop
               says what each multiplies).
  PostLoopMix  the mix after the last layer: 10 per-token coefficients mu_k (scale 0.1) plus per
               channel-group deltas 0.1 W2g_k,g h from the same hidden h, group width 64 (8 groups at
               d = 512);  x_g <- x_g + sum_k (mu_k + delta_k,g) S_k,g  over the sources S_k. Init:
               source 1 (cache[7]) at -0.5, the rest 0; W2 = W2g = 0.

The record stores the two gate networks, and the two mixes, stacked in shared tensors padded to the
larger lane count ([2, 17, 64], [2, 14, 64], W2g [14, groups, 64]); the padding rows never reach the
forward. Here each network has its own tensors of its own size: the same numbers, every row used.

Also here: the value-embedding gate of layers 1, 2, 8 (2 sigmoid(W [norm(in)[:6], ve[:6]]) per head,
W [heads, 12] = 0 at init, so 1) and the smear of the embedding by its previous token.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

# The hidden width of every gate and mix network (the record's mudd_dim, mudd_gate_dim).
GATE_HIDDEN = 64
# s_g at init, the gate networks' learned output scale (the record's MUDD_GATE_SCALE).
GATE_SCALE_INIT = 0.1
# The mixes' fixed output scale (the record's _mudd_scale).
MIX_SCALE = 0.1
# Lane layouts, in the record's order (its unpack_pre_mudd_gate / unpack_post_mudd_gate): (kind, layer,
# width), width "heads" = one lane per head. Effective bias at init per kind (its init_mudd_gate).
PRE_LANES = (("xsa", 1, "heads"), ("xsa", 3, "heads"), ("out_gate", 3, "heads"),
             ("x0", 0, 1), ("x0", 1, 1), ("x0", 2, 1), ("ng", 0, 1), ("ng", 1, 1))
POST_LANES = (("out_gate", 10, "heads"), ("x0", 4, 1), ("x0", 5, 1), ("x0", 7, 1),
              ("ng", 4, 1), ("ng", 5, 1), ("ng", 9, 1), ("skip", 6, 1))
LANE_INIT = {"xsa": 0.0, "out_gate": 0.25, "x0": 0.0, "ng": 0.05, "skip": 0.5}
# The layer-10 mix's 14 effective coefficients at init (the record's init_mudd bs_init[0]): mu6, mu7 the
# value-embedding gate of heads 0-1 / 2-3 (2, the other layers' 2 sigmoid(0)); mu8 and mu12 the residual
# lambdas (sqrt(1.1)); mu9, mu13 the post lambdas (1); mu11 the n-gram gate (0.05); the rest 0.
RESID_LAMBDA_INIT = math.sqrt(1.1)
LAST_MIX_INIT = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 2.0, RESID_LAMBDA_INIT, 1.0, 0.0, 0.05, RESID_LAMBDA_INIT, 1.0)
# The post-loop mix: 10 sources, source 1 (cache[7]) at -0.5 (the record's "backout", bs_init[1, 1]).
POST_MIX_SOURCES = 10
POST_MIX_INIT = (0.0, -0.5) + (0.0,) * (POST_MIX_SOURCES - 2)
# Channels per group of the post-loop deltas (the record's MUDD_GROUPS = MODEL_DIM // 64).
POST_MIX_GROUP_WIDTH = 64
# The value-embedding gate reads this many leading channels of the normed input and of the value
# embedding (the record's VALUE_EMBED_GATE_CHANNELS); its output is 2 sigmoid(.) (VE_GATE_MAX).
VE_GATE_CHANNELS = 6
VE_GATE_MAX = 2.0
# The smear gate reads the token's first 12 channels (the record's smear_gate = Linear(12, 1)).
SMEAR_CHANNELS = 12


def lane_widths(lanes, n_head: int) -> list[int]:
    return [n_head if width == "heads" else width for _, _, width in lanes]


def _first_layer(d: int, hidden: int) -> nn.Parameter:
    """W1 [hidden, d], uniform in +-1/sqrt(d) (kaiming_uniform with a = sqrt(5), the record's)."""
    w = torch.empty(hidden, d)
    nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    return nn.Parameter(w)


class MixNetwork(nn.Module):
    """(W2 gelu(W1 x) + b2) * scale over `n_out` outputs; b2 starts at effective / scale (so scale must be
    the value `scale` has at init). forward returns the outputs (..., n_out) and the hidden gelu(W1 x)."""

    def __init__(self, d: int, effective_init, init_scale: float, hidden: int = GATE_HIDDEN):
        super().__init__()
        self.w1 = _first_layer(d, hidden)
        self.w2 = nn.Parameter(torch.zeros(len(effective_init), hidden))
        self.b2 = nn.Parameter(torch.tensor(effective_init, dtype=torch.float32) / init_scale)

    def hidden_and_out(self, x: torch.Tensor, scale):
        h = F.gelu(F.linear(x, self.w1.type_as(x)))
        return h, (F.linear(h, self.w2.type_as(h)) + self.b2.type_as(h)) * scale


class GateNetwork(MixNetwork):
    """A per-token gate network over `lanes`; its scale is the shared learned s_g, passed in."""

    def __init__(self, d: int, n_head: int, lanes, hidden: int = GATE_HIDDEN):
        widths = lane_widths(lanes, n_head)
        init = [LANE_INIT[kind] for (kind, _, _), w in zip(lanes, widths) for _ in range(w)]
        super().__init__(d, init, GATE_SCALE_INIT, hidden)
        self.lanes, self.widths = lanes, widths

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> dict:
        """{(kind, layer): (T, width)} gates of the (T, d) input."""
        _, y = self.hidden_and_out(x, scale.type_as(x))
        return {(kind, layer): part for (kind, layer, _), part in zip(self.lanes, y.split(self.widths, dim=-1))}


class LastLayerMix(MixNetwork):
    """The layer-10 mix: forward -> the 14 coefficients, each (T, 1)."""

    def __init__(self, d: int, hidden: int = GATE_HIDDEN):
        super().__init__(d, LAST_MIX_INIT, MIX_SCALE, hidden)

    def forward(self, x: torch.Tensor) -> tuple:
        return self.hidden_and_out(x, MIX_SCALE)[1].split(1, dim=-1)


class PostLoopMix(MixNetwork):
    """The post-loop mix of `sources` (each (T, d)) into x (T, d)."""

    def __init__(self, d: int, hidden: int = GATE_HIDDEN, group_width: int = POST_MIX_GROUP_WIDTH):
        super().__init__(d, POST_MIX_INIT, MIX_SCALE, hidden)
        if d % group_width:
            raise ValueError(f"PostLoopMix: model width {d} is not a multiple of the group width {group_width}")
        self.groups = d // group_width
        self.w2g = nn.Parameter(torch.zeros(POST_MIX_SOURCES, self.groups, hidden))

    def forward(self, x: torch.Tensor, sources: list) -> torch.Tensor:
        if len(sources) != POST_MIX_SOURCES:
            raise ValueError(f"PostLoopMix: expected {POST_MIX_SOURCES} sources, got {len(sources)}")
        h, mu = self.hidden_and_out(x, MIX_SCALE)                                     # (T, K)
        deltas = torch.einsum("td,kgd->tkg", h, self.w2g.type_as(h)) * MIX_SCALE       # (T, K, G)
        coef = mu[..., None] + deltas                                                 # (T, K, G)
        mixed = x.unflatten(-1, (self.groups, -1))
        for k, src in enumerate(sources):
            mixed = mixed + coef[:, k, :, None] * src.type_as(x).unflatten(-1, (self.groups, -1))
        return mixed.flatten(-2)


def value_embed_gate(normed_in: torch.Tensor, ve: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(T, heads) gate 2 sigmoid(W [normed_in[:, :6], ve[:, :6]]) of one layer; w [heads, 12]."""
    gate_in = torch.cat([normed_in[:, :VE_GATE_CHANNELS], ve[:, :VE_GATE_CHANNELS].type_as(normed_in)], dim=-1)
    return VE_GATE_MAX * torch.sigmoid(F.linear(gate_in, w.type_as(gate_in)))


def smear(e: torch.Tensor, gate_w: torch.Tensor, strength: torch.Tensor) -> torch.Tensor:
    """e_t <- e_t + l_sm sigmoid(w_sm . e_t[:12]) e_(t-1) for t >= 1 over the packed (T, d) batch (it crosses
    documents, as the record's); gate_w [1, 12], strength l_sm a 0-d tensor."""
    gate = strength.type_as(e) * torch.sigmoid(F.linear(e[1:, :SMEAR_CHANNELS], gate_w.type_as(e)))
    return torch.cat([e[:1], e[1:] + gate * e[:-1]])
