"""Background hint building: a separate OS process fills a shared-memory index from training shards.

The training run starts it (local rank 0, once per node) before its clock; the builder runs
on cores the training ranks leave free. Before the clock it only gets ready: it reserves its
table in shared memory and pre-faults it on all its threads, with huge pages where the kernel
allows (hints/index/memory.py), reads the shards into the page cache, and reports "armed". It hashes
its first token when the trainer's `go()` (at the clock's start) says so, adds up to
`max_tokens` training tokens, seals and reports "ready", with every time counted from the
clock's start (build_started_s, ready_s) and the tokens it had indexed when the clock started
(tokens_done_at_clock_start: 0 by construction, and measured). Every rank can `attach` by
name and, once the status says ready, map the index read-only.

Failure is part of the contract: if the builder dies (killed, out of memory, bad shard),
`status()` says "failed" with the reason; the trainer decides what that means (the record
preset fails the attempt, experiments fall back to another index).

Nothing outlives the run, however it ends. The index and the status live in anonymous
shared memory (two memfds, never a name in /dev/shm), kept alive only by the processes that
hold them: the process that started the builder (the owner), the builder, and the ranks that
attached. When the last of them exits or is killed, even all at once by a SIGKILL of the
whole process group, the kernel frees the memory. The builder dies with its parent
(PR_SET_PDEATHSIG with SIGKILL, which also ends a builder paused by SIGSTOP; so the thread
that calls `start()` must live as long as the run: the trainer's main thread), exits on
SIGTERM, SIGHUP and SIGINT, and gets its spec on stdin, not in its argv.

Attaching by name: the owner serves the two file descriptors on an abstract unix socket
(`\\0hints-<name>`: no file, gone with its socket), to processes of the same user only, so
the other local ranks attach after a barrier that follows `start()`. Ranks on one node share
a network namespace (torchrun's local ranks do), which abstract sockets need.
"""
import ctypes
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import zlib

from data.loader import CHUNK_TOKENS, resolve_files
from data.shards import HEADER_BYTES
from data.units import human_tokens, parse_token_count

from ..tokens import count_tokens, iter_chunks
from .geometry import DEFAULT_LENGTHS, Geometry
from .hint_index import HintIndex, compile_kernels

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # above hints/index/
SHM_DIR = "/dev/shm"         # where named shared memory would show; this module never names any (tests look there)
STATUS_EVERY_S = 1.0         # at most one status write per second
PR_SET_PDEATHSIG = 1         # linux/prctl.h
STATUS_BYTES = 1 << 16       # the status record's memfd: a JSON dict, tracebacks cut to fit
_STATUS_HEAD = struct.Struct("<II")  # JSON length, CRC32 of the JSON (a torn read fails the CRC and is retried)
STATUS_READ_TRIES = 100      # a reader retries a torn status read this often, 1 ms apart
SERVE_POLL_S = 0.2           # the owner's socket thread checks this often whether close() was called
ATTACH_TIMEOUT_S = 30.0      # an attaching rank waits this long for the owner's answer
MAX_NAME_BYTES = 100         # an abstract socket address holds 107 bytes; "hints-" + name must fit
SO_PEERCRED_FMT = "3i"       # struct ucred: pid, uid, gid
PAGE_CACHE_READ_BYTES = 16 << 20  # the builder reads its shards into the page cache in blocks of this size
BUILDING = ("starting", "armed", "running")  # states in which the index may still come


def socket_address(name):
    """The abstract unix socket (leading NUL: no file) on which the owner of `name` serves it."""
    if not name or len(name.encode()) > MAX_NAME_BYTES or "/" in name or "\0" in name:
        raise ValueError(f"background index name {name!r}: expected 1 to {MAX_NAME_BYTES} bytes without '/' or NUL")
    return f"\0hints-{name}"


def write_status(fd, status):
    """Replace the status record in memfd `fd` (one pwrite: length, CRC32, JSON)."""
    body = json.dumps(status).encode()
    room = STATUS_BYTES - _STATUS_HEAD.size
    if len(body) > room and status.get("traceback"):
        cut = status["traceback"][-(room // 2):]  # keep the end of a long traceback: it names the failure
        body = json.dumps(dict(status, traceback=cut)).encode()
    body = body[:room]
    os.pwrite(fd, _STATUS_HEAD.pack(len(body), zlib.crc32(body)) + body, 0)


def read_status(fd):
    """The status dict in memfd `fd`, or None before the builder's first write."""
    for _ in range(STATUS_READ_TRIES):
        raw = os.pread(fd, STATUS_BYTES, 0)
        n, crc = _STATUS_HEAD.unpack_from(raw)
        if n == 0:
            return None
        body = raw[_STATUS_HEAD.size:_STATUS_HEAD.size + n]
        if len(body) == n and zlib.crc32(body) == crc:
            return json.loads(body)
        time.sleep(0.001)  # the builder is rewriting it
    raise RuntimeError(f"background status record unreadable after {STATUS_READ_TRIES} tries")


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


def _peer_uid(sock):
    return struct.unpack(SO_PEERCRED_FMT, sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize(SO_PEERCRED_FMT)))[1]


def warm_page_cache(pattern, max_tokens, block=PAGE_CACHE_READ_BYTES):
    """Read the shards holding the first max_tokens tokens once, so that the build reads them from
    the page cache (before the clock: reading is not building). Returns (bytes read, seconds)."""
    t0, done, left = time.monotonic(), 0, int(max_tokens) * 2 + HEADER_BYTES  # uint16 tokens after a header
    if not isinstance(pattern, str) or not pattern.endswith(".npy"):
        buf = bytearray(block)
        for path in resolve_files(pattern):
            with open(path, "rb", buffering=0) as f:
                while left > 0 and (n := f.readinto(buf)):
                    done, left = done + n, left - n
            left -= HEADER_BYTES  # the next shard has its own header
            if left <= 0:
                break
    return done, time.monotonic() - t0


def _build_main(spec, commands):
    """The builder process (`python -m hints.index.background`): spec from the first line of stdin, then
    it reserves and pre-faults the table, reads the shards into the page cache, loads its kernels
    and reports "armed"; it hashes its first token only when the trainer's next line says the clock started."""
    def leave(signum, frame):
        os._exit(128 + signum)  # nothing to clean: the memory goes with the last process holding it

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, leave)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != spec["parent_pid"]:  # the parent died before prctl took effect
        os._exit(1)
    index_fd, status_fd, max_tokens = spec["index_fd"], spec["status_fd"], spec["max_tokens"]
    if spec["cpus"]:
        os.sched_setaffinity(0, spec["cpus"])
    status = dict(state="starting", pid=os.getpid(), tokens_done=0, tokens_total=max_tokens, tokens_per_s=0.0,
                  eta_s=None, error=None, geometry=spec["geometry"], workers=spec["workers"], started=time.time())
    try:
        write_status(status_fd, status)
        geom = Geometry(**spec["geometry"])
        idx = HintIndex(geom, workers=spec["workers"], path=index_fd).reserve(min(max_tokens, CHUNK_TOKENS))
        cached, cache_s = warm_page_cache(spec["train_files"], max_tokens)
        kernels_s = compile_kernels(geom.lengths)  # loaded from Numba's cache (the trainer compiled them)
        status.update(state="armed", prefault=idx.prefault, page_cache_bytes=cached, page_cache_s=cache_s,
                      kernels_s=kernels_s)
        write_status(status_fd, status)
        line = commands.readline()  # blocks until the clock starts (EOF: the trainer let go without one)
        if not line:
            raise RuntimeError("the trainer closed the builder's input before its clock started")
        clock = json.loads(line)["clock_start"]  # CLOCK_MONOTONIC, one clock for every process of the node
        t0 = last = time.monotonic()
        status.update(state="running", clock_start=clock, build_started_s=t0 - clock)
        write_status(status_fd, status)
        for chunk in iter_chunks(spec["train_files"], max_tokens, CHUNK_TOKENS):
            idx.add(chunk)
            now = time.monotonic()
            if now - last >= STATUS_EVERY_S:
                tps = idx.tokens_added / (now - t0)
                status.update(tokens_done=idx.tokens_added, tokens_per_s=tps,
                              eta_s=(max_tokens - idx.tokens_added) / tps if tps else None)
                write_status(status_fd, status)
                last = now
        if spec["seal"]:  # sorted buckets + side table: every rank's lookups search instead of scanning
            t_seal = time.monotonic()
            idx.seal()
            status.update(seal_seconds=time.monotonic() - t_seal)
        idx.save()
        now = time.monotonic()
        dt = now - t0
        status.update(state="ready", tokens_done=idx.tokens_added, tokens_total=idx.tokens_added,
                      tokens_per_s=idx.tokens_added / max(dt, 1e-9), eta_s=0.0, seconds=dt, ready_s=now - clock,
                      hints_stored=idx.hints_stored, dropped=idx.dropped)
        del idx  # the sealed arrays now live in the memfd; this process keeps no copy
        write_status(status_fd, status)
    except BaseException as e:  # report every failure; the trainer decides what a missing index means
        os.ftruncate(index_fd, 0)  # a half-built index is of no use: give its memory back now
        status.update(state="failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        write_status(status_fd, status)
        raise SystemExit(1)


def default_cpus(reserve):
    """Cores for the builder: all this process may use but the first `reserve` (kept for training)."""
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[reserve:] if len(cpus) > reserve else cpus


class BackgroundBuilder:
    """Build an index of the first max_tokens training tokens in a separate process.

    Owner: BackgroundBuilder(...).start(), then status()/ready()/open(), close() at the end.
    Other local ranks: BackgroundBuilder.attach(name) after a barrier that follows start().
    """

    def __init__(self, train_files, max_tokens, geometry=None, lengths=DEFAULT_LENGTHS, workers=None, name=None,
                 cpus=None, reserve_cpus=0, log=print, seal=True):
        available = count_tokens(train_files)
        self.max_tokens = parse_token_count(max_tokens)
        if available < self.max_tokens:
            log(f"background hints: asked for {self.max_tokens:,} tokens, the training shards hold {available:,}; using all")
            self.max_tokens = available
        self.geometry = geometry or Geometry.for_tokens(self.max_tokens, lengths=lengths)
        self.cpus = list(cpus) if cpus is not None else default_cpus(reserve_cpus)
        self.workers = int(workers or len(self.cpus))
        self.train_files = train_files
        self.seal = bool(seal)  # seal the finished index (faster lookups; costs an O(table) pass before "ready")
        self.name = name or f"{os.getpid()}-{int(time.time())}"
        self.address = socket_address(self.name)
        self.log = log
        self.process = None
        self._fds = None      # (index memfd, status memfd) while this handle holds them
        self._server = None   # the owner's listening socket
        self._stop = None
        self._went = False          # go() sent
        self.tokens_at_clock = None  # tokens the builder had indexed when the clock started (0 in a legal run)

    def start(self):
        self.geometry.check_fits_memory(what="background hint index (shared memory)")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            server.bind(self.address)
        except OSError as e:
            server.close()
            raise RuntimeError(f"background hint index {self.name}: cannot serve it ({e.strerror}); "
                               f"is another run on this node using the same name?") from None
        server.listen()
        server.settimeout(SERVE_POLL_S)
        index_fd = os.memfd_create(f"hints-{self.name}.idx", os.MFD_CLOEXEC)
        status_fd = os.memfd_create(f"hints-{self.name}.status", os.MFD_CLOEXEC)
        os.ftruncate(status_fd, STATUS_BYTES)
        self._fds, self._server, self._stop = (index_fd, status_fd), server, threading.Event()
        threading.Thread(target=self._serve, name=f"hints-{self.name}", daemon=True).start()
        spec = dict(train_files=self.train_files, max_tokens=self.max_tokens, geometry=self.geometry.to_dict(),
                    workers=self.workers, cpus=self.cpus, index_fd=index_fd, status_fd=status_fd,
                    parent_pid=os.getpid(), seal=self.seal)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO_ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        # a fresh interpreter, not a fork: the trainer holds CUDA state and threads
        self.process = subprocess.Popen([sys.executable, "-m", "hints.index.background"], stdin=subprocess.PIPE,
                                        pass_fds=self._fds, env=env)
        try:  # the spec is the first line; stdin stays open for go()
            self.process.stdin.write(json.dumps(spec).encode() + b"\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # it died at once; status() reports the exit code
        self.log(f"background hints: armed to build {self.max_tokens:,} tokens in shared memory ({self.name}, "
                 f"{self.geometry.describe()}) with {self.workers} worker(s) on cpus {self.cpus}, from the clock's start")
        return self

    def wait_armed(self, timeout_s=None, poll_s=0.05):
        """Wait (before the clock) until the builder has reserved and pre-faulted its table and read its
        shards into the page cache, or failed; the state it ended in."""
        deadline = time.monotonic() + (float("inf") if timeout_s is None else timeout_s)
        while (state := self.status()["state"]) == "starting" and time.monotonic() < deadline:
            time.sleep(poll_s)
        return state

    def go(self, clock_start=None):
        """The clock started (time.monotonic() at its start, default now): the builder may hash. Owner
        only, once; what the builder had indexed at that moment is kept as tokens_done_at_clock_start."""
        if self.process is None or self._went:
            return self
        self._went = True
        clock_start = time.monotonic() if clock_start is None else clock_start
        self.tokens_at_clock = int(self.status().get("tokens_done") or 0)
        try:
            self.process.stdin.write(json.dumps(dict(clock_start=clock_start)).encode() + b"\n")
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # it died; status() says so
        return self

    def _serve(self):
        """Owner's thread: hand both memfds to every same-user process that connects."""
        server, fds, stop = self._server, self._fds, self._stop
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            except OSError:
                return  # closed
            with conn:
                try:
                    if _peer_uid(conn) == os.getuid():
                        socket.send_fds(conn, [b"hints"], list(fds))
                except OSError:
                    pass  # the attaching process went away

    @classmethod
    def attach(cls, name, log=print, timeout=ATTACH_TIMEOUT_S):
        """A handle on a builder another local process started (status/ready/open/close only).
        Raises RuntimeError when no process of this user serves `name` on this node."""
        self = cls.__new__(cls)
        self.name, self.log, self.process, self._server, self._stop = name, log, None, None, None
        self._went, self.tokens_at_clock = False, None
        self.address = socket_address(name)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(timeout)
        try:
            sock.connect(self.address)
            if _peer_uid(sock) != os.getuid():
                raise RuntimeError(f"background hint index {name}: served by another user; refusing it")
            _, fds, _, _ = socket.recv_fds(sock, 16, 2)
        except OSError as e:
            raise RuntimeError(f"background hint index {name}: nobody serves it on this node ({e.strerror or e}); "
                               f"local rank 0 must call start() before the barrier") from None
        finally:
            sock.close()
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            raise RuntimeError(f"background hint index {name}: expected 2 file descriptors, got {len(fds)}")
        for fd in fds:
            os.set_inheritable(fd, False)  # a child this rank starts must not keep the memory alive
        self._fds = tuple(fds)
        return self

    def status(self):
        if self._fds is None:
            return dict(state="failed", error=f"background hint index {self.name}: handle closed or never started",
                        tokens_done=0, tokens_total=None, tokens_per_s=0.0, eta_s=None)
        st = read_status(self._fds[1]) or dict(state="starting", tokens_done=0, tokens_total=None,
                                                tokens_per_s=0.0, eta_s=None, error=None)
        if self.tokens_at_clock is not None:
            st["tokens_done_at_clock_start"] = self.tokens_at_clock
        if st["state"] in BUILDING:
            pid = self.process.pid if self.process is not None else st.get("pid")
            dead = (self.process is not None and self.process.poll() is not None) or (
                self.process is None and pid is not None and not _alive(pid))
            if dead:
                code = self.process.returncode if self.process is not None else None
                st = dict(st, state="failed", error=f"builder process {pid} died (exit code {code})")
        return st

    def ready(self):
        return self.status()["state"] == "ready"

    def wait(self, timeout_s, poll_s=0.5):
        """Wait up to timeout_s while the build is starting or running; the state it ended in."""
        deadline = time.monotonic() + timeout_s
        while (state := self.status()["state"]) in BUILDING and time.monotonic() < deadline:
            time.sleep(poll_s)
        return state

    def open(self, workers=1):
        """The finished index, mapped read-only from shared memory (the map keeps it alive)."""
        st = self.status()
        if st["state"] != "ready":
            raise RuntimeError(f"background hint index {self.name} is not ready (state {st['state']})")
        return HintIndex.load(f"/proc/self/fd/{self._fds[0]}", mmap=True, workers=workers)

    def describe(self):
        """One line for logs: 'starting', progress with rate and ETA, 'ready (N tokens)' or 'failed (why)'."""
        st = self.status()
        state = st["state"]
        if state == "ready":
            return (f"ready ({human_tokens(st['tokens_done'])} tokens in {st.get('seconds', 0):.1f}s, "
                    f"{st.get('ready_s', 0):.2f}s after the clock started)")
        if state == "failed":
            return f"failed ({st['error']})"
        if state == "starting":
            return "starting"
        if state == "armed":
            return "armed (table reserved and pre-faulted, waiting for the clock)"
        eta = f", eta {st['eta_s']:.0f}s" if st.get("eta_s") is not None else ""
        return (f"{human_tokens(st['tokens_done'])}/{human_tokens(st['tokens_total'] or 0)} tokens, "
                f"{human_tokens(st['tokens_per_s'])} tok/s{eta}")

    def close(self):
        """Let go of the index (idempotent). The owner also stops the builder if it still runs
        and stops serving the name; the memory is freed once no process holds or maps it."""
        if self.process is not None and self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except BrokenPipeError:
                pass
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.send_signal(signal.SIGCONT)  # a paused (SIGSTOP) builder must see the SIGTERM
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._server is not None:
            self._stop.set()
            self._server.close()
            self._server = None
        if self._fds is not None:
            for fd in self._fds:
                os.close(fd)
            self._fds = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


def start_for_node(train_files, max_tokens, lengths, name, owner, barrier, log, reserve_cpus=0, geometry=None,
                   cpus=None, workers=None, seal=True):
    """The node's background index for a training run: the owner (local rank 0) starts the
    builder, then, after `barrier()`, every other local rank attaches by name. Never raises: a
    builder that cannot start is logged and None comes back. cpus: the builder's cores (default:
    all but the first reserve_cpus, which the ranks keep); workers: its threads (default: one per cpu);
    seal: seal the index before reporting ready (faster lookups, an O(table) pass before ready)."""
    handle, error = None, None
    if owner:
        try:
            handle = BackgroundBuilder(train_files, max_tokens, geometry=geometry, lengths=lengths, name=name,
                                       log=log, cpus=cpus, reserve_cpus=reserve_cpus, workers=workers,
                                       seal=seal).start()
        except Exception as e:  # noqa: BLE001 - reported; the run goes on without it
            error = f"{type(e).__name__}: {e}"
    barrier()
    if not owner:
        try:
            handle = BackgroundBuilder.attach(name, log=log)
        except RuntimeError as e:  # the owner could not start it: the same fallback
            error = str(e)
    if error:
        log(f"background index: not building ({error})")
    return handle


if __name__ == "__main__":
    _build_main(json.loads(sys.stdin.readline()), sys.stdin)
