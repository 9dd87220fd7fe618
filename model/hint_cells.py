"""The record's hint representation ("record"): one cell per position and its followers' distribution.

A position's hint comes from the deepest n-gram match of its context (hints/cells.py makes them):
its cell (depth x count bin x purity bin, 126 with three lengths; -1: no match) and the distinct
tokens that followed the matching occurrences, with their counts (F of them, -1 / 0 padded). The
hint vector is

    cell_scale[cell] * sum_f (count_f / sum counts) * table[follower_f].detach()  +  cell_embedding[cell]

the count-weighted mean of the followers' rows of the table the LM head reads, read without a
gradient, scaled per cell, plus a per-cell vector.
It is exactly zero where nothing matched: the cell tables are read through a one-hot matmul, so a
-1 cell has scale 0 and embedding 0 (and its gradient reductions get nothing from it), and an
absent follower's row is the position's own input token, weighted 0.

It enters the residual stream at three places, each with its own learned scale (gpt.py):
  INJECT_EMBED   added to the raw token embedding BEFORE the embedding's norm (speedrun), so it is
                 part of x0, which the embedding skips re-add in every block;
  INJECT_MIDDLE  after record_middle_layer(n_layer) blocks: the record injects before layer 7 of 11;
  INJECT_HEAD    after the last block, before the final norm.

Where the followers' rows come from. The record reads them from `embed.weight`, which is tied to
its LM head (N(0, 0.005) at init, the head copied into the embedding after every step until 10 steps
before the end), so the follower mean is the followers' OUTPUT embedding: added before the final norm
it raises exactly the followers' logits, from step 0. So the caller passes the table the LM head
reads (gpt.py: `lm_head.weight`, which gpt2 ties to wte), never an untied input table the head does
not see: at GPT-2's 50,257 tokens an unrelated input table gives a random direction that the model
cannot learn to decode (tests/test_hints_usable.py). The rows are read detached, as the record reads
them: the table learns from the loss on the tokens, not through the hints.

Units. The record's constants (cell scale 4.0, site scales 0.1 / 8.0 / 8.0, and the cell
embedding's Adam steps) are in its units: the hint's table and its input embedding are one table of
std 0.005 (RECORD_TABLE_STD) and the residual stream is normed to rms 1 (x0 = norm(e)). Here three
scales can differ: `table_std`, the std at init of the table the hint reads (the LM head's rows);
`embed_std`, the input embedding's (speedrun 1.0, read through an RMSNorm; gpt2 0.02, tied, so the
same table); `residual_rms`, the residual stream's rms at the input (speedrun 1.0; gpt2 about
the table's, wte + wpe unnormed). So that every ratio at init is the record's while the learned
values, and so Adam's absolute steps, stay in its units:
  * the hint is kept in the hint table's units: the cell embedding is multiplied by
    table_std / RECORD_TABLE_STD (`embedding_units`);
  * INJECT_EMBED multiplies by embed_std / table_std (`input_units`): hint / embedding is then
    the record's 0.1 x 4.0 x (follower mean / embedding row);
  * INJECT_MIDDLE and INJECT_HEAD multiply by RECORD_TABLE_STD * residual_rms / table_std
    (`residual_units`), the hint back in the record's units against a residual of the record's rms.
On the speedrun arch table_std is the head's init std (GPTConfig.head_init_std) or, for the
default zero-initialised head, the record's 0.005, the units its rows are taken to grow in; at
0.005 the cell-embedding and residual factors are 1 and the input one is 200. On gpt2 (one tied
table of std 0.02, an unnormed residual of about its size): 4, 1 and 0.005.
"""
import torch
from torch import nn

from model.hint_embedding import INJECT_EMBED, N_INJECTIONS

# The record's initial values (records/track_1_short/2026-10-01_ExactMatchRetrieval, model/gpt.py):
# warm inits, tuned there with the scales' 10x learning rate.
CELL_SCALE_INIT = 4.0
SITE_SCALE_INIT = (0.1, 8.0, 8.0)   # INJECT_EMBED, INJECT_MIDDLE, INJECT_HEAD
# The record's token table std at init (its LM head's N(0, 0.005), copied into the tied embedding).
RECORD_TABLE_STD = 0.005
# The record's middle injection: before layer 7 of its 11 (about 2/3 of the depth).
RECORD_MIDDLE = (7, 11)


def record_middle_layer(n_layer: int) -> int:
    """The 0-based block after which INJECT_MIDDLE goes: after round(n_layer * 7 / 11) blocks (the
    record's "before layer 7 of 11"), at least one block and at most n_layer - 1.
    11 layers: after block 6; 12: after block 7; 4 (demo): after block 2."""
    done = round(n_layer * RECORD_MIDDLE[0] / RECORD_MIDDLE[1])
    return min(max(done, 1), n_layer - 1) - 1


class CellHints(nn.Module):
    """Per-cell scale and embedding of the record's hint, and its three injection scales."""

    def __init__(self, n_embd: int, n_cells: int, table_std: float, embed_std: float, residual_rms: float):
        super().__init__()
        self.n_cells = n_cells
        self.cell_scale = nn.Parameter(torch.full((n_cells,), CELL_SCALE_INIT))
        self.cell_embedding = nn.Parameter(torch.zeros(n_cells, n_embd))
        self.scales = nn.Parameter(torch.tensor(SITE_SCALE_INIT))
        assert len(SITE_SCALE_INIT) == N_INJECTIONS
        self.embedding_units = table_std / RECORD_TABLE_STD                 # cell embedding -> table units
        self.input_units = embed_std / table_std                            # hint -> input embedding units
        self.residual_units = RECORD_TABLE_STD * residual_rms / table_std  # hint -> residual units

    def forward(self, table: torch.Tensor, idx: torch.Tensor, followers: torch.Tensor, weights: torch.Tensor,
                cells: torch.Tensor) -> torch.Tensor:
        """Hint vectors (B, T, n_embd) in the hint table's units.

        table: the token table the LM head reads (vocab, n_embd); idx (B, T): the input tokens (the rows absent followers point at);
        followers (B, T, F) int64, -1 padding; weights (B, T, F) their counts, 0 padding;
        cells (B, T) int64, -1 where nothing matched.
        """
        # in the cell parameters' dtype (float32), the table's rows read into it: the record computes the
        # follower mean in fp32 from its bf16 table and casts the hint to bf16 (a float32 table: no casts)
        dtype = self.cell_scale.dtype
        present = followers >= 0
        w = weights.to(dtype).masked_fill(~present, 0)
        w = w / w.sum(dim=-1, keepdim=True).clamp_min(1)                                # count-weighted mean
        rows = table.detach()[torch.where(present, followers, idx.unsqueeze(-1))].to(dtype)  # (B, T, F, d)
        mean = (w.unsqueeze(-1) * rows).sum(dim=2)                                      # (B, T, d)
        # (B, T, n_cells) one-hot of the cell; all zeros for -1 (a comparison: no int64 intermediate)
        onehot = (cells.unsqueeze(-1) == torch.arange(self.n_cells, device=cells.device)).to(dtype)
        scale = onehot @ self.cell_scale                                                # (B, T), 0 where none
        hint = scale.unsqueeze(-1) * mean + (onehot @ self.cell_embedding) * self.embedding_units
        return hint.to(table.dtype)

    def inject(self, x: torch.Tensor, hint: torch.Tensor | None, where: int) -> torch.Tensor:
        """Add the hint vector to x at injection point `where` (INJECT_EMBED: the raw embedding)."""
        if hint is None:
            return x
        units = self.input_units if where == INJECT_EMBED else self.residual_units
        return x + (self.scales[where] * units) * hint
