"""Tests for data/canonical_mask.py: every masked pair is one the tokenizer never emits (brute force:
encode the pair's text, alone and inside other text), the mask catches nearly all non-canonical pairs
(measured below), and the rule's stated exclusions hold."""
import unicodedata

import numpy as np
import pytest
import tiktoken

from data import canonical_mask as cm
from data.tokenizer import EOT_TOKEN, GPT2_PAT_STR, gpt2

# Measured on GPT-2's vocabulary, 200,000 uniform random pairs (seed 0): 1.35% of them are not valid
# UTF-8 together (no text has them alone), 2.88% of the rest are non-canonical, and the mask sets 99.67%
# of those; none of the canonical ones. The floor leaves room for another sample.
MIN_SHARE_MASKED = 0.99
SMALL_VOCAB = 512  # the first 512 ids of GPT-2 (256 bytes + its first 256 merges): a BPE vocabulary of its own


@pytest.fixture(scope="module")
def enc():
    return gpt2()


@pytest.fixture(scope="module")
def mask():
    return cm.build_canonical_mask(cm.PADDED_VOCAB)


def token_texts(enc, n):
    return [enc.decode_single_token_bytes(t) for t in range(n)]


def is_canonical(enc, tokens, p, x, left=b"", right=b""):
    """Brute force: does encoding the text left + p + x + right emit p and x, in place? None when
    those bytes are not UTF-8 text."""
    try:
        text = (left + tokens[p] + tokens[x] + right).decode("utf-8")
    except UnicodeDecodeError:
        return None
    at = 0
    ids = enc.encode_ordinary(text)
    for i, t in enumerate(ids):
        if at == len(left):
            return bool(t == p and i + 1 < len(ids) and ids[i + 1] == x)
        at += len(tokens[t])
    return False


def test_random_pairs_masked_ones_are_never_emitted_and_nearly_all_others_are_caught(enc, mask):
    tokens = token_texts(enc, EOT_TOKEN)
    rng = np.random.default_rng(0)
    p, x = rng.integers(0, EOT_TOKEN, 50_000), rng.integers(0, EOT_TOKEN, 50_000)
    canonical = [is_canonical(enc, tokens, a, b) for a, b in zip(p, x)]
    valid = np.array([c is not None for c in canonical])
    canonical = np.array([bool(c) for c in canonical])
    masked = cm.is_masked(mask, p, x)
    assert not (masked & canonical).any(), "a masked pair is the tokenizer's own encoding"
    non_canonical = valid & ~canonical
    assert 0.01 < non_canonical.mean() < 0.06  # about 2.9%: random pairs are mostly canonical
    share = (masked & non_canonical).sum() / non_canonical.sum()
    assert share >= MIN_SHARE_MASKED, f"the mask sets only {share:.4f} of the non-canonical pairs"


def test_masked_pairs_are_never_emitted_in_any_context(enc, mask):
    """The mask is applied mid-document, so each set pair must be non-canonical whatever surrounds it."""
    tokens = token_texts(enc, EOT_TOKEN)
    rng = np.random.default_rng(1)
    lefts = [b"", b"a", b" ", b"\n", b"7", b".", b"'", b" the"]
    rights = [b"", b"a", b" ", b"\n", b"7", b".", b"s", b" the"]
    checked = 0
    for p in rng.integers(0, EOT_TOKEN, 300):
        xs = np.flatnonzero(np.unpackbits(mask[p], bitorder="little"))
        for x in rng.choice(xs, min(10, len(xs)), replace=False) if len(xs) else ():
            for left in lefts:
                for right in rights:
                    assert is_canonical(enc, tokens, p, x, left, right) is False, (tokens[p], tokens[x], left, right)
            checked += 1
    assert checked > 1000


def test_known_pairs_and_the_exclusions(enc, mask):
    def masked(a, b):
        return bool(cm.is_masked(mask, enc.encode_single_token(a), enc.encode_single_token(b)))
    # BPE would join these across the seam: " th" + "e" is " the", "12" + "3" is "123"
    for a, b in ((" th", "e"), ("Hel", "lo"), (" ", "the"), ("12", "3"), (".", "."), ("a", "b")):
        assert masked(a, b), (a, b)
    # different pre-tokens, or the answer depends on text outside the pair: never set
    for a, b in ((" hello", " world"), (" ", " "), ("it", "'s"), ("'s", "t"), ("Hello", ","), (".", "The")):
        assert not masked(a, b), (a, b)
    tokens = token_texts(enc, EOT_TOKEN)
    starts_partial = [t for t, b in enumerate(tokens) if cm.edge_class(b, first=True) == cm.PARTIAL]
    assert len(starts_partial) > 50 and not cm.is_masked(mask, np.arange(EOT_TOKEN)[:, None], starts_partial).any()
    contraction = [t for t, b in enumerate(tokens) if cm.ends_in_contraction(b)]
    assert len(contraction) >= 7 and not mask[contraction].any()
    assert not mask[EOT_TOKEN:].any()  # <|endoftext|> and padding: no row, no column
    assert not cm.is_masked(mask, slice(None), np.arange(EOT_TOKEN, cm.PADDED_VOCAB)).any()
    assert mask.shape == (cm.PADDED_VOCAB, cm.PADDED_VOCAB // 8) and mask.dtype == np.uint8


# ---- a plain statement of the rule (data/canonical_mask.py's docstring), for exact comparison ----

def plain_class(b, first):
    """"S", "N", "L", "O" of the first (last) whole character of b, "?" when there is none there."""
    for n in range(1, 5):
        try:
            ch = (b[:n] if first else b[-n:]).decode("utf-8")[0 if first else -1]
        except UnicodeDecodeError:
            continue
        if ch.isspace() and not "\x1c" <= ch <= "\x1f":
            return "S"
        return unicodedata.category(ch)[0] if unicodedata.category(ch)[0] in "LN" else "O"
    return "?"


def plain_closed(b):
    try:
        text = b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    for c in ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d"):
        if text.endswith(c):
            return len(text) == len(c) or plain_class(text[:-len(c)].encode(), first=False) in "LN"
    return False


def plain_mask_rows(tokens, rows, width):
    """Rows `rows` of the mask, straight from the rule: replay BPE on every token's bytes (lowest rank,
    leftmost on ties), its first piece from rank r + 1 and its last piece from rank r of the merge that
    formed them; mask x after p when some rule r = (a, b) finds p's last piece a and x's first piece b
    at rank r (start <= r < next start), the seam classes allow it and p does not end in a contraction."""
    ranks = {b: t for t, b in enumerate(tokens)}
    first, last, rule_of = {}, {}, {}
    for t, b in enumerate(tokens):
        pieces = [b[i:i + 1] for i in range(len(b))]
        first[t], last[t] = [(0, ranks[pieces[0]])], [(0, ranks[pieces[-1]])]
        while True:
            joins = [(ranks[pieces[i] + pieces[i + 1]], i) for i in range(len(pieces) - 1)
                     if pieces[i] + pieces[i + 1] in ranks]
            if not joins:
                break
            r, i = min(joins)
            rule_of[t] = (ranks[pieces[i]], ranks[pieces[i + 1]])
            pieces[i:i + 2] = [pieces[i] + pieces[i + 1]]
            if i == 0:
                first[t].append((r + 1, r))
            if i == len(pieces) - 1:
                last[t].append((r, r))

    def holds(changes, piece, r):  # is `piece` this side's piece at rank r?
        ends = [s for s, _ in changes[1:]] + [1 << 30]
        return any(p == piece and s <= r < e for (s, p), e in zip(changes, ends))

    rules_by_left, xs_by_first = {}, {}
    for r, (a, b) in rule_of.items():
        rules_by_left.setdefault(a, []).append(r)
    for x in range(len(tokens)):
        for _, piece in first[x]:
            xs_by_first.setdefault(piece, set()).add(x)
    seam_ok = lambda left, right: right != "?" and (left, right) not in (("S", "S"), ("O", "L"))
    out = np.zeros((len(rows), width), dtype=bool)
    for k, p in enumerate(rows):
        if plain_closed(tokens[p]):
            continue
        left = plain_class(tokens[p], first=False)
        for a in {piece for _, piece in last[p]}:
            for r in rules_by_left.get(a, ()):
                b = rule_of[r][1]
                if holds(last[p], a, r):
                    for x in xs_by_first.get(b, ()):
                        if holds(first[x], b, r) and seam_ok(left, plain_class(tokens[x], first=True)):
                            out[k, x] = True
    return out


def test_every_row_of_a_small_vocabulary_and_sampled_rows_of_gpt2_equal_the_plain_rule(enc, mask):
    ranks, small = small_vocabulary()
    tokens = token_texts(small, SMALL_VOCAB)
    expected = plain_mask_rows(tokens, range(SMALL_VOCAB), SMALL_VOCAB)
    got = np.unpackbits(cm.build_canonical_mask(SMALL_VOCAB, ranks), axis=1, bitorder="little").astype(bool)
    assert expected.any() and np.array_equal(got, expected)
    tokens = token_texts(enc, EOT_TOKEN)
    rows = np.random.default_rng(2).choice(EOT_TOKEN, 40, replace=False)
    got = np.unpackbits(mask[rows], axis=1, bitorder="little").astype(bool)
    assert np.array_equal(got, plain_mask_rows(tokens, rows, cm.PADDED_VOCAB))


def test_whitespace_pairs_emitted_in_some_context_are_not_masked(enc, mask):
    """A run of whitespace splits by what follows it ("\\s+(?!\\S)"): "\\n" + "\\n" alone is one token, yet
    before a letter it is two. No pair of all-whitespace tokens that some context emits may be masked,
    although BPE alone would join several of them."""
    tokens = token_texts(enc, EOT_TOKEN)
    spaces = [t for t, b in enumerate(tokens) if b.decode("utf-8", "replace").isspace()]
    contexts = [(left, right) for left in (b"", b"a", b" ") for right in (b"", b"a", b" ", b"\n")]
    emitted = [(p, x) for p in spaces for x in spaces
               if any(is_canonical(enc, tokens, p, x, left, right) for left, right in contexts)]
    joined_alone = [(p, x) for p, x in emitted if not is_canonical(enc, tokens, p, x)]
    assert len(spaces) > 20 and len(joined_alone) > 5
    assert not any(cm.is_masked(mask, p, x) for p, x in emitted)


def small_vocabulary():
    """GPT-2's first SMALL_VOCAB ids as a tokenizer of their own: each merge's parts have lower ranks."""
    ranks = {b: t for b, t in gpt2()._mergeable_ranks.items() if t < SMALL_VOCAB}
    return ranks, tiktoken.Encoding(name="gpt2-512", pat_str=GPT2_PAT_STR, mergeable_ranks=ranks, special_tokens={})


def test_every_pair_of_a_small_vocabulary():
    """All 262,144 pairs of a 512-token BPE vocabulary, brute-forced: none masked is canonical, and the
    mask finds most of the non-canonical ones."""
    ranks, small = small_vocabulary()
    mask = cm.build_canonical_mask(SMALL_VOCAB, ranks)
    tokens = token_texts(small, SMALL_VOCAB)
    masked = np.unpackbits(mask, axis=1, bitorder="little").astype(bool)
    canonical = np.zeros((SMALL_VOCAB, SMALL_VOCAB), dtype=np.int8)  # 1 canonical, 0 not, -1 not text
    for p in range(SMALL_VOCAB):
        for x in range(SMALL_VOCAB):
            c = is_canonical(small, tokens, p, x)
            canonical[p, x] = -1 if c is None else int(c)
    assert not (masked & (canonical == 1)).any()
    non_canonical = canonical == 0
    assert (masked & non_canonical).sum() > 0.9 * non_canonical.sum()


def test_load_or_build_caches_and_bad_sizes_are_refused(tmp_path):
    ranks, _ = small_vocabulary()
    path = tmp_path / "cache" / "canonical_mask.npy"
    built = cm.load_or_build(path, SMALL_VOCAB, ranks)
    assert path.is_file() and np.array_equal(np.load(path), built)
    np.save(path, np.full_like(built, 0xFF))  # a cached file of the right shape is read, not rebuilt
    assert (cm.load_or_build(path, SMALL_VOCAB, ranks) == 0xFF).all()
    np.save(path, built[:, :8])  # a cached file of another shape is rebuilt
    assert np.array_equal(cm.load_or_build(path, SMALL_VOCAB, ranks), built)
    with pytest.raises(ValueError, match="vocab_size 100 must be a multiple of 64"):
        cm.build_canonical_mask(100, ranks)
    with pytest.raises(ValueError, match="at least the tokenizer's 512 tokens"):
        cm.build_canonical_mask(448, ranks)
