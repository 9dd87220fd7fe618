"""The n-gram hint mechanism: turn (hinted token, kind) pairs into a residual-stream vector.

For each position and each n-gram length k, a hint is the token the index says follows the
n-gram plus its kind (length x count bucket x purity bucket, 126 kinds by default). Each kind
has two learned parameters:
  trust_amount[kind]    a scalar that scales the hinted token's embedding, taken from the
                        model's OWN token embedding table (so a hint looks like that token);
  trust_embedding[kind] an n_embd vector added on top, telling the model what kind it is.
The hint vector of a position is the sum over its lengths of
  trust_amount[kind] * wte[token] + trust_embedding[kind].
Absent hints (-1) contribute exactly zero: their indices are clamped to 0 for the gather and
the gathered terms are multiplied by a 0/1 mask (0 * finite == 0 exactly), so a batch with
every hint absent gives bitwise the same model output as no hints at all.

The vector is computed once per forward and added to the residual stream at three places
(INJECT_EMBED, INJECT_MIDDLE, INJECT_HEAD; see gpt.py), each with its own learned scale,
since the residual norm grows with depth.
"""
import torch
from torch import nn

INJECT_EMBED, INJECT_MIDDLE, INJECT_HEAD = 0, 1, 2  # indices into HintEmbedding.scales
N_INJECTIONS = 3

# Initial values. trust_amount = 1: a hint starts as the hinted token's plain embedding, so its
# gradient <dL/dh, wte[token]> is nonzero from the first step. trust_embedding = 0: it acts like
# a per-kind bias and still gets gradient (the scales are nonzero). Scales = 1: the hint enters
# at the scale of the embedding table, which is the scale of the residual stream at the input.
TRUST_AMOUNT_INIT = 1.0
SCALE_INIT = 1.0


class HintEmbedding(nn.Module):
    """Learned per-kind trust for hints, and the three injection scales."""

    def __init__(self, n_embd: int, n_kinds: int):
        super().__init__()
        self.trust_amount = nn.Parameter(torch.full((n_kinds,), TRUST_AMOUNT_INIT))
        self.trust_embedding = nn.Parameter(torch.zeros(n_kinds, n_embd))
        self.scales = nn.Parameter(torch.full((N_INJECTIONS,), SCALE_INIT))

    def forward(self, wte: torch.Tensor, hint_tokens: torch.Tensor, hint_kinds: torch.Tensor) -> torch.Tensor:
        """Hint vectors (B, T, n_embd) from hint_tokens, hint_kinds (B, T, K); wte is the token table."""
        present = (hint_tokens >= 0) & (hint_kinds >= 0)
        mask = present.to(wte.dtype).unsqueeze(-1)                      # (B, T, K, 1)
        tokens = hint_tokens.clamp(min=0)
        kinds = hint_kinds.clamp(min=0)
        amount = self.trust_amount[kinds].unsqueeze(-1)                 # (B, T, K, 1)
        per_length = amount * wte[tokens] + self.trust_embedding[kinds]  # (B, T, K, n_embd)
        return (per_length * mask).sum(dim=2)

    def inject(self, x: torch.Tensor, hint: torch.Tensor | None, where: int) -> torch.Tensor:
        """Add the hint vector to the residual stream x at injection point `where`."""
        if hint is None:
            return x
        return x + self.scales[where] * hint
