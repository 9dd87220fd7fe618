"""The run's process context and its log.

`Dist` is the torchrun context (rank, world, local rank, device; barrier, broadcast, all-ranks
minimum, gather), set up by `init_dist()`: nccl on CUDA, gloo on CPU, nothing with one process.
`Log` prints on rank 0 and appends to the run's log file (and wandb when enabled).
`run_header()` is what every log file starts with, as the speedrun's logs do: the exact source
of the code the run imported from this repo, the package versions and the hardware, so a run
can be checked, and rerun, from its log alone.
"""
import contextlib
import ctypes
import dataclasses
import datetime
import gc
import os
import platform
import subprocess
import sys
import uuid
from importlib import metadata

import torch
import torch.distributed as dist

# CPU runs: the demo's 50k-wide logits are ~100 MB blocks that glibc maps fresh and returns on
# every allocation (measured: ~250k page faults, ~40% of a demo step). No mmap for big blocks, no
# trimming, a 1 GiB heap pad: 0 faults, ~25% less time per step. (mallopt's parameter numbers.)
GLIBC_M_TRIM_THRESHOLD, GLIBC_M_TOP_PAD, GLIBC_M_MMAP_MAX = -1, -2, -4
REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Packages whose versions go into the run header: the ones the numbers depend on.
HEADER_PACKAGES = ("torch", "triton", "numpy", "numba", "tiktoken", "datasets", "huggingface-hub", "wandb")


@dataclasses.dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def distributed(self):
        return self.world_size > 1

    @property
    def master(self):
        return self.rank == 0

    @property
    def cuda(self):
        return self.device.type == "cuda"

    def barrier(self):
        if self.distributed:
            dist.barrier(device_ids=[self.local_rank]) if self.cuda else dist.barrier()

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj):
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def all_mean(self, tensor):
        """The mean over ranks of a tensor on this rank's device (in place)."""
        if self.distributed:
            dist.all_reduce(tensor)
            tensor /= self.world_size
        return tensor

    def all_sum(self, tensor):
        if self.distributed:
            dist.all_reduce(tensor)
        return tensor

    def sync(self):
        """Wait for this rank's device (timing points)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def close(self):
        if self.distributed:
            # Free gloo/nccl work objects (and the tensors they hold) while the interpreter is
            # alive: left to interpreter shutdown, gloo's threads can abort the process (SIGABRT).
            gc.collect()
            dist.destroy_process_group()


def init_dist():
    """The torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, ...) as a `Dist`; one process without it."""
    env = {k: int(os.environ.get(k, d)) for k, d in
           (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0), ("GROUP_RANK", 0))}
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"]))
    if torch.cuda.is_available():
        torch.cuda.set_device(env["LOCAL_RANK"])
        device = torch.device("cuda", env["LOCAL_RANK"])
        torch.set_float32_matmul_precision("high")
    else:
        device = torch.device("cpu")
    d = Dist(env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], local_world, env["GROUP_RANK"], device)
    if d.distributed:
        dist.init_process_group(backend="nccl" if d.cuda else "gloo")
    return d


def new_run_id(preset, d):
    """'20261201-101500-record-1a2b3c', the same on every rank."""
    return d.broadcast(f"{datetime.datetime.now():%Y%m%d-%H%M%S}-{preset}-{uuid.uuid4().hex[:6]}")


class Log:
    """Prints (rank 0) to stdout and appends to the run's log file; wandb when enabled."""

    def __init__(self, path, master, wandb_run=None):
        self.path, self.master, self.wandb = path, master, wandb_run
        self.file = open(path, "a", buffering=1) if (master and path) else None

    def __call__(self, msg=""):
        if not self.master:
            return
        print(msg, flush=True)
        if self.file:
            self.file.write(msg + "\n")

    def write_file_only(self, text):
        if self.file:
            self.file.write(text)

    def metrics(self, values, step):
        if self.wandb is not None:
            self.wandb.log(values, step=step)

    def close(self):
        if self.file:
            self.file.close()
            self.file = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def open_log(log_dir, run_id, d, wandb_project=None, config=None):
    """The run's Log: logs/<run_id>.txt on rank 0, starting with `run_header()`; wandb when a
    project is given (offline without WANDB_API_KEY, so no account is needed)."""
    path = None
    if d.master:
        os.makedirs(log_dir, exist_ok=True)
        path = os.path.join(log_dir, f"{run_id}.txt")
    wandb_run = None
    if wandb_project and d.master:
        import wandb
        wandb_run = wandb.init(project=wandb_project, name=run_id, config=config,
                               mode="online" if os.environ.get("WANDB_API_KEY") else "offline")
    log = Log(path, d.master, wandb_run)
    if d.master:
        log.write_file_only(run_header())
    return log


def _repo_sources():
    """(path relative to the repo, text) of the entry script and every module loaded from the repo."""
    files = set()
    main = sys.modules.get("__main__")
    for mod in list(sys.modules.values()) + [main]:
        f = getattr(mod, "__file__", None)
        if f and f.endswith(".py") and (f == getattr(main, "__file__", None) or os.path.isabs(f)):
            f = os.path.abspath(f)
            if f.startswith(REPO_DIR + os.sep) and os.path.isfile(f):
                files.add(f)
    out = []
    for f in sorted(files):
        with open(f, encoding="utf-8", errors="replace") as fh:
            out.append((os.path.relpath(f, REPO_DIR), fh.read()))
    return out


def _git_commit():
    try:
        r = subprocess.run(["git", "-C", REPO_DIR, "describe", "--always", "--dirty", "--abbrev=12"],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip() or "not a git checkout"
    except (OSError, subprocess.SubprocessError):
        return "git not available"


def _hardware():
    lines = [f"{platform.node()} {platform.machine()} {platform.platform()}, "
             f"{len(os.sched_getaffinity(0))} usable CPUs, python {platform.python_version()}"]
    if torch.cuda.is_available():
        try:
            r = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
            lines.append(r.stdout.rstrip())
        except (OSError, subprocess.SubprocessError) as e:
            lines.append(f"nvidia-smi: {e}")
    return "\n".join(lines)


def run_header():
    """The top of a run's log file: code (every repo file the run imported, verbatim), versions, hardware."""
    versions = []
    for name in HEADER_PACKAGES:
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    rule = "=" * 100
    parts = [f"{rule}\nrun started {datetime.datetime.now().isoformat(timespec='seconds')}: {' '.join(sys.argv)}\n"
             f"git: {_git_commit()}\n"]
    for rel, text in _repo_sources():
        parts.append(f"{rule}\n# file: {rel}\n{rule}\n{text}\n")
    parts.append(f"{rule}\n# packages: {', '.join(versions)}\n# hardware: {_hardware()}\n{rule}\n")
    return "".join(parts)


def keep_freed_memory():
    """CPU runs: keep large freed blocks in the heap (see GLIBC_M_MMAP_MAX); glibc only."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(GLIBC_M_MMAP_MAX, 0)
        libc.mallopt(GLIBC_M_TRIM_THRESHOLD, 1 << 40)
        libc.mallopt(GLIBC_M_TOP_PAD, 1 << 30)
