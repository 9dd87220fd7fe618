"""The record arch's training FLOPs per token, counted from RecordGPT's matmul shapes (the MFU that
train/record_run.py reports).

Counted, per token of a rank's packed batch, in the forward (2 FLOPs per multiply-add):
  attention projections  per attention layer i with widths (qk_i, v_i) = RecordConfig.widths(i):
                         [Q; K; V] is d x (2 H qk_i + H v_i), O is H v_i x d
  attention core         per attention layer: H heads x (2 qk_i + 2 v_i) x the keys a query sees (scores
                         and the weighted sum of values); the keys are counted for full segments of the
                         step's length (StepPlan.max_seq_len) under the layer's window, the mean of
                         min(position, window) + 1 over the segment's positions (model/record_attention.py
                         step 5). Paired layers (0, 2, 5) put each token's two head halves at two positions
                         of a doubled segment: H / 2 heads over 2 positions per token, the window in positions.
                         Real documents are often shorter than the segment, so this is an upper bound.
  MLPs                   W_fc and W_proj (hidden x d each) on every layer but 7, plus layer 8's parallel MLP
  LM head                d x C, C = the step's sampled-softmax candidates, else the padded vocabulary (the
                         MTP and prefix terms read the same logits)
  gate and mix networks  W1 (gate_hidden x d) and W2 (lanes x gate_hidden) of the pre and post gates and the
                         two mixes, and the post-loop mix's W2g (sources x groups x gate_hidden)
A training step is the forward and a backward of twice its FLOPs (the gradients of the inputs and of
the weights): 3 x the forward. Not counted: norms, rotary, gates applied elementwise, the value-embedding
and smear gates (12 channels), the hints' one-hot reads, and the embedding, value-embedding and n-gram
lookups (gathers, not matmuls).
"""
from model.record_gpt import ATTN_LAYERS, LONG_LAYERS, NO_MLP_LAYERS, N_LAYER, PAIRED_LAYERS, RecordConfig
from model.record_residual import LAST_MIX_INIT, POST_LANES, POST_MIX_SOURCES, PRE_LANES, lane_widths

# forward + backward (input and weight gradients) = 3 x forward
TRAIN_FLOPS_PER_FORWARD = 3


def mean_keys(segment: int, window: int) -> float:
    """Keys a query sees on average over a full causal segment of `segment` positions under a window of
    `window` positions (position p sees min(p, window) + 1 keys, itself included)."""
    if segment < 1 or window < 0:
        raise ValueError(f"mean_keys: segment must be >= 1 and window >= 0, got {segment}, {window}")
    w = min(window, segment - 1)
    # positions 0..w see p + 1 keys; positions w+1..segment-1 see w + 1
    return ((w + 1) * (w + 2) / 2 + (segment - 1 - w) * (w + 1)) / segment


def forward_flops_per_token(cfg: RecordConfig, *, windows, segment_tokens: int, candidates: int | None) -> float:
    """Forward FLOPs per token (the module docstring); windows (short, long) in tokens (StepPlan.window_tokens),
    segment_tokens StepPlan.max_seq_len, candidates StepPlan.candidates (None: the full softmax)."""
    d, H, hidden, g = cfg.model_dim, cfg.n_head, cfg.mlp_hidden, cfg.gate_hidden
    flops = 0.0
    for i in ATTN_LAYERS:
        qk, v = cfg.widths(i)
        flops += 2 * d * (2 * H * qk + H * v) + 2 * H * v * d
        window = windows[1] if i in LONG_LAYERS else windows[0]
        keys = mean_keys(2 * segment_tokens, window) if i in PAIRED_LAYERS else mean_keys(segment_tokens, window)
        flops += H * (2 * qk + 2 * v) * keys
    mlps = N_LAYER - len(NO_MLP_LAYERS) + 1  # + layer 8's parallel MLP
    flops += mlps * 2 * (2 * hidden * d)
    flops += 2 * d * (candidates or cfg.padded_vocab_size)
    lanes = sum(lane_widths(PRE_LANES, H)) + sum(lane_widths(POST_LANES, H)) + len(LAST_MIX_INIT) + POST_MIX_SOURCES
    flops += 2 * (4 * g * d + lanes * g + POST_MIX_SOURCES * (d // cfg.mix_group_width) * g)
    return flops


def train_flops_per_token(cfg: RecordConfig, plan) -> float:
    """Training FLOPs per token of one step (a StepPlan of train/record_schedule.py): 3 x the forward."""
    return TRAIN_FLOPS_PER_FORWARD * forward_flops_per_token(cfg, windows=plan.window_tokens,
                                                             segment_tokens=plan.max_seq_len,
                                                             candidates=plan.candidates)
