"""Test setup: the fixture that keeps torch to one thread in the tests that run models, and the
phrase corpus the training tests run on. The repo's packages import from the checkout
(pyproject.toml sets pytest's pythonpath to the repo root)."""
import numpy as np
import pytest

from data.manifest import write_manifest
from data.shards import write_shard


@pytest.fixture
def one_torch_thread():
    """Tiny models gain nothing from threads, and spinning threads crawl on a shared 2-core box.
    Test modules that run torch use it: pytestmark = pytest.mark.usefixtures("one_torch_thread")."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def phrase_stream(n, seed, phrases, vocab):
    """Tokens < vocab: 60% of the text is drawn from a fixed set of phrases, so n-grams repeat and
    hints exist; the rest is random runs of 3-19 tokens."""
    rng = np.random.default_rng(seed)
    out, total = [], 0
    while total < n:
        p = phrases[rng.integers(len(phrases))] if rng.random() < 0.6 else rng.integers(0, vocab, rng.integers(3, 20))
        out.append(p)
        total += len(p)
    return np.concatenate(out)[:n]


@pytest.fixture(scope="session")
def phrase_corpus():
    """make(folder, {shard name: tokens}, vocab): phrase-stream shards (one seed each, phrases
    shared) and their manifest, as a complete shard set; returns the folder."""
    def make(folder, sizes, vocab, n_phrases=200):
        rng = np.random.default_rng(0)
        phrases = [rng.integers(0, vocab, size=rng.integers(8, 40)) for _ in range(n_phrases)]
        for seed, (name, n) in enumerate(sizes.items(), start=1):
            write_shard(folder / name, phrase_stream(n, seed, phrases, vocab))
        write_manifest(folder)
        return folder
    return make
