"""Tests for data/prefix_tokens.py: the prefix-token table equals a brute-force statement of its rule."""
import numpy as np
import pytest

from data.prefix_tokens import NO_PREFIX, prefix_table
from data.tokenizer import EOT_TOKEN, gpt2

PADDED_VOCAB = 50304  # the record's padded vocabulary (50,257 rounded up to a multiple of 128)


@pytest.fixture(scope="module")
def vocab():
    """The bytes of every token id, as a list and a zero-padded uint8 matrix, their lengths, and the
    token ids by first byte."""
    ranks = gpt2()._mergeable_ranks
    tokens = [b""] * len(ranks)
    for b, t in ranks.items():
        tokens[t] = b
    lengths = np.array([len(b) for b in tokens])
    matrix = np.zeros((len(tokens), lengths.max()), dtype=np.uint8)
    for t, b in enumerate(tokens):
        matrix[t, :len(b)] = np.frombuffer(b, dtype=np.uint8)
    by_first_byte = [np.flatnonzero(matrix[:, 0] == c) for c in range(256)]
    return tokens, matrix, lengths, by_first_byte


def brute_force_prefix(t, tokens, matrix, lengths, by_first_byte):
    """Among all tokens, those whose bytes are a proper, non-empty prefix of token t's; the longest.
    (Only tokens with t's first byte can be one: the others are compared no further.)"""
    b = np.frombuffer(tokens[t], dtype=np.uint8)
    n = len(b)
    same_start = by_first_byte[b[0]]
    agrees = (matrix[same_start, :n] == b) | (np.arange(n) >= lengths[same_start, None])  # U's bytes match t's
    candidates = same_start[agrees.all(axis=1) & (lengths[same_start] < n)]
    return int(candidates[np.argmax(lengths[candidates])]) if len(candidates) else NO_PREFIX


def test_table_equals_brute_force_on_a_sample(vocab):
    tokens, _, lengths, _ = vocab
    table = prefix_table(PADDED_VOCAB)
    rng = np.random.default_rng(0)
    sample = np.concatenate([rng.choice(len(tokens), 800, replace=False),
                             np.argsort(lengths)[-50:],  # the longest tokens (runs of spaces, dashes, ...)
                             np.arange(256)])            # every single byte: none has a proper prefix
    for t in sample:
        assert table[t] == brute_force_prefix(t, *vocab), (t, tokens[t])


def test_known_prefixes_and_the_rows_without_one():
    enc = gpt2()
    table = prefix_table(PADDED_VOCAB)
    assert table.dtype == np.int64 and table.shape == (PADDED_VOCAB,)
    for word, prefix in ((" the", b" th"), ("Hello", b"Hell"), (" world", b" wor")):
        assert enc.decode_single_token_bytes(table[enc.encode_single_token(word)]) == prefix
    assert (table[:256] == NO_PREFIX).all()  # single bytes
    assert (table[EOT_TOKEN:] == NO_PREFIX).all()  # <|endoftext|> and the padding rows
    assert (table[256:EOT_TOKEN] >= 0).all()  # every multi-byte token has at least its first byte


def test_a_vocabulary_larger_than_the_table_is_refused():
    with pytest.raises(ValueError, match="vocab_size 1000"):
        prefix_table(1000)
