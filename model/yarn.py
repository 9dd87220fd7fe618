"""Rotary position tables of the record arch (model/record_attention.py) and their YaRN updates.

One YarnRotary per (query/key width, paired): its state is the rotary frequencies and the softmax
scale, which YaRN rescales whenever the window its layers attend over changes; reset() returns it to
the step-0 state (the warm-up reset). RecordRotaries holds the record's three tables and applies a
window change to each (64-wide tables follow the short window, the 128-wide one the long window).

Rotary, as the record's perf/kernels/qkv_rope.py applies it: the first `rotary_dim` dims of a head
rotate in adjacent pairs (2j, 2j+1) with frequency w_j = base^(-j / (rotary_dim/2 - 1)),
j = 0 .. rotary_dim/2 - 1; the rest stay as they are. For angle theta = position * w_j:
    y[2j]   = cos(theta) * x[2j]   + sin(theta) * x[2j+1]
    y[2j+1] = cos(theta) * x[2j+1] - sin(theta) * x[2j]
The record's rotary width is 64: all of a 64-wide head, the first half of a 128-wide one; here it
is a parameter (half the full head width) so tiny models work. Positions are the indices of the
packed token stream (row t of the record's tables), not positions within a document. A paired table
(paired heads, model/record_attention.py) gives head h of token t the angle of position 2t + h % 2:
the rotary angle follows the head's parity (the record's table rows pack positions 2t and 2t+1).
cos and sin are computed in fp32 and rounded to `factor_dtype` (the record stores them in bf16).
"""
import math

import torch
from torch import nn

# Rotary frequency base: w_j = (1/1024) ** linspace(0, 1, rotary_dim/2) (the record's model/attention.py Yarn.reset).
ROTARY_BASE = 1024.0
# YaRN's rotation thresholds alpha = 1, beta = 32 (the record's model/attention.py Yarn.apply defaults): a frequency
# that turns fewer than alpha times over the old window is interpolated fully (w *= old/new), more than beta
# times not at all, linearly in between.
YARN_ALPHA = 1.0
YARN_BETA = 32.0
# Softmax-scale growth per window change: scale *= 1 + 0.2 ln(new/old) (the record's model/attention.py Yarn.apply).
YARN_SCALE_GROWTH = 0.2
# Softmax scales at step 0, not learned (the record's model/gpt.py): d_qk = 64 layers 0.13, d_qk = 128 layers 0.085.
NARROW_SOFTMAX_SCALE = 0.13
WIDE_SOFTMAX_SCALE = 0.085
# The record stores its cos/sin tables in bf16 (model/attention.py Yarn.factor1/factor2).
RECORD_FACTOR_DTYPE = torch.bfloat16


def rotary_frequencies(rotary_dim: int) -> torch.Tensor:
    """(rotary_dim/2,) fp32 step-0 frequencies base^(-j/(rotary_dim/2 - 1)), computed as the record does."""
    exponents = torch.linspace(0, 1, steps=rotary_dim // 2, dtype=torch.float32)
    return (1 / ROTARY_BASE) ** exponents


class YarnRotary(nn.Module):
    """The rotary table of the layers with query/key width `qk_dim` (and pairing `paired`).

    State: `freqs` ((rotary_dim/2,) fp32 buffer, persistent so a checkpoint keeps it) and
    `softmax_scale` (a float, kept in the state dict's extra state). apply_window_change() is the YaRN
    update; reset() the step-0 state. It has no parameters.
    """

    def __init__(self, qk_dim: int, rotary_dim: int, *, paired: bool, softmax_scale: float,
                 factor_dtype: torch.dtype = RECORD_FACTOR_DTYPE):
        super().__init__()
        if rotary_dim < 4 or rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even and >= 4 (two frequencies at least), got {rotary_dim}")
        if rotary_dim > qk_dim:
            raise ValueError(f"rotary_dim={rotary_dim} exceeds the query/key width qk_dim={qk_dim}")
        if softmax_scale <= 0:
            raise ValueError(f"softmax_scale must be positive, got {softmax_scale}")
        self.qk_dim = qk_dim
        self.rotary_dim = rotary_dim
        self.paired = paired
        self.base_softmax_scale = float(softmax_scale)
        self.factor_dtype = factor_dtype
        self.register_buffer("freqs", rotary_frequencies(rotary_dim))
        self.softmax_scale = self.base_softmax_scale

    def reset(self) -> None:
        """Back to the step-0 state: the formula's frequencies (in place: the buffer keeps its address) and scale."""
        with torch.no_grad():
            self.freqs.copy_(rotary_frequencies(self.rotary_dim))
        self.softmax_scale = self.base_softmax_scale

    def apply_window_change(self, old_tokens: int, new_tokens: int) -> None:
        """YaRN for a window change from `old_tokens` to `new_tokens` (the windows the layers attend over):
            rho = old * w / (2 pi);  gamma = clamp((rho - alpha) / (beta - alpha), 0, 1)
            w <- w * (old/new + gamma * (1 - old/new));  scale <- scale * (1 + 0.2 ln(new/old))
        in fp32 on the frequencies, in the record's order of operations (model/attention.py Yarn.apply)."""
        if old_tokens <= 0 or new_tokens <= 0:
            raise ValueError(f"window sizes must be positive, got old={old_tokens} new={new_tokens}")
        with torch.no_grad():
            rotations = old_tokens * self.freqs / (2 * math.pi)
            ratio = old_tokens / new_tokens
            gamma = torch.clamp((rotations - YARN_ALPHA) / (YARN_BETA - YARN_ALPHA), 0, 1)
            self.freqs.mul_(ratio + gamma * (1 - ratio))
        self.softmax_scale *= YARN_SCALE_GROWTH * math.log(new_tokens / old_tokens) + 1

    def positions(self, n_tokens: int, n_heads: int, device) -> torch.Tensor:
        """(T, H) fp32 rotary position of each token's head: t, or 2t + h % 2 in a paired table."""
        t = torch.arange(n_tokens, dtype=torch.float32, device=device)[:, None]
        if not self.paired:
            return t.expand(n_tokens, n_heads)
        parity = (torch.arange(n_heads, device=device) % 2).to(torch.float32)
        return 2 * t + parity[None, :]

    def factors(self, n_tokens: int, n_heads: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape (T, H, rotary_dim/2), computed in fp32 and rounded to factor_dtype."""
        theta = self.positions(n_tokens, n_heads, device)[..., None] * self.freqs.to(device)
        return theta.cos().to(self.factor_dtype), theta.sin().to(self.factor_dtype)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, H, qk_dim) -> rotated, in fp32 or wider (float64 stays float64); dims past rotary_dim unchanged."""
        T, H, d = x.shape
        if d != self.qk_dim:
            raise ValueError(f"rotary table of width {self.qk_dim} got heads of width {d}")
        dtype = torch.promote_types(x.dtype, torch.float32)
        cos, sin = (f.to(dtype) for f in self.factors(T, H, x.device))
        x = x.to(dtype)
        r = self.rotary_dim
        even, odd = x[..., :r:2], x[..., 1:r:2]
        rotated = torch.stack((cos * even + sin * odd, cos * odd - sin * even), dim=-1).flatten(-2)
        return torch.cat((rotated, x[..., r:]), dim=-1)

    def get_extra_state(self):
        return {"softmax_scale": self.softmax_scale}

    def set_extra_state(self, state) -> None:
        self.softmax_scale = float(state["softmax_scale"])

    def extra_repr(self) -> str:
        return (f"qk_dim={self.qk_dim}, rotary_dim={self.rotary_dim}, paired={self.paired}, "
                f"softmax_scale={self.softmax_scale:.6g}")


class RecordRotaries(nn.Module):
    """The record's three rotary tables (model/gpt.py init_attn), for full head width `head_dim`
    (the record: 128) and rotary width head_dim/2:
      narrow: d_qk = head_dim/2, fully rotating, scale 0.13 (layers 1, 8)
      paired: d_qk = head_dim/2, paired, scale 0.13 (the paired layers 0, 2, 5)
      wide:   d_qk = head_dim, the first half rotating, scale 0.085 (the long-window layers 3, 10)
    The narrow and paired tables follow the short window, the wide one the long window.
    """

    def __init__(self, head_dim: int, factor_dtype: torch.dtype = RECORD_FACTOR_DTYPE):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim must be even (the narrow width is half of it), got {head_dim}")
        narrow = head_dim // 2
        self.narrow = YarnRotary(narrow, narrow, paired=False, softmax_scale=NARROW_SOFTMAX_SCALE,
                                 factor_dtype=factor_dtype)
        self.paired = YarnRotary(narrow, narrow, paired=True, softmax_scale=NARROW_SOFTMAX_SCALE,
                                 factor_dtype=factor_dtype)
        self.wide = YarnRotary(head_dim, narrow, paired=False, softmax_scale=WIDE_SOFTMAX_SCALE,
                               factor_dtype=factor_dtype)

    def table(self, qk_dim: int, paired: bool) -> YarnRotary:
        """The table of a layer with query/key width qk_dim and pairing `paired`."""
        for table in (self.narrow, self.paired, self.wide):
            if table.qk_dim == qk_dim and table.paired == paired:
                return table
        raise ValueError(f"no rotary table for qk_dim={qk_dim} paired={paired} "
                         f"(have narrow {self.narrow.qk_dim}, paired {self.paired.qk_dim}, wide {self.wide.qk_dim})")

    def apply_window_change(self, short: tuple[int, int], long: tuple[int, int]) -> None:
        """YaRN at a window change, windows in tokens: short = (old, new) for the narrow and paired tables,
        long = (old, new) for the wide table; a table whose window is unchanged is left alone. The caller
        does not call it for the final validation's long-window extension (13 -> 20 blocks: no YaRN)."""
        for old, new, tables in ((*short, (self.narrow, self.paired)), (*long, (self.wide,))):
            if old != new:
                for table in tables:
                    table.apply_window_change(old, new)

    def reset(self) -> None:
        for table in (self.narrow, self.paired, self.wide):
            table.reset()
