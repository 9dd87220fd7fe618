"""Background hint building: a separate OS process fills a shared-memory index from training shards.

The training run starts it (local rank 0, once per node) and goes on training; the builder
runs on cores the training ranks leave free, adds up to `max_tokens` training tokens to an
index backed by a file in /dev/shm, and reports progress in a small status file beside it.
Every rank can `attach` by name and, once the status says ready, map the index read-only.

Failure is part of the contract: if the builder dies (killed, out of memory, bad shard),
`status()` says "failed" with the reason, and training goes on with its fallback index.
The builder exits when its parent exits (PR_SET_PDEATHSIG, and a parent check between
chunks), and `close()` removes the shared-memory files; so does the builder itself on SIGTERM.
A finished builder stays (asleep) as the keeper of its files until the trainer closes it or
dies, so not even a trainer killed with SIGKILL leaves shared memory behind.
"""
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import traceback

from .geometry import Geometry
from .index import HintIndex
from .tokens import count_tokens, iter_chunks

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
CHUNK_TOKENS = 1 << 24       # tokens per add() call: status is refreshed after each chunk
STATUS_EVERY_S = 1.0         # at most one status write per second
PR_SET_PDEATHSIG = 1         # linux/prctl.h
PARENT_POLL_S = 1.0          # a finished builder checks this often that its parent still runs


def parse_token_count(text):
    """'75M', '1.2B', '37B', '4096' or 1.2e9 -> an int token count."""
    if isinstance(text, (int, float)):
        return int(text)
    s = str(text).strip().upper().replace("_", "").replace(",", "")
    mult = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}.get(s[-1:], 1)
    try:
        return int(float(s[:-1] if mult > 1 else s) * mult)
    except ValueError:
        raise ValueError(f"token count {text!r}: expected a number like 75M, 1.2B or 37B") from None


def paths(name):
    base = os.path.join(SHM_DIR, f"hints-{name}")
    return base + ".idx", base + ".json"


def _write_status(status_file, status):
    tmp = f"{status_file}.tmp"
    with open(tmp, "w") as f:
        json.dump(status, f)
    os.replace(tmp, status_file)


def _read_status(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited, not yet reaped) is not alive for us
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _build_main(train_files, max_tokens, geom_dict, workers, cpus, idx_path, status_path, parent_pid, seal=True):
    """Entry point of the builder process (`python -m hints.background SPEC_JSON`)."""
    def cleanup_and_exit(signum, frame):
        for p in (idx_path, status_path):
            try:
                os.unlink(p)
            except OSError:
                pass
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, cleanup_and_exit)
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    if cpus:
        os.sched_setaffinity(0, cpus)
    status = dict(state="running", pid=os.getpid(), tokens_done=0, tokens_total=max_tokens, tokens_per_s=0.0,
                  eta_s=None, error=None, path=idx_path, geometry=geom_dict, workers=workers, started=time.time())
    try:
        geom = Geometry(**geom_dict)
        idx = HintIndex(geom, workers=workers, path=idx_path).reserve(min(max_tokens, CHUNK_TOKENS))
        t0 = last = time.time()
        _write_status(status_path, status)
        for chunk in iter_chunks(train_files, max_tokens, CHUNK_TOKENS):
            if os.getppid() != parent_pid:  # parent gone (PDEATHSIG is the fast path)
                cleanup_and_exit(signal.SIGTERM, None)
            idx.add(chunk)
            now = time.time()
            if now - last >= STATUS_EVERY_S:
                tps = idx.tokens_added / (now - t0)
                status.update(tokens_done=idx.tokens_added, tokens_per_s=tps,
                              eta_s=(max_tokens - idx.tokens_added) / tps if tps else None)
                _write_status(status_path, status)
                last = now
        if seal:  # sorted buckets + side table: every rank's lookups search instead of scanning
            t_seal = time.time()
            idx.seal()
            status.update(seal_seconds=time.time() - t_seal)
        idx.save()
        dt = time.time() - t0
        status.update(state="ready", tokens_done=idx.tokens_added, tokens_total=idx.tokens_added,
                      tokens_per_s=idx.tokens_added / max(dt, 1e-9), eta_s=0.0, seconds=dt,
                      hints_stored=idx.hints_stored, dropped=idx.dropped)
        del idx  # the keeper below holds no memory: the sealed arrays now live in the file
        _write_status(status_path, status)
        # stay as the files' keeper: if the trainer dies without close(), remove them
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        cleanup_and_exit(signal.SIGTERM, None)
    except BaseException as e:  # report every failure; the trainer goes on without this index
        try:
            os.unlink(idx_path)  # a half-built index is of no use to anyone
        except OSError:
            pass
        status.update(state="failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        _write_status(status_path, status)
        raise SystemExit(1)


def default_cpus(reserve):
    """Cores for the builder: all this process may use but the first `reserve` (kept for training)."""
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[reserve:] if len(cpus) > reserve else cpus


class BackgroundBuilder:
    """Build an index of the first max_tokens training tokens in a separate process."""

    def __init__(self, train_files, max_tokens, geometry=None, workers=None, name=None, cpus=None,
                 reserve_cpus=0, log=print, seal=True):
        available = count_tokens(train_files)
        self.max_tokens = parse_token_count(max_tokens)
        if available < self.max_tokens:
            log(f"background hints: asked for {self.max_tokens:,} tokens, the training shards hold {available:,}; using all")
            self.max_tokens = available
        self.geometry = geometry or Geometry.for_tokens(self.max_tokens)
        self.cpus = list(cpus) if cpus is not None else default_cpus(reserve_cpus)
        self.workers = int(workers or len(self.cpus))
        self.train_files = train_files
        self.seal = bool(seal)  # seal the finished index (faster lookups; costs an O(table) pass before "ready")
        self.name = name or f"{os.getpid()}-{int(time.time())}"
        self.idx_path, self.status_path = paths(self.name)
        self.log = log
        self.process = None
        self._announced = False

    def start(self):
        self.geometry.check_fits_memory(what="background hint index (shared memory)")
        spec = dict(train_files=self.train_files, max_tokens=self.max_tokens, geom_dict=self.geometry.to_dict(),
                    workers=self.workers, cpus=self.cpus, idx_path=self.idx_path, status_path=self.status_path,
                    parent_pid=os.getpid(), seal=self.seal)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO_ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        # a fresh interpreter, not a fork: the trainer holds CUDA state and threads
        self.process = subprocess.Popen([sys.executable, "-m", "hints.background", json.dumps(spec)], env=env)
        self.log(f"background hints: building {self.max_tokens:,} tokens into {self.idx_path} "
                 f"({self.geometry.describe()}) with {self.workers} worker(s) on cpus {self.cpus}")
        return self

    @classmethod
    def attach(cls, name, log=print):
        """A handle on a builder another process started (for status/ready/open only)."""
        self = cls.__new__(cls)
        self.name, self.log, self.process, self._announced = name, log, None, False
        self.idx_path, self.status_path = paths(name)
        return self

    def status(self):
        st = _read_status(self.status_path) or dict(state="starting", tokens_done=0, tokens_total=None,
                                                    tokens_per_s=0.0, eta_s=None, error=None)
        if st["state"] in ("running", "starting"):
            pid = self.process.pid if self.process is not None else st.get("pid")
            dead = (self.process is not None and self.process.poll() is not None) or (
                self.process is None and pid is not None and not _alive(pid))
            if dead:
                code = self.process.returncode if self.process is not None else None
                st = dict(st, state="failed", error=f"builder process {pid} died (exit code {code})")
        return st

    def ready(self):
        return self.status()["state"] == "ready"

    def open(self, workers=1):
        """The finished index, mapped read-only from shared memory."""
        st = self.status()
        if st["state"] != "ready":
            raise RuntimeError(f"background hint index {self.idx_path} is not ready (state {st['state']})")
        return HintIndex.load(self.idx_path, mmap=True, workers=workers)

    def describe(self):
        st = self.status()
        if st["state"] == "ready":
            return f"ready: {st['tokens_done']:,} tokens in {st.get('seconds', 0):.1f}s"
        if st["state"] == "failed":
            return f"FAILED: {st['error']}"
        if st["state"] == "starting":
            return "starting"
        eta = f", ETA {st['eta_s']:.0f}s" if st.get("eta_s") is not None else ""
        return (f"{st['tokens_done'] / 1e6:,.0f}M/{(st['tokens_total'] or 0) / 1e6:,.0f}M tokens, "
                f"{st['tokens_per_s'] / 1e6:.0f}M tok/s{eta}")

    def close(self):
        """Stop the builder if it still runs and remove its shared memory (idempotent). Only the
        starting process removes files; attached handles just let go."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.send_signal(signal.SIGCONT)  # a paused (SIGSTOP) builder must see the SIGTERM
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is None:
            return  # attached handles leave the files to the process that started the builder
        for p in (self.idx_path, self.status_path, self.status_path + ".tmp"):
            try:
                os.unlink(p)
            except OSError:
                pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


if __name__ == "__main__":
    _build_main(**json.loads(sys.argv[1]))
