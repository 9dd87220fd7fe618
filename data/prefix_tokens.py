"""The prefix-token table of the record's prefix-token loss: prefix(T) = the token whose bytes are the
longest proper prefix of T's bytes, -1 where there is none.

The record (its model/prefix_prediction.py) adds a second cross-entropy term at each position, whose
target is prefix(y) of the next-token target y, so a model that is unsure where a word ends still
learns its start. The table comes from GPT-2's BPE vocabulary alone (tiktoken's mergeable ranks),
never from a corpus. Single-byte tokens, <|endoftext|> and the padding rows up to the model's padded
vocabulary have no prefix (-1). The model receives the table as an int64 tensor (model/record_loss.py
skips the term where it is -1); `model/` never imports this module.
"""
import numpy as np

from data.tokenizer import gpt2

NO_PREFIX = -1  # the table's value for a token without a proper prefix token; the loss skips it


def prefix_table(vocab_size=None, ranks=None):
    """int64 [vocab_size] with prefix(T) for every token id T < len(ranks), -1 elsewhere.

    `ranks` maps token bytes -> token id (default: GPT-2's mergeable ranks, <|endoftext|> excluded);
    `vocab_size` (default len(ranks)) may exceed it, e.g. the model's padded 50,304 rows.
    For each token, its prefixes are probed from the longest down; a GPT-2 token is at most 128 bytes,
    so this is at most a few hundred dictionary lookups per token (about 0.1 s for the vocabulary)."""
    ranks = gpt2()._mergeable_ranks if ranks is None else ranks
    vocab_size = len(ranks) if vocab_size is None else int(vocab_size)
    if vocab_size < len(ranks) or max(ranks.values(), default=-1) >= vocab_size:
        raise ValueError(f"prefix_table: vocab_size {vocab_size} is smaller than the tokenizer's "
                         f"{max(ranks.values(), default=-1) + 1} token ids")
    table = np.full(vocab_size, NO_PREFIX, dtype=np.int64)
    for token_bytes, token in ranks.items():
        for length in range(len(token_bytes) - 1, 0, -1):
            prefix = ranks.get(token_bytes[:length])
            if prefix is not None:
                table[token] = prefix
                break
    return table
