"""The record arch's training path (train/record_loop.py, train/record_run.py).

In process, on a tiny RecordGPT: the warm-up over every configuration followed by the reset leaves no
trace (the first 3 steps after it, their losses and every weight and table row, equal a run without
warm-up bit for bit on the CPU); the final validation applies the canonical mask it is given.
As a script (train_gpt.py --preset demo at tiny sizes, on a corpus of GPT-2-id documents made
here): a few steps with and without the record's hints, and with hints from a saved index; the whole scaled run on two gloo ranks stays
in sync."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from data.loader import iter_tokens
from data.manifest import write_manifest
from data.packed_loader import PackedLoader, ValidationReader
from data.shards import write_shard
from data.tokenizer import EOT_TOKEN
from hints import Geometry, HintIndex
from model.ngram_table import NgramTable
from model.record_gpt import RecordConfig, RecordGPT
from model.record_loss import SampledSoftmax
from train.record_loop import Batches, RecordTrainer
from train.record_optim import RecordOptimizers
from train.record_schedule import RecordSchedule

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
RUN_TIMEOUT_S = 300
VOCAB, BOS = 512, 511        # the in-process model's vocabulary and document start
T, BLOCK = 128, 8            # a step's tokens, the attention block
STEPS = 84                   # RecordSchedule's shortest run


def documents(n, seed, bos, top, phrases=None):
    """n tokens of documents (each opens with bos, 20..300 tokens) of repeated phrases of ids < top
    (`phrases`: these, shared with other shards; default: 60 of the shard's own)."""
    rng = np.random.default_rng(seed)
    if phrases is None:
        phrases = [rng.integers(0, top, size=rng.integers(4, 16)) for _ in range(60)]
    out, total = [], 0
    while total < n:
        doc = [bos]
        length = int(rng.integers(20, 300))
        while len(doc) < length:
            doc.extend(phrases[int(rng.integers(0, len(phrases)))])
        out.append(np.array(doc[:length]))
        total += length
    return np.concatenate(out)[:n].astype(np.uint16)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two train shards and a val shard: small ids, documents opening with GPT-2's BOS (the script's)."""
    folder = tmp_path_factory.mktemp("record_corpus")
    for seed, (name, n) in enumerate({"train_000000.bin": 40_000, "train_000001.bin": 30_000,
                                      "val_000000.bin": 6_000}.items()):
        write_shard(folder / name, documents(n, seed, EOT_TOKEN, 400))
    write_manifest(folder)
    return folder


def tiny_trainer(files, seed=0):
    schedule = RecordSchedule(STEPS, block_tokens=BLOCK, tokens_per_step=T, vocab=VOCAB)
    torch.manual_seed(seed)
    model = RecordGPT(RecordConfig(vocab_size=VOCAB, model_dim=64, n_head=4, head_dim=16, mlp_hidden=128,
                                   ngram_table_rows=256, initial_windows=schedule.plan(0).window_tokens))
    table = NgramTable(256, 64, dtype=torch.float32, period4_start=schedule.table_switch, sign_pool_rows=16)
    opt = RecordOptimizers(model.labelled_params(), schedule, table=table)
    trainer = RecordTrainer(model, table, opt, schedule, SampledSoftmax(VOCAB), device=torch.device("cpu"))

    def batches(cuts):
        return Batches(PackedLoader(files, cuts, tokens_per_rank=T, bos=BOS))
    return trainer, schedule, batches


@pytest.fixture(scope="module")
def small_ids(tmp_path_factory):
    folder = tmp_path_factory.mktemp("small_ids")
    write_shard(folder / "train_000000.bin", documents(30_000, 7, BOS, BOS))
    write_shard(folder / "val_000000.bin", documents(3_000, 8, BOS, BOS))
    write_manifest(folder)
    return folder


def first_steps(trainer, schedule, batches, n=3):
    cut = lambda s: schedule.plan(s).cut_tokens  # noqa: E731
    losses = []
    trainer.run(list(range(n)), batches(cut), on_step=lambda step, loss: losses.append(loss))
    weights = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    return losses, weights, trainer.table.shard.clone()


def test_warmup_then_reset_leaves_the_first_steps_bitwise(small_ids):
    files = str(small_ids / "train_*.bin")
    trainer, schedule, batches = tiny_trainer(files)
    fresh = first_steps(trainer, schedule, batches)

    trainer, schedule, batches = tiny_trainer(files)
    warm = schedule.warmup_steps()
    trainer.run(warm, batches([schedule.plan(s).cut_tokens for s in warm]), warmup=True)
    assert trainer.table.shard.abs().sum() > 0 and not trainer.optimizers.adam.tied  # it trained, and untied
    trainer.reset()
    warmed = first_steps(trainer, schedule, batches)

    assert [x.item() for x in warmed[0]] == [x.item() for x in fresh[0]]
    for name in fresh[1]:
        assert torch.equal(warmed[1][name], fresh[1][name]), name
    assert torch.equal(warmed[2], fresh[2])


def test_validation_applies_the_canonical_mask(small_ids):
    trainer, schedule, _ = tiny_trainer(str(small_ids / "train_*.bin"))
    reader = ValidationReader(str(small_ids / "val_*.bin"), tokens_per_rank=1024, val_tokens=2048, bos=BOS)
    plain = trainer.validate(reader)
    every_class = torch.full((VOCAB, VOCAB // 8), 255, dtype=torch.uint8)  # every class at -60: uniform
    masked = trainer.validate(reader, canon_mask=every_class)
    assert plain["val_tokens"] == masked["val_tokens"] == 2048
    assert masked["val_loss_nohints"] == pytest.approx(math.log(VOCAB), abs=1e-5)
    assert abs(plain["val_loss_nohints"] - math.log(VOCAB)) > 1e-4  # so the masked one could not pass by chance


def script_args(corpus, tmp_path, *extra):
    """Tiny demo flags: 84 steps of 256 tokens, blocks of 16 (documents cut at 112 / 256 / 384)."""
    return ["--preset", "demo", "--train-files", str(corpus / "train_*.bin"),
            "--val-files", str(corpus / "val_*.bin"), "--n-embd", "64", "--n-head", "4", "--tokens-per-step", "256",
            "--block-tokens", "16", "--ngram-rows", "1024", "--val-tokens", "2048", "--val-batch-tokens", "1024",
            "--log-every", "1", "--log-dir", str(tmp_path / "logs"), "--no-record-warmup",
            "--summary-json", str(tmp_path / "summary.json"), *extra]


def run_script(args, nproc=1):
    cmd = [sys.executable, str(REPO / "train_gpt.py"), *args] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        str(REPO / "train_gpt.py"), *args]
    p = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return p


@pytest.mark.parametrize("hints", [True, False])
def test_demo_record_trains_with_and_without_hints(corpus, tmp_path, hints):
    """hints: with the canonical mask too (rank 0 builds it beside the steps); without: neither."""
    off = [] if hints else ["--no-hints", "--no-canonical-mask"]
    run_script(script_args(corpus, tmp_path, "--stop-after", "3", *off))
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["arch"] == "record" and s["steps_trained"] == 3 and s["steps"] == STEPS
    assert s["prefix_term"] and len(s["train_losses"]) == 3 and all(map(math.isfinite, s["train_losses"]))
    assert s["val_tokens"] == 2048 and math.isfinite(s["val_loss_nohints"])
    assert (s["val_loss_hints"] is not None) == hints and s["canonical_mask"] == hints
    assert s["train_tokens"] == 3 * 256 and s["hint_tokens_train"] == (3 * 256 if hints else 0)
    # with hints the demo builds its background index over the whole training split; --no-hints starts no builder
    assert s["val_index"] == ("background" if hints else None) and (s["background"] is not None) == hints
    assert s["hint_tokens_val"] == (70_000 if hints else 0)


def test_demo_record_validates_with_a_saved_index(corpus, tmp_path):
    idx = HintIndex(Geometry.for_tokens(100_000))
    for chunk in iter_tokens(str(corpus / "train_*.bin")):
        idx.add(chunk)
    path = idx.save(str(tmp_path / "val.hints"))
    run_script(script_args(corpus, tmp_path, "--stop-after", "3", "--no-canonical-mask", "--val-index", path))
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["val_index"] == "val-index" and s["hint_tokens_val"] == idx.tokens_added == 70_000
    assert s["background"] is None  # --val-index comes first: no builder
    assert math.isfinite(s["val_loss_hints"])


def test_demo_record_two_gloo_ranks_go_through_every_stage_in_sync(corpus, tmp_path):
    """The whole scaled run (every stage, window and candidate change, the table's cadence switch, the
    untie, the tail ticks and ship) on two ranks: both end with the same weights."""
    run_script(script_args(corpus, tmp_path, "--log-every", "21", "--no-canonical-mask"), nproc=2)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["world_size"] == 2 and s["steps_trained"] == STEPS and s["tail_shipped"]
    assert len(set(s["param_digests"])) == 1
    assert math.isfinite(s["val_loss_hints"]) and math.isfinite(s["val_loss_nohints"])
