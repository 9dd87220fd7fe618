"""The n-gram hint mechanism: turn (hinted token, kind) pairs into a residual-stream vector.

For each position and each n-gram length k, a hint is the token the index says follows the
n-gram plus its kind (length x count bucket x purity bucket, 126 kinds by default). Each kind
has two learned parameters:
  trust_amount[kind]    a scalar that scales the hinted token's row of the table the LM head
                        reads (gpt.py passes `lm_head.weight`, tied to wte in gpt2), so a hint
                        looks like that token's output embedding and, added before the final
                        norm, raises that token's logit from the first step;
  trust_embedding[kind] an n_embd vector added on top, telling the model what kind it is.
The hint vector of a position is the sum over its lengths of
  trust_amount[kind] * token_units * table[token] + trust_embedding[kind],
token_units (residual rms / the table's std at init) putting a row in the residual stream's units.
The rows are read detached, as the record reads its followers: the head's rows learn from the
logits only. Read with their gradient, the hint path would put token_units (200 on the speedrun
arch) times the hint's gradient into the hinted tokens' head rows, beside their logit gradient
(docs/design.md, "Which table the hints read", has the measurement).

Absent hints (-1) contribute exactly zero, and their backward touches no hot row:
  * the kind tables are read through a one-hot matmul, not a gather, so their gradients are
    reductions (one_hot^T @ grad) instead of scatter-adds of every position into 126 rows. An
    absent hint's one-hot row is all zeros, so its amount is exactly 0 and it adds nothing to
    the per-kind trust embeddings;
  * an absent hint's token row is the position's own input token (rows spread like the text), not
    a clamp to token 0. The row is multiplied by its amount, 0.
Since 0 * finite == 0 exactly, a batch with every hint absent gives bitwise the same model
output as no hints at all.

The vector is computed once per forward and added to the residual stream at three places
(INJECT_EMBED, INJECT_MIDDLE, INJECT_HEAD; see gpt.py), each with its own learned scale,
since the residual norm grows with depth.
"""
import torch
from torch import nn

INJECT_EMBED, INJECT_MIDDLE, INJECT_HEAD = 0, 1, 2  # indices into HintEmbedding.scales
N_INJECTIONS = 3

# Initial values. trust_amount = 1: a hint starts as the hinted token's row (in residual units), so
# its gradient <dL/dh, table[token]> is nonzero as soon as the head's rows are (the speedrun head
# starts at zero: after its first step). trust_embedding = 0: it acts like
# a per-kind bias and still gets gradient (the scales are nonzero). Scales = 1: the hint enters
# at the scale of the embedding table, which is the scale of the residual stream at the input.
TRUST_AMOUNT_INIT = 1.0
SCALE_INIT = 1.0


class HintEmbedding(nn.Module):
    """Learned per-kind trust for hints, and the three injection scales."""

    def __init__(self, n_embd: int, n_kinds: int, token_units: float = 1.0):
        super().__init__()
        self.n_kinds = n_kinds
        self.token_units = token_units  # a table row -> residual units (the module docstring)
        self.trust_amount = nn.Parameter(torch.full((n_kinds,), TRUST_AMOUNT_INIT))
        self.trust_embedding = nn.Parameter(torch.zeros(n_kinds, n_embd))
        self.scales = nn.Parameter(torch.full((N_INJECTIONS,), SCALE_INIT))

    def forward(self, table: torch.Tensor, idx: torch.Tensor, hint_tokens: torch.Tensor,
                hint_kinds: torch.Tensor) -> torch.Tensor:
        """Hint vectors (B, T, n_embd) from hint_tokens, hint_kinds (B, T, K), -1 = absent.

        table: the token table the LM head reads (vocab, n_embd); idx (B, T) the input tokens
        (the rows absent hints point at).
        """
        present = (hint_tokens >= 0) & (hint_kinds >= 0)
        # (B, T, K, n_kinds) one-hot of each present hint's kind; all zeros for an absent one (-1
        # matches no kind). A comparison, not F.one_hot: no int64 (B, T, K, n_kinds) intermediate.
        kinds = hint_kinds.masked_fill(~present, -1).unsqueeze(-1)
        kind_onehot = (kinds == torch.arange(self.n_kinds, device=kinds.device)).to(table.dtype)
        amount = (kind_onehot @ self.trust_amount) * self.token_units               # (B, T, K)
        tokens = torch.where(present, hint_tokens, idx.unsqueeze(-1))
        hinted = (amount.unsqueeze(-1) * table.detach()[tokens]).sum(dim=2)         # (B, T, n_embd)
        return hinted + kind_onehot.sum(dim=2) @ self.trust_embedding

    def inject(self, x: torch.Tensor, hint: torch.Tensor | None, where: int) -> torch.Tensor:
        """Add the hint vector to the residual stream x at injection point `where`."""
        if hint is None:
            return x
        return x + self.scales[where] * hint
