"""The record arch's final validation index (train/record_val_index.py), as a script on a corpus made here.

train_gpt.py --preset record at tiny sizes (tests/test_record_run.py's flags, the whole 84-step schedule)
on documents whose phrases the train and val shards share, so validation n-grams occur in training: the
node's background index is built from the clock's start over the whole training split and the final
validation reads it (the summary says so, with its tokens and a valid record verdict, and hints change
the loss); a builder that cannot start, or that dies, falls back to the training stream's positional
index on the same trained model, and the log and the summary say why (a record attempt whose builder
died fails: exit 1); --preset record --plan sizes its index to the record's node."""
import json
import math
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from data.manifest import write_manifest
from data.shards import write_shard
from data.tokenizer import EOT_TOKEN
from tests.test_record_run import ENV, REPO, RUN_TIMEOUT_S, documents, script_args

TRAIN_TOKENS = 40_000 + 30_000
STEPS, TOKENS_PER_STEP = 84, 256  # script_args' whole schedule
# The record preset at script_args' sizes: the model and recipe of its --preset demo runs (every setting
# in which the two presets differ is given), the whole schedule: a record attempt. Its --hint-tokens is the
# plan's, for this machine: more than the corpus holds, to fetch; a run indexes what is there.
RECORD = ("--preset", "record", "--steps", str(STEPS), "--fp8", "off")
TOO_LARGE = "20,20,512"  # 2^40 buckets x 512 slots: no machine's memory, so the builder cannot start


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two train shards and a val shard of documents made of the same 60 phrases: val n-grams occur in training."""
    folder = tmp_path_factory.mktemp("record_val_corpus")
    rng = np.random.default_rng(0)
    phrases = [rng.integers(0, 400, size=rng.integers(4, 16)) for _ in range(60)]
    for seed, (name, n) in enumerate({"train_000000.bin": 40_000, "train_000001.bin": 30_000,
                                      "val_000000.bin": 6_000}.items(), start=1):
        write_shard(folder / name, documents(n, seed, EOT_TOKEN, 400, phrases))
    write_manifest(folder)
    return folder


def run(corpus, tmp_path, *extra, kill_builder=False, returncode=0):
    """The script's summary and log; kill_builder: SIGKILL the builder process as soon as it is started."""
    cmd = [sys.executable, str(REPO / "train_gpt.py"),
           *script_args(corpus, tmp_path, "--log-every", "21", "--no-canonical-mask", *extra)]
    p = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in p.stdout:
            lines.append(line)
            if kill_builder and "background hints: armed to build" in line:
                children = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
                assert len(children) == 1, children  # the builder, the trainer's only child
                os.kill(int(children[0]), signal.SIGKILL)
        p.wait(timeout=RUN_TIMEOUT_S)
    finally:
        p.kill()
    log = "".join(lines)
    assert p.returncode == returncode, f"{' '.join(cmd)} exited {p.returncode}\n{log[-4000:]}"
    return json.loads((tmp_path / "summary.json").read_text()), log


@pytest.fixture(scope="module")
def background_run(corpus, tmp_path_factory):
    return run(corpus, tmp_path_factory.mktemp("background"), *RECORD)


def test_final_validation_reads_the_background_index(background_run):
    s, log = background_run
    assert s["preset"] == "record" and s["steps_trained"] == STEPS and s["plan"]["hint_tokens"] == TRAIN_TOKENS
    assert s["val_index"] == "background" and s["hint_tokens_val"] == TRAIN_TOKENS
    assert s["background"]["state"] == "ready" and s["background"]["tokens_done"] == TRAIN_TOKENS
    assert s["background"]["tokens_done_at_clock_start"] == 0
    assert s["hint_tokens_train"] == STEPS * TOKENS_PER_STEP
    assert s["record_valid"] is True and "built from the clock's start" in s["record_reason"]
    assert abs(s["val_loss_hints"] - s["val_loss_nohints"]) > 1e-3
    assert "final validation: hints from the background index (70,000 tokens" in log


@pytest.mark.parametrize("how", ["cannot start", "dies"])
def test_a_builder_that_fails_falls_back_to_the_positional_index(corpus, tmp_path, background_run, how):
    """cannot start: --preset demo (16M tokens asked: the whole split) in a table no memory holds; dies:
    the record attempt's builder killed as soon as it started, which fails the attempt (exit 1) after
    its validation and its summary."""
    if how == "cannot start":
        s, log = run(corpus, tmp_path, "--hint-geometry", TOO_LARGE)
        assert s["background"] is None and "background index: not building" in log
        assert "failed to start" in s["val_index_reason"] and s["record_valid"] is None  # the demo: no attempt
    else:
        s, log = run(corpus, tmp_path, *RECORD, kill_builder=True, returncode=1)
        assert s["background"]["state"] == "failed" and "died" in s["background"]["error"]
        assert "died" in s["val_index_reason"]
        assert s["record_valid"] is False and "did not use the background index" in s["record_reason"]
        assert "record attempt FAILED" in log
    assert s["val_index"] == "training" and s["hint_tokens_val"] == STEPS * TOKENS_PER_STEP
    assert "final validation: hints from the training index" in log and math.isfinite(s["val_loss_hints"])
    ref = background_run[0]  # the same model (the builder never touches training), other hints
    assert s["val_loss_nohints"] == ref["val_loss_nohints"] and s["val_loss_hints"] != ref["val_loss_hints"]


def test_record_preset_plans_its_background_index_for_the_record_node():
    """--preset record --plan for the record's node: the record's 35B tokens in the article's table, 8 ranks."""
    node = ["--node-ram", "2TiB", "--node-cores", "64", "--node-tokens", "37B"]
    p = subprocess.run([sys.executable, str(REPO / "train_gpt.py"), "--preset", "record", "--plan", *node], cwd=REPO,
                       env=ENV, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-2000:]
    plan = json.loads(p.stdout)
    assert plan["hint_tokens"] == 35_000_000_000 and plan["n_ranks"] == 8 and plan["train_seconds"] == 7.065
    # per GPU, the 8 ranks' share: the record's 13.0 GB (its table shard 11.6 GB) of an 80 GB H100
    gpu = plan["gpu_memory"]
    assert gpu["total"] == sum(v for k, v in gpu.items() if k not in ("total", "h100_share"))
    assert round(gpu["total"] / 1e9, 1) == 13.0 and 0.15 < gpu["h100_share"] < 0.2
    geometry = plan["geometry"]
    assert (geometry["partition_bits"], geometry["bucket_bits"], geometry["slots"]) == (14, 14, 176)
