"""Exact hints by counting (hints/exact/): both backends equal the plain-Python reference
(hints.index.reference.ReferenceIndex) field for field.

The "torch" backend runs as it would on a CPU machine. The "triton" backend runs its kernels
in Triton's interpreter (TRITON_INTERPRET=1, which hints.exact.triton_count sets while it loads and
runs them on a CPU device; the `interpreter` fixture below sets it for the whole test too), so
the kernels' logic (hashing, probing, compare-and-swap inserts, atomic counts, table growth)
is what is tested; a last test compiles them for Hopper (sm_90) without a GPU. Interpreted
kernels are slow (~50 ms a launch), so their inputs are small.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import triton  # noqa: F401  imported here, before any test sets TRITON_INTERPRET, as a user's program would

from hints import ReferenceIndex, count_exact
from hints.exact import exact_val_hints
from hints.exact.count import TorchCounter
from hints.fingerprint import fingerprint, fingerprint_collisions, fingerprints_numpy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STDLIB = os.path.dirname(os.__file__)
FIELDS = ("token", "count", "purity", "kind")
BACKENDS = ["torch", "triton"]


@pytest.fixture
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def assert_equal_to_reference(query, train_chunks, lengths=(6, 10, 20), backend="torch", **kw):
    """count_exact over the chunks equals ReferenceIndex fed the same chunks; returns the hints."""
    ref = ReferenceIndex(lengths)
    for c in train_chunks:
        ref.add(c)
    expected = ref.lookup(query)
    got = count_exact(query, train_chunks, lengths, backend=backend, device="cpu", **kw)
    for f in FIELDS:
        a, b = getattr(got, f), getattr(expected, f)
        assert a.dtype == b.dtype and a.shape == b.shape, (f, a.dtype, b.dtype, a.shape, b.shape)
        bad = np.argwhere(a != b)
        assert bad.size == 0, f"{backend}: {f} differs at {len(bad)} (length index, position)s, first {bad[:5].tolist()}"
    return got


def normalize(text):
    """Runs of spaces collapsed (as in test_hints_exact.py: GPT-2 codes each indentation space
    as its own token, which only makes the text repetitive, not more real)."""
    return "\n".join(" ".join(line.split()) for line in text.splitlines())


@pytest.fixture(scope="module")
def stdlib_tokens():
    from data.tokenizer import encode_document

    def tokens(name):
        with open(os.path.join(STDLIB, name), encoding="utf-8") as f:
            return np.array(encode_document(normalize(f.read())), dtype=np.uint16)
    return tokens


def planted_stream(seed, n, vocab, phrases, min_len=6, max_len=24, share=0.5):
    """Random tokens with `phrases` repeated phrases planted over `share` of the stream: their
    n-grams recur with varied followers (whatever comes after each copy)."""
    rng = np.random.default_rng(seed)
    pool = [rng.integers(0, vocab, rng.integers(min_len, max_len + 1)).astype(np.uint16) for _ in range(phrases)]
    out, size = [], 0
    while size < n:
        part = pool[rng.integers(phrases)] if rng.random() < share else rng.integers(0, vocab, rng.integers(1, 8))
        out.append(part.astype(np.uint16))
        size += part.size
    return np.concatenate(out)[:n]


def assert_exercised(h, lengths):
    """Every length has hits, repeated n-grams and impure ones: the comparison is not vacuous."""
    for k in range(len(lengths)):
        assert (h.count[k] > 1).any() and (h.purity[k][h.count[k] > 0] < 1).any(), lengths[k]
        assert (h.token[k] == -1).any()


# ---- real text and random streams --------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_stdlib_text(backend, stdlib_tokens, request):
    if backend == "triton":
        request.getfixturevalue("interpreter")
        train = np.concatenate([stdlib_tokens("heapq.py")[:2500], stdlib_tokens("bisect.py")])
        query = np.concatenate([stdlib_tokens("heapq.py")[1800:2300], stdlib_tokens("colorsys.py")[:500]])
    else:
        train = np.concatenate([stdlib_tokens(f) for f in ("heapq.py", "bisect.py", "textwrap.py", "shlex.py",
                                                           "fractions.py", "string.py")])
        query = np.concatenate([stdlib_tokens(f) for f in ("heapq.py", "colorsys.py", "base64.py")])
    h = assert_equal_to_reference(query, np.array_split(train, 3), backend=backend)
    assert_exercised(h, (6, 10, 20))


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_streams_with_planted_repeats(backend, request):
    if backend == "triton":
        request.getfixturevalue("interpreter")
        n_train, n_query = 2000, 600
    else:
        n_train, n_query = 20000, 4000
    train = planted_stream(1, n_train, 50000, phrases=12)
    query = np.concatenate([planted_stream(1, n_query // 2, 50000, phrases=12, share=0.7),
                            np.random.default_rng(2).integers(0, 50000, n_query // 2).astype(np.uint16)])
    h = assert_equal_to_reference(query, [train], backend=backend)
    assert_exercised(h, (6, 10, 20))
    # short lengths on a tiny vocabulary: many followers per n-gram, every count bucket
    small = np.random.default_rng(3).integers(65533, 65536, n_train // 2).astype(np.uint16)  # the largest ids
    h = assert_equal_to_reference(small[:n_query // 2], [small], lengths=(1, 2, 3), backend=backend)
    assert h.count.max() >= 33 and ((h.token >= 65533) | (h.token == -1)).all()


# ---- the separate cases ------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_early_positions(backend, request):
    """No hint before a whole n-gram exists (t < L - 1), in the query and at the start of the
    training stream; the first training n-gram's follower counts, the last n-gram (no follower)
    does not."""
    if backend == "triton":
        request.getfixturevalue("interpreter")
    lengths = (2, 4, 6)
    train = np.array([5, 6, 7, 8, 9, 10, 11, 5, 6, 7, 8, 9, 10, 12, 13], dtype=np.uint16)
    h = assert_equal_to_reference(train, [train], lengths, backend=backend)
    for k, L in enumerate(lengths):
        assert (h.token[k, :L - 1] == -1).all() and (h.kind[k, :L - 1] == -1).all()
        assert h.token[k, L - 1] == train[L]  # the stream's first n-gram, seen once before position L
    assert h.token[0, -1] == -1  # the 2-gram (12, 13) ends the stream: no follower, no count
    # nothing before the stream's start counts as tokens (id 0 is a token like any other)
    zeros_then_train = np.concatenate([np.zeros(6, dtype=np.uint16), train])
    h = assert_equal_to_reference(zeros_then_train, [train], lengths, backend=backend)
    for k, L in enumerate(lengths):  # n-grams with a 0 in them are not in the training stream
        assert (h.token[k, :L + 5] == -1).all() and h.token[k, L + 5] == train[L]
    # queries shorter than the shortest length, an empty query, and training streams too short
    for query, chunks in ((train[:1], [train]), (train[:0], [train]), (train, [train[:2]]), (train, [])):
        h = assert_equal_to_reference(query, chunks, lengths, backend=backend)
        assert h.token.shape == (3, query.size) and (h.count == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties_go_to_the_smallest_id(backend, request):
    if backend == "triton":
        request.getfixturevalue("interpreter")
    g = [40, 41, 42]
    train = np.array(g + [9] + g + [300] + g + [9] + g + [300] + g + [7] + [50, 51, 52, 1000, 50, 51, 52, 999],
                     dtype=np.uint16)
    query = np.array(g + [0] + [50, 51, 52], dtype=np.uint16)
    h = assert_equal_to_reference(query, [train], (3,), backend=backend)
    assert (h.token[0, 2], h.count[0, 2], h.purity[0, 2]) == (9, 5, np.float32(0.4))  # 9 and 300 tie 2-2 (7 once)
    assert (h.token[0, 6], h.count[0, 6], h.purity[0, 6]) == (999, 2, np.float32(0.5))  # 999 and 1000 tie 1-1


@pytest.mark.parametrize("backend", BACKENDS)
def test_ngrams_absent_from_training(backend, request):
    """Absent n-grams give no hint; a longer n-gram is absent where its shorter suffix is present
    (the longer lengths are only looked for where the shorter one was found)."""
    if backend == "triton":
        request.getfixturevalue("interpreter")
    lengths = (2, 4)
    train = np.array([1, 2, 3, 4, 5, 9, 3, 4, 6], dtype=np.uint16)
    query = np.array([8, 8, 3, 4, 7, 1, 2, 3, 4, 11, 12], dtype=np.uint16)
    h = assert_equal_to_reference(query, [train], lengths, backend=backend)
    assert h.token[0, 3] == 5 and h.count[0, 3] == 2 and h.token[1, 3] == -1  # (3,4) seen twice; (8,8,3,4) never
    assert h.token[1, 8] == 5 and h.count[1, 8] == 1  # (1,2,3,4) once, then 5
    assert (h.token[:, 9:] == -1).all() and (h.count[:, 9:] == 0).all() and (h.purity[:, 9:] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_followers_overflow_one_chunk(backend, request):
    """One n-gram recurs far more often than a chunk holds; its leading follower changes over the
    stream (early chunks favour 100, later ones 200). For Triton, the pair table also starts at
    16 slots, so it must grow (re-inserting what it counted) several times mid-stream."""
    if backend == "triton":
        request.getfixturevalue("interpreter")
    g = [7, 8, 9, 10, 11, 12]
    followers = [100] * 40 + [200] * 50 + [300] * 30 + list(range(400, 440))
    rng = np.random.default_rng(5)
    parts = []
    for f in followers:
        parts += [g, [f], rng.integers(1000, 1010, 3)]
    train = np.concatenate(parts).astype(np.uint16)
    query = np.concatenate([g, [0, 0], g[2:], [100, 7]]).astype(np.uint16)
    chunk, options = 64, {}
    assert train.size > 10 * chunk and len(followers) > chunk
    if backend == "triton":
        options = dict(pair_capacity=16)
    h = assert_equal_to_reference(query, [train], (2, 6, 10), backend=backend, chunk_tokens=chunk, **options)
    assert (h.token[1, 5], h.count[1, 5]) == (200, len(followers))
    if backend == "triton":  # the table grew with content in it, and the host synced only to check
        from hints.exact.triton_count import TritonCounter
        counter = TritonCounter(query, (2, 6, 10), torch.device("cpu"), pair_capacity=16)
        for a in range(0, train.size, chunk):
            counter.add(train[a:a + chunk])
        assert counter.fill.item() > 16 and any(fill > 0 for fill in counter.growths), counter.growths
        assert 0 < counter.syncs <= train.size // chunk  # at most one per chunk


@pytest.mark.parametrize("backend", BACKENDS)
def test_stream_split_at_every_offset(backend, request):
    """n-grams that span chunk boundaries count. Torch: every two-way split; both backends: one
    token per chunk (every offset a boundary in one run) and uneven chunks."""
    lengths = (3, 6, 10)
    rng = np.random.default_rng(7)
    p = rng.integers(0, 50, 12)
    s = np.concatenate([p, [1], p, [2, 3], p, [1], rng.integers(0, 50, 5)]).astype(np.uint16)  # 45 tokens
    if backend == "triton":
        request.getfixturevalue("interpreter")
        splits = [[s[:c], s[c:]] for c in (1, 9, 10, 11, 44)]
    else:
        splits = [[s[:c], s[c:]] for c in range(s.size + 1)]
    splits += [[s[i:i + 1] for i in range(s.size)], np.split(s, [2, 3, 13, 14, 30])]
    whole = assert_equal_to_reference(s, [s], lengths, backend=backend)
    assert (whole.count[2] > 1).any()  # 10-grams recur: boundaries inside them matter
    for chunks in splits:
        h = assert_equal_to_reference(s, chunks, lengths, backend=backend)
        assert (h.token == whole.token).all()


# ---- fingerprints, inputs, the trainer's wrapper ------------------------------------------------

def test_fingerprints_agree_and_do_not_collide_on_real_text(stdlib_tokens):
    tokens = np.concatenate([stdlib_tokens(f) for f in ("textwrap.py", "shlex.py", "fractions.py")])
    lengths = (6, 10, 20)
    counter = TorchCounter(tokens[:500], lengths, torch.device("cpu"))
    q = torch.from_numpy(tokens[:500].astype(np.int64))
    ends = torch.arange(1, 501)
    for k, (L, f) in enumerate(zip(lengths, counter._fingerprints(q, ends))):
        fn = fingerprints_numpy(tokens[:500], L)
        assert (f[L - 1:].numpy().view(np.uint64) == fn).all()
        assert all(int(fn[t]) == fingerprint(tokens[t:t + L]) for t in range(0, fn.size, 37))
    for L in (2, 6, 10, 20):
        grams, fps = fingerprint_collisions(tokens, L)
        assert grams > 5000 and fps == grams, (L, grams, fps)
    grams, fps = fingerprint_collisions(tokens, 6, bits=12)  # the measurement sees collisions when there are
    assert fps < grams


def test_bad_inputs():
    q = np.arange(10, dtype=np.uint16)
    with pytest.raises(ValueError, match="lengths"):
        count_exact(q, q, lengths=(6, 6))
    with pytest.raises(ValueError, match="backend"):
        count_exact(q, q, backend="numba")
    with pytest.raises(ValueError, match="train chunk 1"):
        count_exact(q, [q, np.array([1.5])])
    with pytest.raises(ValueError, match="query"):
        count_exact(np.array([-1, 2]), q)
    with pytest.raises(ValueError, match="takes no options"):
        count_exact(q, q, backend="torch", pair_capacity=4)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            count_exact(q, q, device="cuda")


def test_exact_val_hints_answers_lookup_span(stdlib_tokens):
    val = stdlib_tokens("heapq.py")[:3000]
    train = [stdlib_tokens("heapq.py")[1000:], stdlib_tokens("bisect.py")]
    whole = ReferenceIndex((6, 10, 20)).add(np.concatenate(train)).lookup(val)
    for start, stop in ((0, None), (600, 2400)):  # the whole stream, or one rank's share
        ex = exact_val_hints(val, iter(train), (6, 10, 20), backend="torch", device="cpu", start=start, stop=stop)
        assert ex.tokens_added == sum(t.size for t in train) and ex.seconds > 0
        span = ex.lookup_span(val, 700, 1900)
        for f in FIELDS:
            assert (getattr(span, f) == getattr(whole, f)[:, 700:1900]).all()
    with pytest.raises(ValueError, match="another"):
        ex.lookup_span(val[:-1], 700, 710)
    with pytest.raises(ValueError, match="cover positions"):
        ex.lookup_span(val, 500, 710)


def test_import_hints_stays_torch_free():
    code = "import sys, hints, hints.exact; assert 'torch' not in sys.modules and 'triton' not in sys.modules"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)


def test_kernels_compile_for_hopper():
    """The compiled path, which the interpreter does not exercise: every kernel lowers to PTX and
    assembles for sm_90, with 64-bit compare-and-swap and logical (unsigned) shifts in the hash."""
    from hints.exact.triton_count import compile_for_gpu
    ptx = compile_for_gpu(arch=90)
    assert "atom.global.relaxed.gpu.cas.b64" in ptx["count_stream"] and "shr.u64" in ptx["count_stream"]
    assert "atom.global.relaxed.gpu.cas.b64" in ptx["insert_queries"]
    assert "max.s64" in ptx["reduce_pairs"] and ".local" not in ptx["count_stream"]


def test_exact_bench_cli(tmp_path, stdlib_tokens):
    """`python -m hints exact-bench` end to end on small .npy streams: the table, the interpreter's
    agreement with the reference, and no fingerprint collisions."""
    train = np.concatenate([stdlib_tokens(f) for f in ("heapq.py", "bisect.py", "textwrap.py")])
    np.save(tmp_path / "train.npy", train)
    np.save(tmp_path / "val.npy", stdlib_tokens("colorsys.py"))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-m", "hints", "exact-bench", "--tokens", str(tmp_path / "train.npy"),
                          "--query", str(tmp_path / "val.npy"), "--repeats", "1", "--workers", "1",
                          "--json", str(tmp_path / "r.json")], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "| exact count, torch on CPU |" in out.stdout and "| index build + lookup |" in out.stdout
    import json
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["interpreter_equal"] is True and res["train_tokens"] == train.size
    assert all(c["ngrams"] == c["fingerprints"] > 1000 for c in res["collisions"].values())
