"""Faults and bad input (issue 9), hints/ and data/ parts: one case per defect, each of which failed
before its fix. Damaged index files never end a process by a signal; killed runs leave no shared
memory; full disks are errors naming the file; stale, partial or out-of-vocabulary shards are
refused before training; shared-folder hygiene (0600, no symlink following, no spec in argv)."""
import contextlib
import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from data.shards import write_shard
from hints import Geometry, HintIndex
from hints.index import store
from hints.index.background import BackgroundBuilder

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(REPO))
GEOM = Geometry(4, 8, 16, (6, 10, 20))
WAIT_S = 60  # a child imports numba and loads cached kernels: seconds on a busy 2-core machine


def stream_of(seed, n, vocab=8):
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.uint16)


def error_lines(stderr):
    """stderr without progress bars: what a user reads as the error."""
    return [line for line in stderr.strip().splitlines() if line.strip() and "it/s]" not in line and "tok/s]" not in line]


def python(code, *args, check=False, **kw):
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], env=ENV, cwd=REPO, capture_output=True,
                          text=True, timeout=WAIT_S, check=check, **kw)


# ---- 3. a damaged index never crashes a process ------------------------------------------------

FUZZ = r"""
import shutil, sys
import numpy as np
from hints import HintIndex
from hints.index import store
src, work = sys.argv[1], sys.argv[2]
idx = HintIndex.load(src, mmap=False)
g = idx.geom
fill_off, table_off, total = store.layout(g)
query = np.random.default_rng(0).integers(0, 8, 30_000).astype(np.uint16)[:4000]  # the indexed stream
outcomes = []
def crafted(fill, table):
    # a file whose header is valid (its CRC too) around the given fill and table
    hdr = store.pack_header(g, idx.tokens_added, int(fill.sum(dtype=np.int64)), 0, 0, idx.history)
    with open(work, "wb") as f:
        f.write(hdr); f.seek(fill_off); fill.astype(np.uint16).tofile(f)
        f.seek(table_off); table.astype(np.uint64).tofile(f)
def try_lookup(name):
    try:
        loaded = HintIndex.load(work, mmap=True, workers=2)
    except ValueError as e:
        assert work in str(e), e
        outcomes.append((name, "refused")); return
    h = loaded.lookup(query)
    assert h.token.shape == (3, query.size)
    outcomes.append((name, "looked up"))
rng = np.random.default_rng(1)
shape = (g.n_partitions, g.n_buckets)
table = np.asarray(idx.table)
first = HintIndex(g).add(query).table.reshape(-1).max()  # a slot whose n-grams the query holds
crafted(np.full(shape, 65535), np.full(table.shape, first)); try_lookup("fill 65535, every slot matching")
for seed in range(6):
    r = np.random.default_rng(seed)
    crafted(np.full(shape, 65535), table); try_lookup("fill 65535")
    crafted(r.integers(0, 65536, shape), table); try_lookup("random fill")
    crafted(np.full(shape, g.slots), r.integers(0, 2**63, table.shape, dtype=np.uint64) * 2 + 1); try_lookup("full buckets of random slots")
    crafted(r.integers(0, g.slots + 1, shape), r.integers(0, 2**63, table.shape, dtype=np.uint64)); try_lookup("random fill <= slots, random table")
    shutil.copy(src, work)  # random bytes written over the saved file's fill and table, header kept
    with open(work, "r+b") as f:
        f.seek(fill_off); f.write(r.bytes(g.fill_bytes))
        f.seek(table_off + 8 * int(r.integers(0, g.n_slots - 512))); f.write(r.bytes(4096))
    try_lookup("random bytes")
print(sorted(set(outcomes)))
"""


def test_fuzzed_index_never_ends_the_process_by_a_signal(tmp_path):
    src = HintIndex(GEOM).add(stream_of(0, 30_000)).save(str(tmp_path / "good.idx"))  # the FUZZ query's stream
    p = python(FUZZ, src, tmp_path / "fuzzed.idx")
    assert p.returncode >= 0, f"lookup process killed by signal {-p.returncode}"
    assert p.returncode == 0, p.stderr
    outcomes = dict(eval(p.stdout.strip().splitlines()[-1]))
    assert outcomes["fill 65535"] == outcomes["random fill"] == outcomes["fill 65535, every slot matching"] == "refused"
    assert outcomes["full buckets of random slots"] == "looked up"  # in bounds: no check can know the slots are junk


FUZZ_SEALED = r"""
import shutil, sys
import numpy as np
from hints import HintIndex
from hints.index import store
src, work = sys.argv[1], sys.argv[2]
idx = HintIndex.load(src, mmap=True)
lay = store.layout(idx.geom, idx.side_capacity)
query = np.random.default_rng(0).integers(0, 3, 30_000).astype(np.uint16)[:4000]  # the indexed stream
outcomes = []
for seed in range(8):
    r = np.random.default_rng(seed)
    for name in store.SEALED_ARRAYS:  # random bytes over one sealed array, header and its CRC kept
        shutil.copy(src, work)
        shape, dtype = lay["shapes"][name]
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        with open(work, "r+b") as f:
            f.seek(lay[name]); f.write(r.bytes(n))
        try:
            h = HintIndex.load(work, mmap=True, workers=2).lookup(query)
            outcomes.append((name, "looked up"))
        except ValueError as e:
            assert work in str(e), e
            outcomes.append((name, "refused"))
print(sorted(set(outcomes)))
"""


def test_fuzzed_sealed_index_never_ends_or_hangs_the_process(tmp_path):
    """A sealed index's summaries and side table, overwritten with random bytes: every lookup
    ends, by a result or by a ValueError naming the file, never by a signal or a hang."""
    idx = HintIndex(Geometry(4, 6, 64, (6, 10, 20))).add(stream_of(0, 30_000, vocab=3))  # 6-grams of 3 ids repeat
    idx.seal()
    assert idx.side_capacity > 0  # the side table exists, so fuzzing it means something
    src = idx.save(str(tmp_path / "sealed.idx"))
    p = python(FUZZ_SEALED, src, tmp_path / "fuzzed.idx")  # the timeout catches a probe that never ends
    assert p.returncode >= 0, f"lookup process killed by signal {-p.returncode}"
    assert p.returncode == 0, p.stderr
    outcomes = dict(eval(p.stdout.strip().splitlines()[-1]))
    assert outcomes["side_off"] == "refused"  # random offsets are never 0 .. capacity in powers of two


def test_fill_count_beyond_slots_is_refused_naming_the_file(tmp_path):
    path = HintIndex(GEOM).add(stream_of(1, 5_000)).save(str(tmp_path / "a.idx"))
    fill_off = store.layout(GEOM)[0]
    hdr = store.read_header(path)
    with open(path, "r+b") as f:  # bucket 3 of partition 0 claims 17 of its 16 slots ...
        f.seek(fill_off + 2 * 3)
        before = int(np.frombuffer(f.read(2), np.uint16)[0])
        f.seek(fill_off + 2 * 3)
        f.write(np.uint16(17).tobytes())
        f.seek(0)  # ... inside a consistent header (valid CRC, matching hint count)
        f.write(store.pack_header(GEOM, hdr["tokens_added"], hdr["hints_stored"] + 17 - before, 0, 0, hdr["history"]))
    with pytest.raises(ValueError, match=r"a\.idx: bucket 3 of partition 0 claims 17 hints.*16 slots"):
        HintIndex.load(path, mmap=True)


# ---- 4. no shared memory outlives a killed run -------------------------------------------------

TRAINER = r"""
import os, signal, sys, time
from hints import Geometry
from hints.index.background import BackgroundBuilder
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # a hangup ends it even when the suite runs under nohup (SIGHUP ignored)
files, tokens, name, pause = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "pause"
# as train_gpt.Background.start (a small geometry): local rank 0 builds, the other local ranks attach
handle = BackgroundBuilder(files, tokens, geometry=Geometry(4, 8, 16, (6, 10, 20)), name=name,
                           log=lambda *a: None, reserve_cpus=0).start().go()
rank1 = BackgroundBuilder.attach(name)
t = time.time()
while rank1.status()["state"] != "running" and time.time() - t < 60:
    time.sleep(0.01)
if pause:
    os.kill(handle.process.pid, signal.SIGSTOP)
print(handle.process.pid, rank1.status()["state"], flush=True)
time.sleep(600)
"""


def holders(name):
    """Files in /dev/shm and open file descriptors of any process that still name `name`."""
    found = glob.glob(f"/dev/shm/*{name}*")
    for fd in glob.glob("/proc/[0-9]*/fd/*"):
        with contextlib.suppress(OSError):
            if name in os.readlink(fd):
                found.append(fd)
    return found


def gone(pid, timeout=10.0):
    t = time.time()
    while time.time() - t < timeout:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def long_build(tmp_path_factory):
    d = tmp_path_factory.mktemp("bg")
    tokens = 24_000_000  # about a second of building: still running when the run is killed
    write_shard(d / "train_000000.bin", np.tile(stream_of(2, 1_000_000, vocab=50), tokens // 1_000_000))
    return str(d / "train_000000.bin"), tokens


@pytest.mark.parametrize("how", ["group-SIGKILL", "group-SIGHUP", "paused-builder-parent-SIGKILL"])
def test_killed_run_leaves_no_shared_memory(long_build, how):
    files, tokens = long_build
    name = f"faults{os.getpid()}{how.split('-')[1]}"
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, files, str(tokens), name,
                                "pause" if how.startswith("paused") else "run"],
                               env=ENV, cwd=REPO, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        builder_pid, state = trainer.stdout.readline().split()
        builder_pid = int(builder_pid)
        assert state == "running" and holders(name)  # the attached rank sees it; the memory is held
        if how.startswith("paused"):
            t = time.time()
            while Path(f"/proc/{builder_pid}/stat").read_text().split(")")[-1].split()[0] != "T":
                assert time.time() - t < 10, "builder not stopped"
                time.sleep(0.01)
        if how == "group-SIGKILL":
            os.killpg(trainer.pid, signal.SIGKILL)
        elif how == "group-SIGHUP":
            os.killpg(trainer.pid, signal.SIGHUP)
        else:
            os.kill(trainer.pid, signal.SIGKILL)  # the trainer alone: its builder is stopped, not killed
        trainer.wait(timeout=WAIT_S)
        assert gone(builder_pid), f"builder {builder_pid} outlived its trainer ({how})"
        assert holders(name) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()


# ---- 7 and 8. full disks, failed saves ----------------------------------------------------------

@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs: a disk that fills up."""
    d = tmp_path / "small"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs here (needs root or CAP_SYS_ADMIN): {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=True)


FILL_THE_DISK = r"""
import os, sys
import numpy as np
from hints import Geometry, HintIndex
path, filler = sys.argv[1], sys.argv[2]
g = Geometry(4, 7, 32, (6, 10, 20))  # a 512 KiB table on a 1 MiB disk
idx = HintIndex(g, path=path)
fd = os.open(filler, os.O_WRONLY | os.O_CREAT)  # another process takes all the space that is left
try:
    while True:
        os.write(fd, b"x" * 4096)
except OSError:
    os.close(fd)
idx.add(np.random.default_rng(0).integers(0, 50, 300_000).astype(np.uint16))
idx.save()
print(HintIndex.load(path, mmap=False).tokens_added)
"""


def test_full_disk_after_creation_cannot_kill_the_builder(small_tmpfs):
    p = python(FILL_THE_DISK, small_tmpfs / "i.idx", small_tmpfs / "filler")
    assert p.returncode >= 0, f"index build killed by signal {-p.returncode} (its file was sparse)"
    assert p.returncode == 0 and p.stdout.split()[-1] == "300000", p.stderr


def test_no_space_at_creation_names_the_file_and_the_bytes(small_tmpfs):
    g = Geometry(4, 8, 32, (6, 10, 20))  # 1 MiB table + fill: more than the disk holds
    path = small_tmpfs / "big.idx"
    need = store.layout(g)[2]
    with pytest.raises(OSError, match=rf"big\.idx: cannot reserve {need:,} bytes.*No space left"):
        store.create_file(str(path), g)
    assert os.listdir(small_tmpfs) == []


def test_failed_save_leaves_nothing_and_the_cli_says_one_line(small_tmpfs, tmp_path):
    idx = HintIndex(Geometry(4, 8, 32, (6, 10, 20))).add(stream_of(3, 10_000))
    with pytest.raises(OSError, match=r"x\.idx: cannot reserve"):
        idx.save(str(small_tmpfs / "x.idx"))
    assert os.listdir(small_tmpfs) == []  # no temp file left behind
    write_shard(tmp_path / "t.bin", stream_of(4, 10_000))
    r = python("import sys; from hints.cli import main; sys.exit(main())", "build", "--tokens", tmp_path / "t.bin",
               "--out", small_tmpfs / "y.idx", "--geometry", "4,8,32")
    err = error_lines(r.stderr)
    assert r.returncode == 2 and len(err) == 1 and "y.idx" in err[0] and "Traceback" not in r.stderr, r.stderr
    assert os.listdir(small_tmpfs) == []


def test_failing_write_without_a_mount(tmp_path):
    """The same without root: the OS refuses writes past a file-size limit (RLIMIT_FSIZE)."""
    write_shard(tmp_path / "t.bin", stream_of(4, 10_000))
    out = tmp_path / "out"
    out.mkdir()
    code = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 19, 1 << 19)); "
            "from hints.cli import main; sys.exit(main())")
    r = python(code, "build", "--tokens", tmp_path / "t.bin", "--out", out / "z.idx", "--geometry", "4,8,32")
    err = error_lines(r.stderr)
    assert r.returncode == 2 and len(err) == 1 and "z.idx" in err[0] and "Traceback" not in r.stderr, r.stderr
    assert os.listdir(out) == []
    r = python(code, "build", "--in-place", "--tokens", tmp_path / "t.bin", "--out", out / "w.idx", "--geometry", "4,8,32")
    assert r.returncode == 2 and "w.idx" in r.stderr and os.listdir(out) == [], r.stderr


def test_lengths_are_checked_when_the_geometry_is_made(tmp_path):
    with pytest.raises(ValueError, match="longest supported n-gram length is 64"):
        Geometry(4, 8, 16, (6, 10, 65))
    write_shard(tmp_path / "t.bin", stream_of(4, 1_000))
    r = python("import sys; from hints.cli import main; sys.exit(main())", "build", "--tokens", tmp_path / "t.bin",
               "--out", tmp_path / "l.idx", "--lengths", "6,10,100")
    err = error_lines(r.stderr)
    assert r.returncode == 2 and len(err) == 1 and "64" in err[0] and not (tmp_path / "l.idx").exists(), r.stderr


# ---- 12. shared-folder hygiene (hints) ----------------------------------------------------------

def test_index_files_are_private_and_never_follow_a_planted_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = tmp_path / "seg.idx"
    link.symlink_to(victim)
    idx = HintIndex(GEOM, path=str(link))  # a file-backed (shared-memory style) segment
    assert not link.is_symlink() and victim.read_text() == "keep me"
    assert link.stat().st_mode & 0o777 == 0o600
    idx.add(stream_of(5, 2_000))
    saved = idx.save(str(tmp_path / "copy.idx"))
    assert os.stat(saved).st_mode & 0o777 == 0o600


def test_builder_spec_is_not_in_its_command_line(tmp_path):
    write_shard(tmp_path / "secret_train_000000.bin", stream_of(6, 20_000))
    b = BackgroundBuilder(str(tmp_path / "secret_train_000000.bin"), 20_000, geometry=GEOM, workers=1,
                          name=f"faults{os.getpid()}argv", log=lambda *a: None).start().go()
    try:
        cmdline = Path(f"/proc/{b.process.pid}/cmdline").read_bytes().decode()
        assert "secret_train" not in cmdline and "{" not in cmdline
        t = time.time()
        while b.status()["state"] not in ("ready", "failed") and time.time() - t < WAIT_S:
            time.sleep(0.05)
        assert b.ready(), b.status()
    finally:
        b.close()


# ---- 9. stale or partial shard sets are refused -------------------------------------------------

def docs(n, words=40):
    return [f"document {i}: " + "lorem ipsum dolor sit amet " * words for i in range(n)]


def test_rerun_with_fewer_documents_leaves_no_old_shards(tmp_path):
    from data.fineweb import write_shards
    from data.loader import read_tokens
    from data.tokenizer import encode_document
    big = write_shards(docs(40), tmp_path, shard_size=1000, workers=1, progress=False)
    small = write_shards(docs(6), tmp_path, shard_size=1000, workers=1, progress=False)
    assert len(big["shards"]) > len(small["shards"]) >= 2
    assert sorted(glob.glob(str(tmp_path / "fineweb_*.bin"))) == sorted(small["shards"])
    want = np.concatenate([encode_document(t) for t in docs(6)])
    np.testing.assert_array_equal(read_tokens(str(tmp_path / "fineweb_val_*.bin")), want[:1000])
    np.testing.assert_array_equal(read_tokens(str(tmp_path / "fineweb_train_*.bin")), want[1000:])


def test_shard_folders_need_a_manifest_that_agrees(tmp_path):
    from data.loader import read_tokens, resolve_files
    for i in range(3):
        write_shard(tmp_path / f"train_{i:06d}.bin", stream_of(i, 1000))
    pattern = str(tmp_path / "train_*.bin")
    assert resolve_files(str(tmp_path / "train_000001.bin"))  # an explicit file stands on its own, unrecorded
    assert not (tmp_path / "manifest.json").exists()
    r = python("from data.loader import read_tokens; import sys; print(len(read_tokens(sys.argv[1])))", pattern)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "3000", r.stderr  # a glob's first read records the set
    assert f"{tmp_path} had no manifest.json; recorded its 3 shards (3,000 tokens" in r.stdout
    assert len(read_tokens(pattern)) == 3000

    write_shard(tmp_path / "train_000003.bin", stream_of(9, 500))  # a leftover of another run
    with pytest.raises(ValueError, match=r"train_000003\.bin is not in .*manifest\.json"):
        read_tokens(pattern)
    with pytest.raises(ValueError, match=r"train_000003\.bin is not in"):
        resolve_files(str(tmp_path / "train_000003.bin"))  # an explicit file in a folder with a manifest too
    os.remove(tmp_path / "train_000003.bin")

    write_shard(tmp_path / "train_000002.bin", stream_of(2, 999))  # rewritten: one token fewer
    with pytest.raises(ValueError, match=r"train_000002\.bin disagrees with .*1,998 bytes|train_000002\.bin disagrees"):
        read_tokens(pattern)
    os.remove(tmp_path / "train_000002.bin")  # an interrupted write: a listed shard is missing
    with pytest.raises(ValueError, match=r"lists train_000002\.bin, which is missing"):
        read_tokens(pattern)


def test_verify_reads_every_byte(tmp_path):
    from data.manifest import main
    write_shard(tmp_path / "val_000000.bin", stream_of(1, 1000))
    main([str(tmp_path)])
    main([str(tmp_path), "--verify"])
    with open(tmp_path / "val_000000.bin", "r+b") as f:  # same size and header, one token changed
        f.seek(2000)
        f.write(b"\x07\x00")
    with pytest.raises(SystemExit, match=r"val_000000\.bin: sha256 is"):
        main([str(tmp_path), "--verify"])


# ---- 5. token ids beyond the vocabulary, found before training ----------------------------------

@pytest.mark.parametrize("split", ["train", "val"])
def test_token_id_beyond_vocab_names_file_position_and_value(tmp_path, split):
    from data.manifest import check_token_ids, read_manifest, write_manifest
    good = stream_of(0, 5000, vocab=50257)
    bad = good.copy()
    bad[1234] = 50300
    write_shard(tmp_path / f"{split}_000000.bin", good)
    write_shard(tmp_path / f"{split}_000001.bin", bad)
    write_manifest(tmp_path)
    assert read_manifest(tmp_path)["files"][f"{split}_000001.bin"]["max_id"] == 50300  # recorded: no shard re-read
    assert check_token_ids(str(tmp_path / f"{split}_000000.bin"), 50257) == good.max()
    with pytest.raises(ValueError, match=rf"{split}_000001\.bin: token id 50300 at position 1,234 .* < 50257"):
        check_token_ids(str(tmp_path / f"{split}_*.bin"), 50257)
    os.remove(tmp_path / "manifest.json")  # a single explicit file without a manifest is scanned
    with pytest.raises(ValueError, match=rf"{split}_000001\.bin: token id 50300 at position 1,234"):
        check_token_ids(str(tmp_path / f"{split}_000001.bin"), 50257)


# ---- 12. shard writing and downloads (data) -----------------------------------------------------

def test_shard_writer_refuses_ids_it_cannot_store(tmp_path):
    from data.shards import ShardWriter
    w = ShardWriter(lambda i: str(tmp_path / f"s_{i:06d}.bin"), shard_tokens=10)
    with pytest.raises(ValueError, match=r"s_000000\.bin.*\[0, 65535\], got values in \[3, 70000\]"):
        w.add(np.array([3, 70000]))
    with pytest.raises(ValueError, match=r"\[-1, 5\]"):
        w.add(np.array([-1, 5]))
    assert w.total == 0 and w.close() == []


def test_downloads_are_pinned_and_checked_against_the_hub(tmp_path):
    import hashlib
    from data.download import VARIANTS, HubDownloadError, verify_download
    assert len(VARIANTS["10B"]["revision"]) == 40 and int(VARIANTS["10B"]["revision"], 16) >= 0
    path = write_shard(tmp_path / "fineweb_val_000000.bin", stream_of(3, 2000, vocab=50257))
    raw = Path(path).read_bytes()
    entry = verify_download(path, (len(raw), "sha256", hashlib.sha256(raw).hexdigest()))
    assert entry["tokens"] == 2000 and entry["sha256"] == hashlib.sha256(raw).hexdigest()
    blob = hashlib.sha1(b"blob %d\0" % len(raw) + raw).hexdigest()  # a file kept in git, not LFS
    verify_download(path, (len(raw), "git-sha1", blob))
    with pytest.raises(HubDownloadError, match=r"fineweb_val_000000\.bin is 5,024 bytes, the hub says 5,025"):
        verify_download(path, (len(raw) + 1, "sha256", hashlib.sha256(raw).hexdigest()))
    with open(path, "r+b") as f:  # one byte changed in transit: size and header still right
        f.seek(3000)
        f.write(bytes([raw[3000] ^ 1]))
    with pytest.raises(HubDownloadError, match=r"fineweb_val_000000\.bin has sha256 .*the hub says"):
        verify_download(path, (len(raw), "sha256", hashlib.sha256(raw).hexdigest()))
