"""The background builder: a separate process builds the same index as in-process building,
reports failure instead of hanging, and never leaves shared memory behind (whole-group kills
and signals are in test_faults.py)."""
import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from data.manifest import write_manifest
from data.shards import write_shard
from hints import Geometry, HintIndex
from data.units import parse_token_count
from hints.index.background import SHM_DIR, BackgroundBuilder

GEOM = Geometry(4, 8, 16)
WAIT_S = 120  # generous: the child imports numba and loads cached kernels


def wait_for(builder, states=("ready", "failed")):
    t = time.time()
    while time.time() - t < WAIT_S:
        st = builder.status()
        if st["state"] in states:
            return st
        time.sleep(0.05)
    raise AssertionError(f"builder still {builder.status()} after {WAIT_S}s")


def leftovers(name):
    return glob.glob(os.path.join(SHM_DIR, f"*{name}*"))


@pytest.fixture
def shards(tmp_path):
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 40, size=60_000).astype(np.uint16)
    write_shard(tmp_path / "train_000000.bin", toks[:25_000])
    write_shard(tmp_path / "train_000001.bin", toks[25_000:])
    write_manifest(tmp_path)  # the set, recorded as its writer would (data/manifest.py)
    return str(tmp_path / "train_*.bin"), toks


def test_parse_token_count():
    assert parse_token_count("75M") == 75_000_000
    assert parse_token_count("1.2B") == 1_200_000_000
    assert parse_token_count("37B") == 37_000_000_000
    assert parse_token_count(4096) == 4096
    with pytest.raises(ValueError, match="75M"):
        parse_token_count("lots")


def test_builds_same_index_as_in_process(shards):
    pattern, toks = shards
    b = BackgroundBuilder(pattern, 50_000, geometry=GEOM, workers=1, name=f"t{os.getpid()}a", log=lambda *a: None)
    try:
        b.start().go()
        st = wait_for(b)
        assert st["state"] == "ready", st
        bg = b.open()
        ref = HintIndex(GEOM).add(toks[:50_000]).seal()  # the builder seals the finished index
        assert bg.tokens_added == 50_000 and bg.sealed
        assert np.array_equal(np.asarray(bg.fill), ref.fill) and np.array_equal(np.asarray(bg.table), ref.table)
        for a, b_ in zip(bg._side, ref._side):
            assert np.array_equal(np.asarray(a), b_)
        other = BackgroundBuilder.attach(b.name)  # another rank's view
        assert other.ready() and other.open().tokens_added == 50_000
        other.close()  # an attached handle only lets go of its own hold
        assert b.ready() and b.open().tokens_added == 50_000
        assert other.status()["state"] == "failed" and "closed" in other.status()["error"]
    finally:
        b.close()
    assert leftovers(b.name) == []


def test_unsealed_builder_leaves_the_build_order(shards):
    pattern, toks = shards
    b = BackgroundBuilder(pattern, 20_000, geometry=GEOM, workers=2, name=f"t{os.getpid()}u", log=lambda *a: None,
                          seal=False)
    try:
        b.start().go()
        assert wait_for(b)["state"] == "ready"
        bg = b.open()
        ref = HintIndex(GEOM).add(toks[:20_000])
        assert not bg.sealed and np.array_equal(np.asarray(bg.table), ref.table)
    finally:
        b.close()
    assert leftovers(b.name) == []


def test_killed_builder_reports_failure_and_cleans_up(shards):
    pattern, _ = shards
    b = BackgroundBuilder(pattern, 60_000, geometry=GEOM, workers=1, name=f"t{os.getpid()}b", log=lambda *a: None)
    b.start()
    os.kill(b.process.pid, signal.SIGKILL)
    st = wait_for(b, states=("failed",))
    assert "died" in st["error"]
    assert not b.ready()
    with pytest.raises(RuntimeError, match="not ready"):
        b.open()
    b.close()
    b.close()  # idempotent
    assert leftovers(b.name) == []


def test_bad_shard_fails_with_its_name(tmp_path, shards):
    pattern, _ = shards
    bad = tmp_path / "train_000002.bin"
    write_shard(bad, np.arange(100, dtype=np.uint16))
    write_manifest(tmp_path)
    raw = bytearray(bad.read_bytes())
    raw[0] ^= 0xFF  # wrong magic, found only when the builder reaches this shard
    bad.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="train_000002.bin"):
        BackgroundBuilder(pattern, 70_000, geometry=GEOM, workers=1, log=lambda *a: None)


@pytest.mark.parametrize("tokens", [24_000_000, 60_000])  # killed while building / after it finished
def test_builder_exits_with_its_parent(shards, tmp_path, tokens):
    pattern, _ = shards
    name = f"t{os.getpid()}c{tokens}"
    # a parent that starts a long build (the same 60k tokens again and again via a list of shards)
    files = sorted(glob.glob(pattern)) * 400
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time, os\n"
        "from hints.index.background import BackgroundBuilder\n"
        "from hints import Geometry\n"
        f"b = BackgroundBuilder({files!r}, {tokens}, geometry=Geometry(4, 8, 16), workers=1, name={name!r}, log=lambda *a: None).start().go()\n"
        "t = time.time()\n"
        "while b.status()['state'] not in ('running', 'ready') and time.time() - t < 60: time.sleep(0.05)\n"
        "print(b.process.pid, flush=True)\n"
        "os._exit(0)\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))  # the checkout's packages
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=WAIT_S, env=env)
    pid = int(out.stdout.split()[-1])
    t = time.time()
    while time.time() - t < 30:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError("builder outlived its parent")
    assert leftovers(name) == []


def test_close_stops_a_paused_builder_through_its_own_cleanup(tmp_path):
    long = write_shard(tmp_path / "long.bin", np.tile(np.arange(50, dtype=np.uint16), 480_000))  # 24M tokens:
    b = BackgroundBuilder(long, 24_000_000, geometry=GEOM, workers=1, name=f"t{os.getpid()}d",  # still running
                          log=lambda *a: None)  # when paused
    b.start().go()
    wait_for(b, states=("running",))  # its SIGTERM handler is installed by now
    os.kill(b.process.pid, signal.SIGSTOP)
    b.close()
    assert b.process.returncode == 128 + signal.SIGTERM  # exited via its handler, not SIGKILL after a timeout
    assert leftovers(b.name) == []


def test_failure_reason_reaches_the_owner_and_attached_ranks(tmp_path, shards):
    pattern, _ = shards
    b = BackgroundBuilder(pattern, 60_000, geometry=GEOM, workers=1, name=f"t{os.getpid()}e", log=lambda *a: None)
    raw = bytearray((tmp_path / "train_000001.bin").read_bytes())
    raw[0] ^= 0xFF  # broken after the token count was taken: only the builder finds it
    (tmp_path / "train_000001.bin").write_bytes(bytes(raw))
    try:
        b.start().go()
        other = BackgroundBuilder.attach(b.name)
        st = wait_for(b, states=("failed",))
        assert "train_000001.bin" in st["error"] and "magic" in st["error"]
        assert other.status()["error"] == st["error"]  # the record is shared, not just the exit code
        other.close()
    finally:
        b.close()


def test_attach_without_an_owner_is_a_clear_error():
    with pytest.raises(RuntimeError, match="nobody serves it"):
        BackgroundBuilder.attach(f"t{os.getpid()}-nobody")


def test_armed_builder_indexes_nothing_until_the_clock_starts(shards):
    """Before go() the builder reserves, pre-faults and reads, then waits: no token is indexed; after
    go(clock_start) it builds, and its times count from that clock start."""
    pattern, _ = shards
    b = BackgroundBuilder(pattern, 50_000, geometry=GEOM, workers=2, name=f"t{os.getpid()}g", log=lambda *a: None)
    try:
        b.start()
        assert b.wait_armed(WAIT_S) == "armed"
        time.sleep(1.0)  # an armed builder stays armed: it hashes nothing without the clock
        st = b.status()
        assert st["state"] == "armed" and st["tokens_done"] == 0 and "armed" in b.describe()
        assert st["prefault"]["workers"] == 2 and st["page_cache_bytes"] >= 50_000 * 2
        clock = time.monotonic()
        b.go(clock)
        st = wait_for(b)
        assert st["state"] == "ready" and st["tokens_done"] == 50_000 and st["tokens_done_at_clock_start"] == 0
        assert st["clock_start"] == clock and 0 <= st["build_started_s"] < st["ready_s"] <= time.monotonic() - clock
    finally:
        b.close()
    assert leftovers(b.name) == []
