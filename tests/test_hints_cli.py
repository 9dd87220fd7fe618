"""`python -m hints` end to end: build, stats, lookup, scaling and bench on small shards,
help on every command, and clear errors on bad input."""
import json
import subprocess
import sys

import numpy as np
import pytest

from data.manifest import write_manifest
from data.shards import write_shard
from data.tokenizer import gpt2
from hints import HintIndex, ReferenceIndex
from hints.bench import reproducibility

TEXT = "def add(a, b):\n    return a + b\n\n" * 50 + "class Point:\n    def __init__(self, x, y):\n        self.x = x\n" * 40


def hints_cli(*args, check=True):
    out = subprocess.run([sys.executable, "-m", "hints", *args], capture_output=True, text=True, timeout=300)
    if check:
        assert out.returncode == 0, out.stderr
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    toks = np.array(gpt2().encode(TEXT), dtype=np.uint16)
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 50257, size=20_000).astype(np.uint16)
    train = np.concatenate([toks, noise, toks])
    write_shard(d / "train_000000.bin", train)
    write_shard(d / "val_000000.bin", toks)
    write_manifest(d)  # the set, recorded as its writer would (data/manifest.py)
    np.save(d / "train.npy", train)
    return d, train, toks


@pytest.mark.parametrize("cmd", ["build", "lookup", "stats", "bench", "scaling"])
def test_help(cmd):
    assert "usage" in hints_cli(cmd, "--help").stdout


def test_build_stats_lookup(shards, tmp_path):
    d, train, val = shards
    out = tmp_path / "x.idx"
    r = hints_cli("build", "--tokens", str(d / "train_*.bin"), "--out", str(out), "--geometry", "4,8,64", "--workers", "2",
                  "--prefault", "on")
    assert "hints stored" in r.stdout
    assert "table pre-faulted in" in r.stdout and "on 2 thread(s)" in r.stdout  # apart from "built in"
    idx = HintIndex.load(str(out), mmap=True, verify=True)
    assert idx.tokens_added == train.size
    # the .npy route builds the same bytes
    out2 = tmp_path / "y.idx"
    hints_cli("build", "--tokens", str(d / "train.npy"), "--out", str(out2), "--geometry", "4,8,64", "--in-place")
    idx2 = HintIndex.load(str(out2), mmap=True)
    assert np.array_equal(idx.table, idx2.table) and np.array_equal(idx.fill, idx2.fill)

    js = tmp_path / "stats.json"
    r = hints_cli("stats", "--index", str(out), "--tokens", str(d / "val_*.bin"), "--verify", "--json", str(js))
    assert "accuracy" in r.stdout and "kind" in r.stdout
    st = json.loads(js.read_text())["hints"]
    ref = ReferenceIndex().add(train).lookup(val[:-1])
    assert st["covered"] == (ref.token >= 0).sum(axis=1).tolist()

    r = hints_cli("lookup", "--index", str(out), "--text", "class Point:\n    def __init__(self, x, y):")
    assert "__" in r.stdout and "gram hint" in r.stdout


def test_scaling_and_bench(shards, tmp_path):
    d, train, _ = shards
    r = hints_cli("scaling", "--train", str(d / "train_*.bin"), "--val", str(d / "val_*.bin"),
                  "--min-tokens", "10K", "--out", str(tmp_path / "sc"))
    assert "hint tokens" in r.stdout and (tmp_path / "sc" / "scaling.png").exists()
    r = hints_cli("bench", "--tokens", str(d / "train_*.bin"), "--query", str(d / "val_*.bin"), "--repeats", "2",
                  "--ref-tokens", "5000", "--query-tokens", "5000", "--geometry", "4,12,176", "--json", str(tmp_path / "b.json"))
    res = json.loads((tmp_path / "b.json").read_text())
    assert res["ratios"]["build_1w_vs_ref"] > 1 and "ratios" in r.stdout and "memory latency" in r.stdout
    figs = res["figures"]
    for key in ("ref_build", "build_1w", "build_2w", "shards_2w", "seal", "lookup_scan_1w", "lookup_sealed_2w", "latency",
                "ceiling_1w", "ceiling_2w"):
        fig = figs[key]
        assert fig["repeats"] == 2 and fig["min"] <= fig["median"] <= fig["max"], key
    # the host rows are sampled all through the run: before the first timed round of each group of figures
    # measured in turn and after each timed measurement (8 groups of two figures, and the seal alone)
    for key in ("vector_1w", "vector_2w", "random_writes", "random_writes_2w"):
        assert figs[key]["repeats"] == 8 * (1 + 2 * 2) + (1 + 2), key
    # every figure beside its host row from the same run, as the host was while it was measured (the
    # samples of its window): compute against the vector ceiling of as many threads, memory-bound
    # against the random-write floor of as many cores or memcpy; the CPU is named with them
    shares = res["shares"]
    for key, row in (("build_1w", "vector_1w"), ("ceiling_2w", "vector_2w"), ("lookup_sealed_1w", "random_writes"),
                     ("lookup_sealed_2w", "random_writes_2w")):
        host = figs[key]["host"][row]
        assert figs[row]["min"] <= host <= figs[row]["max"], key
        assert shares[key] == pytest.approx(figs[key]["median"] / host), key
    stage1 = np.median([s["stage1"] for s in res["stages"]["2"]])
    host = figs["build_2w"]["host"]["vector_2w"]
    assert shares["build_2w_stage1"] == pytest.approx(res["train_tokens"] / stage1 / host)
    stage2 = np.median([s["stage2"] for s in res["stages"]["2"]])
    host = figs["build_2w"]["host"]["random_writes_2w"]
    assert shares["build_2w_stage2"] == pytest.approx(res["train_tokens"] / stage2 / host)
    assert {"build_1w_stage1", "build_many_2w_stage2"} <= set(shares) and "vector_1w" not in shares
    assert set(res["shares_cpu"]) <= set(shares) and "build_1w" in res["shares_cpu"]
    assert res["cpu"]["llvm_target"] and "vector ceiling" in r.stdout and res["cpu"]["model"] in r.stdout
    scaling = res["reproducibility"]["scaling_vs_vector"]
    assert scaling["build_2w"] == pytest.approx(res["ratios"]["build_2w_vs_1w"] / res["ratios"]["vector_2w_vs_1w"])
    proj = res["projection"]
    assert proj["threads"] == 48 and proj["seconds"] == max(proj["cores_s"], proj["memory_s"]) > 0
    # the agreement criterion on this run's own shares: 10% apart passes, 20% apart fails, and names the worst
    near = dict(res, shares={k: v * 1.1 for k, v in shares.items()})
    far = dict(res, shares=dict(shares, seal=shares["seal"] * 1.2))
    assert reproducibility(res, near)["agreement_met"]
    bad = reproducibility(res, far)
    assert not bad["agreement_met"] and bad["worst"] == "seal"
    mem = res["memory"]  # the 92 MiB table is pre-faulted, so it shows in the peak, and little else does
    assert 0.9 * mem["index_bytes"] <= mem["peak_increase"] <= mem["index_bytes"] + mem["staging_bytes"] + (256 << 20)


def test_bad_input_is_a_clear_error(shards, tmp_path):
    d, _, _ = shards
    r = hints_cli("build", "--tokens", str(tmp_path / "nope_*.bin"), "--out", str(tmp_path / "z.idx"), check=False)
    assert r.returncode == 2 and "nope_*.bin" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.idx"
    bad.write_bytes(b"not an index" * 1000)
    r = hints_cli("stats", "--index", str(bad), check=False)
    assert r.returncode == 2 and "bad.idx" in r.stderr and "magic" in r.stderr
    r = hints_cli("build", "--tokens", str(d / "train_*.bin"), "--out", str(tmp_path / "g.idx"), "--geometry", "4,8,7", check=False)
    assert r.returncode == 2 and "slots=7" in r.stderr


def test_record_step_bench_reports_drops():
    """`hints bench --record-step` at the record's geometry (1.4 GiB): each measured step's
    lookup + add, its two stages, and the share of added slots dropped, which is 0 for text
    with no repeated n-gram and nearly all for one phrase said over and over; and the same
    steps on the record's threads per rank, on a second index that must end with the same
    bytes (the bench asserts it)."""
    from hints.bench import RECORD_ADD, RECORD_THREADS, bench_record_step
    fresh = np.random.default_rng(0).integers(0, 65536, 3 * RECORD_ADD).astype(np.uint16)
    phrase = np.tile(np.arange(7, dtype=np.uint16), 3 * RECORD_ADD // 7)
    for stream, lo, hi in ((fresh, 0.0, 0.0), (phrase, 0.99, 1.0)):
        lines = []
        rec = bench_record_step(stream, 1, lines.append)
        assert len(rec["step"].wall) == 1 and len(rec["stages_ms"]) == 1
        assert lo <= rec["dropped_share"][0] <= hi, rec["dropped_share"]
        assert "of the added slots were dropped" in lines[-2]
        threaded = rec["threads"][RECORD_THREADS]["step"]
        assert len(threaded.wall) == 1 and threaded.workers == RECORD_THREADS
        assert lines[-1].startswith(f"  record step, {RECORD_THREADS} threads:") and "ms of CPU" in lines[-1]


def test_alternate_warms_each_timed_measurement_after_the_sample():
    """alternate() with a sampler: the host rows are sampled before the first timed round and after
    each timed measurement, and a figure given `warm` runs it, untimed, right before each timed
    measure, so that it is timed from its own state (a lookup's index in cache), not the sampler's."""
    from hints.bench.figures import Figure, alternate
    from hints.bench.host_sampler import HostSampler

    class Log(HostSampler):
        def sample(self):
            events.append("sample")
            super().sample()

    events = []
    sampler = Log(1, 1 << 16, rounds=10, writes=100)
    figs = {k: Figure(k, "x/s", 1) for k in ("a", "b")}

    def measure(k):
        events.append(f"measure {k}")
        return 1.0, 1.0, None

    alternate(figs, measure, 2, sampler, warm=lambda k: events.append(f"warm {k}"))
    untimed = ["measure a", "measure b"]
    timed_round = ["warm a", "measure a", "sample", "warm b", "measure b", "sample"]
    assert events == untimed + ["sample"] + timed_round * 2
    assert all(len(f.wall) == 2 for f in figs.values()) and len(sampler) == 5
