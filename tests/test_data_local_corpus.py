"""Tests for data/local_corpus.py (split by file, counts, reuse) and data/fineweb.py's writer."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data.fineweb import write_shards
from data.loader import read_tokens
from data.local_corpus import build_local_corpus, find_files, split_files, stdlib_dir
from data.shards import read_shard, shard_token_count
from data.tokenizer import EOT_TOKEN, encode_document


def make_tree(root, n=40):
    rng = np.random.default_rng(1)
    words = ["alpha", "beta", "gamma", "delta", "speedrun", "hint", "café", "日本", "\n", "  "]
    for i in range(n):
        d = root / f"dir{i % 4}" / ("sub" if i % 3 else "")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"file{i:03d}.txt").write_text(" ".join(rng.choice(words, size=rng.integers(5, 80))), encoding="utf-8")
    (root / "dir0" / "latin1.txt").write_bytes(b"caf\xe9 \xff\xfe broken utf-8")  # decoded with U+FFFD
    (root / "dir1" / "empty.txt").write_text("")
    (root / "dir1" / "skip.md").write_text("not matched by the pattern")
    (root / "site-packages").mkdir()
    (root / "site-packages" / "third_party.txt").write_text("excluded directory")
    return root


def check_summary(s, out_dir):
    for split in ("train", "val"):
        counts = [shard_token_count(os.path.join(out_dir, n)) for n in s["shards"][split]]
        assert sum(counts) == s["tokens"][split]
        assert s["documents"][split] == len(s["file_lists"][split])
        assert s["shards"][split] == sorted(s["shards"][split]) and all(n.startswith(split + "_") for n in s["shards"][split])
    assert not set(s["file_lists"]["train"]) & set(s["file_lists"]["val"])
    assert s["documents"]["val"] >= 1 and s["documents"]["train"] >= 1


def test_small_corpus(tmp_path):
    src = make_tree(tmp_path / "src")
    out = tmp_path / "out"
    s = build_local_corpus(src_dir=src, out_dir=out, pattern="*.txt", shard_tokens=200, val_fraction=0.2,
                           workers=2, progress=False)
    check_summary(s, out)
    assert not s["reused"]
    all_files = find_files(str(src), "*.txt")
    assert len(all_files) == 42 and "site-packages/third_party.txt" not in all_files
    assert sorted(s["file_lists"]["train"] + s["file_lists"]["val"]) == all_files  # no cap: every file used once
    assert s["files"] == {"train": len(s["file_lists"]["train"]), "val": len(s["file_lists"]["val"])}
    assert len(s["shards"]["train"]) > 1
    for split in ("train", "val"):  # shards hold exactly the documents, EOT first, in the listed order
        want = np.concatenate([
            encode_document((src / rel).read_bytes().decode("utf-8", errors="replace"))
            for rel in s["file_lists"][split]
        ])
        got = read_tokens(str(out / f"{split}_*.bin"))
        np.testing.assert_array_equal(got, want)
        assert int((got == EOT_TOKEN).sum()) == s["documents"][split]
    assert json.loads((out / "corpus.json").read_text())["tokens"] == s["tokens"]

    again = build_local_corpus(src_dir=src, out_dir=out, pattern="*.txt", shard_tokens=200, val_fraction=0.2,
                               workers=2, progress=False)
    assert again["reused"] and again["tokens"] == s["tokens"]

    # different parameters rebuild, and stale shards from the first build are removed
    other = build_local_corpus(src_dir=src, out_dir=out, pattern="*.txt", shard_tokens=10**6, val_fraction=0.2,
                               workers=1, progress=False)
    assert not other["reused"] and other["tokens"] == s["tokens"]
    assert sorted(p.name for p in out.glob("*.bin")) == ["train_000000.bin", "val_000000.bin"]

    # a changed source file is noticed
    (src / "dir0" / "file000.txt").write_text("changed contents, longer than before " * 3)
    changed = build_local_corpus(src_dir=src, out_dir=out, pattern="*.txt", shard_tokens=10**6, val_fraction=0.2,
                                 workers=1, progress=False)
    assert not changed["reused"]


def test_split_is_by_file_and_deterministic():
    files = [f"pkg/mod{i}.py" for i in range(500)]
    train, val = split_files(files, 0.05)
    assert sorted(train + val) == sorted(files) and not set(train) & set(val)
    assert 5 <= len(val) <= 50
    assert split_files(list(reversed(files)), 0.05) == (train, val)
    assert split_files(files[:1] + files[1:2], 0.01)[1]  # at least one val file
    with pytest.raises(ValueError, match="val_fraction"):
        split_files(files, 1.5)
    with pytest.raises(ValueError, match="at least 2"):
        split_files(files[:1])


def test_stdlib_capped(tmp_path):
    out = tmp_path / "stdlib"
    s = build_local_corpus(out_dir=out, max_train_tokens=60_000, max_val_tokens=20_000, shard_tokens=25_000,
                           workers=2, progress=False)
    check_summary(s, out)
    assert s["src_dir"] == os.path.abspath(stdlib_dir())
    assert s["tokens"] == {"train": 60_000, "val": 20_000}
    assert len(s["shards"]["train"]) == 3
    assert s["files"]["train"] > 1000 and s["files"]["val"] > 20  # the whole stdlib is split ...
    assert s["documents"]["train"] < s["files"]["train"]  # ... but the cap stops early
    assert not any("site-packages" in f for f in s["file_lists"]["train"] + s["file_lists"]["val"])
    first = read_shard(out / "train_000000.bin")
    assert first[0] == EOT_TOKEN


def test_bad_arguments(tmp_path):
    with pytest.raises(NotADirectoryError, match="no_such_dir"):
        build_local_corpus(src_dir=tmp_path / "no_such_dir", out_dir=tmp_path / "o", progress=False)
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "a.py").write_text("x = 1")
    with pytest.raises(ValueError, match="need at least 2"):
        build_local_corpus(src_dir=tmp_path / "one", out_dir=tmp_path / "o", progress=False)
    with pytest.raises(ValueError, match="shard_tokens"):
        build_local_corpus(src_dir=tmp_path / "one", out_dir=tmp_path / "o", shard_tokens=0, progress=False)


@pytest.mark.parametrize("workers", [1, 2])
def test_fineweb_write_shards(tmp_path, workers):
    texts = [f"document number {i}: " + "some words here " * (i % 7) for i in range(60)]
    s = write_shards(iter(texts), tmp_path, shard_size=100, workers=workers, chunksize=4, progress=False)
    want = np.concatenate([encode_document(t) for t in texts])
    names = [os.path.basename(p) for p in s["shards"]]
    assert names[0] == "fineweb_val_000000.bin" and names[1] == "fineweb_train_000001.bin"
    assert s["shard_tokens"][:-1] == [100] * (len(names) - 1) and s["tokens"] == want.size
    assert s["documents"] == len(texts)
    got = np.concatenate([read_shard(p) for p in s["shards"]])
    np.testing.assert_array_equal(got, want)

    capped = write_shards(texts, tmp_path / "capped", shard_size=100, workers=workers, max_shards=2, progress=False)
    assert capped["shard_tokens"] == [100, 100]
    np.testing.assert_array_equal(np.concatenate([read_shard(p) for p in capped["shards"]]), want[:200])


WORKER_SIGTERM_UNDER_A_HANDLER = r"""
import signal, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # as train_gpt.py does before it builds the demo corpus
from data.tokenizer import tokenizing_pool
pool = tokenizing_pool(2)
print(pool.apply(signal.getsignal, (signal.SIGTERM,)) == signal.SIG_DFL)
pool.terminate()
pool.join()
"""


def test_tokenizing_workers_die_on_sigterm_under_a_trainers_handler(tmp_path):
    """The tokenizing pool's workers take SIGTERM's default action even when their parent has a
    Python handler, so Pool.terminate() never waits on a worker that cannot run that handler
    while it waits in C (a hang seen when ./run.sh built the demo corpus on a fresh clone)."""
    repo = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-c", WORKER_SIGTERM_UNDER_A_HANDLER], cwd=repo,
                       env=dict(os.environ, PYTHONPATH=str(repo)), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "True", (p.stdout, p.stderr[-2000:])
