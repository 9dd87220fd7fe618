"""What the record arch keeps in one GPU's memory between steps, counted from the model as built (the
meta device is enough) and the optimizers' rules: the weights in the record's dtypes, their gradients,
ANVIL's rails, lane energies and mantissas, Adam's sums and moments, value_embeds' Adam, the n-gram
table's shard with its row Adam and row cache, and the four tail averages. Activations and the
compiled graphs' workspaces are not counted: they depend on the kernels, and the record measured them
(its log's peak) rather than derived them. --describe prints it as `memory_per_gpu`.

Rules (the modules that hold the state): model/record_gpt.py cast_to_record_dtypes (bf16 except the
scalars, lambdas, s_g and hint parameters), model/anvil.py (per owned unit: two fp32 rails and a
uint16 mantissa for a bf16 bank, and one fp32 lane energy per lane), model/record_adam.py (replicated:
an fp32 sum, m and v per weight; lm_head / embed: a full fp32 sum and the rank's rows of m and v),
model/row_adam.py value_embed_adam_bytes_per_rank, model/ngram_table.py table_bytes_per_rank,
model/tail_average.py (fp32, over the rank's shard of each averaged weight).
"""
from model.ngram_table import table_bytes_per_rank
from model.row_adam import value_embed_adam_bytes_per_rank

# The record's GPU: an H100 with 80 GB of HBM3 (RECORD.md section 1), as torch reports it.
H100_BYTES = 80 * 10 ** 9
FP32_LABELS = ("scalars", "resid_lambdas", "post_lambdas", "s_g", "hint_scales", "hint_embed")
SHARDED_ADAM_LABELS = ("lm_head", "embed")
BANK_LABELS = ("qk_bank", "vo_bank", "mlp_bank")
# Per label, how many tail averages hold an fp32 copy of its shard (model/tail_average.py's four).
TAIL_COPIES = {"lm_head": 1, "embed": 1, "qk_bank": 1, "vo_bank": 2, "mlp_bank": 2, "value_embeds": 1}


def record_memory_per_gpu(labelled: dict, *, world_size: int, ngram_rows: int, dim: int,
                          tokens_per_rank: int, val_tokens_per_rank: int) -> dict:
    """Bytes per GPU by part, their total and the share of an H100 (the module docstring)."""
    numel = {label: sum(p.numel() for p in ps) for label, ps in labelled.items()}
    weight_bytes = {label: n * (4 if label in FP32_LABELS else 2) for label, n in numel.items()}
    anvil = 0
    for label in BANK_LABELS:
        (p,) = labelled[label]
        rows, cols = p.shape[-2], p.shape[-1]
        units = p.numel() // (rows * cols) // world_size
        anvil += units * (rows * cols * (2 * 4 + 2) + 4 * max(rows, cols))
    adam = 0
    for label, n in numel.items():
        if label in BANK_LABELS or label == "value_embeds":
            continue
        adam += 4 * n + (8 * n // world_size if label in SHARDED_ADAM_LABELS else 8 * n)
    (ve,) = labelled["value_embeds"]
    table = table_bytes_per_rank(ngram_rows, dim, world_size, step_tokens=tokens_per_rank,
                                 eval_tokens=val_tokens_per_rank)["total"]
    parts = {
        "weights": sum(weight_bytes.values()),
        "gradients": sum(weight_bytes.values()),
        "anvil_state": anvil,
        "adam_state": adam,
        "value_embed_adam": value_embed_adam_bytes_per_rank(ve.shape[0], ve.shape[1], world_size)["total"],
        "ngram_table": table,
        "tail_averages": sum(4 * numel[label] * copies // world_size for label, copies in TAIL_COPIES.items()),
    }
    total = sum(parts.values())
    return {**parts, "total": total, "h100_share": round(total / H100_BYTES, 4)}
