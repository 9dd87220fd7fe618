"""Shards made elsewhere (llm.c's and modded-nanogpt's folders carry no manifest.json) work as
they are: the first read records the folder's set, in its manifest.json when the folder takes
the write and in memory when it does not, and says which in one line; a manifest that disagrees
with the files is refused, naming the file. The folders are written by data.shards.write_shard in
llm.c's layout; the trainer and the readers are the real ones. The read-only folder is a read-only
bind mount in a namespace of the test's own (it stops root too), or its mode where that is not
allowed and the tests do not run as root."""
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data.manifest import RECORDED_ON_READ
from data.shards import write_shard

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
VOCAB = 512
RUN_TIMEOUT_S = 300  # a tiny run; the first in a checkout also compiles the hint kernels (about 90 s on 2 busy cores)


def llmc_folder(folder, train_tokens=30_000, val_tokens=5_000, seed=0):
    """fineweb_train_000001.bin and fineweb_val_000000.bin, llm.c's names, with no manifest."""
    rng = np.random.default_rng(seed)
    write_shard(folder / "fineweb_train_000001.bin", rng.integers(0, VOCAB, train_tokens))
    write_shard(folder / "fineweb_val_000000.bin", rng.integers(0, VOCAB, val_tokens))
    return folder


def train(folder, logs, *extra, prefix=()):
    cmd = [*prefix, sys.executable, str(REPO / "train_gpt.py"), "--preset", "demo-2025",
           "--train-files", str(folder / "fineweb_train_*.bin"), "--val-files", str(folder / "fineweb_val_*.bin"),
           "--vocab-size", str(VOCAB), "--n-layer", "2", "--n-embd", "64", "--n-head", "2", "--seq-len", "64",
           "--batch-size", "2", "--val-tokens", "2048", "--val-batch-size", "4", "--hint-tokens", "0",
           "--log-dir", str(logs), *extra]
    return subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def notices(stdout):
    return [line for line in stdout.splitlines() if "manifest.json" in line and line.startswith("shards:")]


def test_an_llmc_folder_without_a_manifest_trains(tmp_path):
    folder = llmc_folder(tmp_path / "fineweb10B")
    p = train(folder, tmp_path / "logs", "--steps", "3", "--summary-json", str(tmp_path / "s.json"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert notices(p.stdout) == [f"shards: {folder} had no manifest.json; recorded its 2 shards (35,000 tokens, each "
                                 f"read once: header and size checked, largest id {VOCAB - 1}) in "
                                 f"{folder / 'manifest.json'}"], p.stdout
    assert "manifest" not in p.stderr  # one line in all: no progress bar for a folder read in under 2 s
    m = json.loads((folder / "manifest.json").read_text())
    assert m["source"] == RECORDED_ON_READ
    assert {n: e["tokens"] for n, e in m["files"].items()} == {"fineweb_train_000001.bin": 30_000,
                                                                "fineweb_val_000000.bin": 5_000}
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["steps"] == 3 and np.isfinite(s["val_loss_nohints"])

    # the folder now reads like any other: a second run says nothing; a shard rewritten since is refused
    write_shard(folder / "fineweb_val_000000.bin", np.arange(4_000) % VOCAB)
    p = train(folder, tmp_path / "logs", "--steps", "1")
    assert p.returncode == 1 and not notices(p.stdout)
    assert p.stderr.strip().splitlines()[-1] == (
        f"error: shard {folder / 'fineweb_val_000000.bin'} disagrees with {folder / 'manifest.json'}: it is 9,024 "
        f"bytes, the manifest says 11,024; it changed after the set was written: write the set again, or if its "
        f"shards are complete and current, record them: python -m data.manifest {folder}")


def test_a_bad_file_in_a_folder_without_a_manifest_is_named(tmp_path):
    from data.loader import read_tokens
    folder = llmc_folder(tmp_path, train_tokens=3_000, val_tokens=500)
    write_shard(tmp_path / "fineweb_train_000002.bin", np.arange(2_000) % VOCAB)
    with open(tmp_path / "fineweb_train_000002.bin", "r+b") as f:  # a download cut short
        f.truncate(1024 + 2 * 1_500)
    with pytest.raises(ValueError, match=rf"fineweb_train_000002\.bin: token count is 2000, .* \(truncated\) "
                                         rf"\(read to record {folder}, which has no manifest\.json"):
        read_tokens(str(folder / "fineweb_val_*.bin"))  # the val glob records the folder: train shards too
    assert not (folder / "manifest.json").exists()


# `sh -c` script: bind-mount the folder ($0) onto itself read-only, then run the command. Inside a
# user and mount namespace of its own (unshare -rm) this needs no privilege, and it stops root too.
READ_ONLY_MOUNT = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'


def read_only(folder):
    """(command prefix that runs a command with `folder` read-only, the error a write there gets):
    a read-only bind mount where user namespaces allow it, else (not root) the folder's mode."""
    probe = ["unshare", "-rm", "sh", "-c", READ_ONLY_MOUNT, str(folder), "true"]
    if shutil.which("unshare") and subprocess.run(probe, capture_output=True).returncode == 0:
        return probe[:-1], os.strerror(errno.EROFS)
    if os.geteuid() != 0:
        os.chmod(folder, 0o555)
        return [], os.strerror(errno.EACCES)
    pytest.skip("no way to make a folder read-only for root here (no user namespaces for unshare -rm)")


def test_a_read_only_folder_trains_and_says_so(tmp_path):
    folder = llmc_folder(tmp_path / "fineweb10B", seed=3)
    prefix, why = read_only(folder)
    try:
        p = train(folder, tmp_path / "logs", "--steps", "2", "--summary-json", str(tmp_path / "s.json"), prefix=prefix)
    finally:
        os.chmod(folder, 0o755)
    assert p.returncode == 0, p.stderr[-3000:]
    assert not (folder / "manifest.json").exists()
    # one line, at the first read; the val glob, the loader and the val reader use the set held in memory
    assert notices(p.stdout) == [f"shards: {folder} has no manifest.json and could not take one ({why}); its 2 shards "
                                 f"(35,000 tokens, each read once: header and size checked, largest id {VOCAB - 1}) "
                                 f"are held in memory for this run"], p.stdout
    assert json.loads((tmp_path / "s.json").read_text())["steps"] == 2
