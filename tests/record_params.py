"""Small labelled parameter sets shaped like RecordGPT's (the labels and the shapes' structure of
the record's parameters, at tiny widths), their gradients, and a gloo launcher: what the tests of
the record's optimizers and tail averages build on.

Gradients are dyadic (small integers / 64), so sums and means over two ranks are exact in float32
and in bf16: a two-rank run can be compared bitwise with one process fed the mean."""
import os

import torch
import torch.distributed as dist

D, HEAD_DIM, HIDDEN, VOCAB = 32, 8, 64, 64   # model width, nominal head width, MLP hidden, padded vocab
QK_UNITS, VO_UNITS, MLP_SLOTS = 28, 14, 12   # the record's: 7 attention layers x 4 head pairs; V, O x 7; 12 slots
N_CELLS = 8

BANK_SHAPES = {
    "qk_bank": (QK_UNITS, 2 * HEAD_DIM, D),
    "vo_bank": (VO_UNITS, D, D),
    "mlp_bank": (MLP_SLOTS, 2, HIDDEN, D),
}
ADAM_SHAPES = {
    "scalars": [(11,), (11,), (), ()],        # l_qkv, l_o, l_sm, l_skip
    "smear_gate": [(1, 12)],
    "ve_gate_bank": [(3, 4, 12)],
    "post_lambdas": [(11, 2)],
    "resid_lambdas": [(11, 2)],
    "lm_head": [(D, VOCAB)],
    "embed": [(VOCAB, D)],
    "mudd_w1": [(64, D)], "mudd_w2": [(14, 64)], "mudd_w2g": [(80, 64)], "mudd_b2": [(14,)],
    "mudd_gate_w1": [(64, D)], "mudd_gate_w2": [(28, 64)], "mudd_gate_b2": [(28,)], "s_g": [()],
    "hint_scales": [(N_CELLS,), (), (), ()],
    "hint_embed": [(N_CELLS, D)],
}


def labelled_params(seed: int = 0, bank_dtype=torch.float32, adam: bool = True, value_embeds: bool = False) -> dict:
    """{label: [parameters]}: the three banks (weights ~ N(0, 1)), the dense Adam groups if `adam`,
    and value_embeds if asked. embed starts as lm_head^T, as RecordGPT ties them at init."""
    g = torch.Generator().manual_seed(seed)
    out = {label: [torch.nn.Parameter(torch.randn(shape, generator=g).to(bank_dtype))]
           for label, shape in BANK_SHAPES.items()}
    if adam:
        for label, shapes in ADAM_SHAPES.items():
            out[label] = [torch.nn.Parameter(0.1 * torch.randn(shape, generator=g)) for shape in shapes]
        out["embed"][0].data.copy_(out["lm_head"][0].data.T)
    if value_embeds:
        out["value_embeds"] = [torch.nn.Parameter(0.01 * torch.randn(4 * VOCAB, D, generator=g))]
    return out


def dyadic_like(t: torch.Tensor, seed: int) -> torch.Tensor:
    """A gradient for t: integers in [-16, 16] / 64, in t's dtype."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-16, 17, t.shape, generator=g).float() / 64).to(t.dtype)


def set_grads(labelled: dict, seed: int, labels=None) -> None:
    """A fresh dyadic .grad on every parameter of `labels` (all by default)."""
    for i, (label, params) in enumerate(sorted(labelled.items())):
        if labels is None or label in labels:
            for j, p in enumerate(params):
                p.grad = dyadic_like(p, seed * 1000 + i * 10 + j)


def mean_grads(labelled: dict, seeds: list[int], labels=None) -> None:
    """.grad = the mean of the set_grads gradients of `seeds` (one per rank), exactly."""
    for i, (label, params) in enumerate(sorted(labelled.items())):
        if labels is None or label in labels:
            for j, p in enumerate(params):
                grads = [dyadic_like(p, s * 1000 + i * 10 + j).float() for s in seeds]
                p.grad = (sum(grads) / len(seeds)).to(p.dtype)


def init_gloo(rank: int, world: int, init_file: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
