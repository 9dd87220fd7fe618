"""Checkpoints under faults: a crafted pickle is refused and its payload never runs; a set mixed
from two saves, a set without its manifest, an index that does not match the steps, and a
resume with changed settings are refused naming what disagrees; a clean set round-trips.
Also the trainer's flag checks, which must name the flag before anything runs."""
import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from data.loader import DistributedDataLoader
from data.shards import write_shard
from hints import Geometry, HintIndex, n_kinds
from model import GPT, GPTConfig, build_optimizers
from train import checkpoint
from train.checkpoint import CheckpointError
from train.common import Dist

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_torch_thread")
B, T = 2, 16
GEOM = Geometry(2, 6, 16)


def make_run(tmp_path, seed=0):
    """A tiny model, its optimizers, a loader over a fresh shard and a training index, as the trainer has them."""
    shard = tmp_path / "train_000000.bin"
    if not shard.exists():
        write_shard(shard, np.random.default_rng(0).integers(0, 256, 5000))
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=256, n_layer=2, n_head=2, n_embd=32, max_seq_len=T, n_hint_kinds=n_kinds(3)))
    opts = build_optimizers(model, arch="speedrun")
    loader = DistributedDataLoader(str(shard), B, T, log=None)
    return model, opts, loader, HintIndex(GEOM)


def train_steps(model, opts, loader, index, n):
    for _ in range(n):
        batch = loader.next_batch()
        loss = model(torch.from_numpy(batch.x), torch.from_numpy(batch.y))
        loss.backward()
        for opt in opts:
            opt.step()
        model.zero_grad(set_to_none=True)
        index.add(batch.global_tokens)


def save_at(path, step, run, settings=None):
    model, opts, loader, index = run
    checkpoint.save_run(str(path), step, Dist(), model=model, optimizers=opts, loader=loader, index=index,
                        tail=np.arange(19, dtype=np.uint16), progress=dict(train_s=1.0),
                        settings=settings or dict(seq_len=T), args=argparse.Namespace(seq_len=T))


def restore(path, run, settings=None):
    model, opts, loader, index = run
    return checkpoint.restore_run(str(path), Dist(), settings=settings or dict(seq_len=T), model=model,
                                  optimizers=opts, loader=loader, index=index, global_batch=B * T, hint_workers=1)


def test_clean_set_round_trips(tmp_path):
    run = make_run(tmp_path)
    train_steps(*run, 3)
    save_at(tmp_path / "ck.pt", 3, run)
    fresh = make_run(tmp_path, seed=1)
    step, index, tail, progress = restore(tmp_path / "ck.pt", fresh)
    assert step == 3 and index.tokens_added == 3 * B * T and progress["train_s"] == 1.0
    np.testing.assert_array_equal(tail, np.arange(19))
    for (n, a), b in zip(run[0].state_dict().items(), fresh[0].state_dict().values()):
        assert torch.equal(a, b), n
    assert fresh[2].state_dict() == run[2].state_dict()


class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_crafted_pickle_is_refused_and_never_runs(tmp_path):
    run = make_run(tmp_path)
    train_steps(*run, 1)
    path = tmp_path / "ck.pt"
    save_at(path, 1, run)
    marker = tmp_path / "pwned"
    Payload.marker = marker
    state = torch.load(path, weights_only=True)
    state["model_config"] = Payload()
    torch.save(state, path)
    # the attacker also rewrites the manifest so the hashes match: only weights_only stands between
    manifest = tmp_path / "ck.pt.manifest.json"
    m = json.loads(manifest.read_text())
    m["files"]["ck.pt"] = dict(bytes=path.stat().st_size, sha256=checkpoint.file_sha256(path))
    manifest.write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="cannot be loaded safely"):
        restore(path, make_run(tmp_path))
    assert not marker.exists()


def test_mixed_set_is_refused(tmp_path):
    run = make_run(tmp_path)
    train_steps(*run, 2)
    save_at(tmp_path / "a.pt", 2, run)
    train_steps(*run, 2)
    save_at(tmp_path / "b.pt", 4, run)
    # a crash mid-save of step 4 over step 2: the index is new, the weights and manifest old
    shutil.copy(tmp_path / "b.pt.hints", tmp_path / "a.pt.hints")
    with pytest.raises(CheckpointError, match=r"a\.pt\.hints is not the file the manifest"):
        restore(tmp_path / "a.pt", make_run(tmp_path))


def test_set_without_manifest_is_refused(tmp_path):
    run = make_run(tmp_path)
    train_steps(*run, 1)
    save_at(tmp_path / "ck.pt", 1, run)
    os.unlink(tmp_path / "ck.pt.manifest.json")  # as a save interrupted before its last write leaves it
    with pytest.raises(CheckpointError, match="no manifest"):
        restore(tmp_path / "ck.pt", make_run(tmp_path))


def test_index_that_does_not_match_the_steps_is_refused(tmp_path):
    run = make_run(tmp_path)
    train_steps(*run, 3)
    run[3].add(np.arange(5, dtype=np.uint16))  # the index holds tokens the steps do not account for
    save_at(tmp_path / "ck.pt", 3, run)
    with pytest.raises(CheckpointError, match="hints would leak"):
        restore(tmp_path / "ck.pt", make_run(tmp_path))


def test_changed_settings_are_refused_with_old_and_new(tmp_path):
    run = make_run(tmp_path)
    train_steps(*run, 1)
    save_at(tmp_path / "ck.pt", 1, run, settings=dict(seq_len=T, hint_lengths=[6, 10, 20]))
    with pytest.raises(CheckpointError, match=r"hint_lengths: saved \[6, 10, 20\], now \[4, 6, 10, 20\]"):
        restore(tmp_path / "ck.pt", make_run(tmp_path), settings=dict(seq_len=T, hint_lengths=[4, 6, 10, 20]))


def test_shard_fingerprint_sees_other_contents_under_the_same_name(tmp_path):
    write_shard(tmp_path / "train_000000.bin", np.arange(3000) % 300)
    before = checkpoint.shard_fingerprints([str(tmp_path / "train_000000.bin")])
    write_shard(tmp_path / "train_000000.bin", (np.arange(3000) + 1) % 300)
    assert checkpoint.shard_fingerprints([str(tmp_path / "train_000000.bin")]) != before


@pytest.mark.parametrize("flag, value", [("--log-every", "0"), ("--steps", "0"), ("--val-batch-size", "0"),
                                         ("--hint-tokens", "-1"), ("--batch-size", "x"), ("--hint-lengths", "6,x")])
def test_bad_flags_name_the_flag(flag, value):
    p = subprocess.run([sys.executable, str(REPO / "train_gpt.py"), flag, value], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert p.returncode == 2 and f"argument {flag}" in p.stderr, p.stderr[-2000:]
