"""Token streams the hint tests build on: random phrases of a small vocabulary strung together."""
import numpy as np


def phrase_stream(seed, n, vocab, n_phrases, max_len):
    """Random phrases (1..max_len tokens of a small vocabulary) strung together with Zipf-like
    weights: n-grams of every length repeat, with varied followers."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(0, vocab, rng.integers(1, max_len + 1)) for _ in range(n_phrases)]
    w = 1.0 / np.arange(1, n_phrases + 1)
    picks = rng.choice(n_phrases, size=n, p=w / w.sum())
    return np.concatenate([phrases[i] for i in picks])[:n].astype(np.uint16)
