"""Memory for the hashed index's tables: asked for huge pages and pre-faulted on many threads.

Every large array of an index (its table and bucket fills in private memory, the background
builder's memfd table in hints/index/background.py, the staging arena) is faulted in before
the build writes it, by the index's own workers at once, instead of one page fault at a time
inside the first add(). The mapping is asked for transparent huge pages (madvise
MADV_HUGEPAGE: the kernel honours it for private memory when
/sys/kernel/mm/transparent_hugepage/enabled is always or madvise, for shared memory when
.../shmem_enabled is advise, always, within_size or force) and then populated for writing
(MADV_POPULATE_WRITE, Linux >= 5.14) by `workers` threads over contiguous, huge-page-aligned
ranges. Populating allocates every page, zeroed by the kernel once (a zero-fill from user
space writes it a second time), with its page-table entry, in the mapping the build then
writes through: no fault on the clock. For a memfd, like posix_fallocate, no SIGBUS later
(a shortage is an error now). Kernels without POPULATE_WRITE get a parallel touch of one
byte a page instead (after posix_fallocate for a memfd).

Reserving the background builder's memfd with posix_fallocate alone would be one thread
allocating and zeroing every page (minutes for the record's 352 GiB), with 4 KiB pages.
`hugetlb_memfd` is the other route (MFD_HUGETLB: 2 MiB pages reserved by the administrator,
vm.nr_hugepages); `python -m hints.index.memory` measures each way at a given size (docs/record.md).
"""
import argparse
import ctypes
import errno
import mmap
import os
import threading
import time

import numpy as np

MADV_HUGEPAGE = 14          # linux/mman.h (asm-generic)
MADV_POPULATE_WRITE = 23    # linux/mman.h, Linux 5.14
MFD_HUGETLB = 0x0004        # linux/memfd.h
HUGE_PAGE_BYTES = 2 << 20   # x86-64 PMD page: the unit THP and the default hugetlb pool use
THP_SHMEM = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"  # the kernel's THP mode for shared memory
THP_ANON = "/sys/kernel/mm/transparent_hugepage/enabled"          # and for private (anonymous) memory
THP_SHMEM_ON = ("advise", "always", "within_size", "force")  # modes in which madvise gets shmem huge pages

_libc = ctypes.CDLL(None, use_errno=True)  # CDLL calls release the GIL: threads populate in parallel
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def thp_mode(path=THP_SHMEM):
    """The kernel's THP mode for shared memory (THP_SHMEM) or private memory (THP_ANON):
    'never', 'madvise', 'advise', ..., or 'unknown'."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return "unknown"
    return next((w[1:-1] for w in text.split() if w.startswith("[")), text.strip() or "unknown")


def hugetlb_free_bytes():
    """Bytes of free pages in the default hugetlb pool (HugePages_Free x Hugepagesize)."""
    facts = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                facts[key] = int(value.split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    return facts.get("HugePages_Free", 0) * facts.get("Hugepagesize", 0) * 1024


def _madvise(addr, nbytes, advice):
    if _libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(nbytes), advice) != 0:
        return ctypes.get_errno()
    return 0


def _span(a):
    """The page-aligned address range [lo, hi) of array `a`'s memory."""
    lo = a.ctypes.data
    return lo - lo % mmap.PAGESIZE, lo + a.nbytes


def _run(fn, bounds):
    """fn(a, b) for every range, each on a thread of its own (the calling thread takes the first)."""
    results = [None] * len(bounds)

    def one(w):
        results[w] = fn(*bounds[w])

    threads = [threading.Thread(target=one, args=(w,)) for w in range(1, len(bounds))]
    for t in threads:
        t.start()
    try:
        one(0)
    finally:
        for t in threads:
            t.join()
    return results


def prefault(arrays, workers, fd=None, huge=True, how="populate"):
    """Ask for huge pages on each of `arrays` (views of private anonymous memory, of a file, or
    of memfd `fd` mapped shared), then allocate and map every page of them from `workers`
    threads, each on a contiguous run of 2 MiB units. how='touch' writes a byte a page instead
    of populating (what kernels before 5.14 get; `python -m hints.index.memory` compares them).
    Returns a dict: seconds, how ('populate', 'touch' or 'fallocate+touch'), workers, bytes, the
    kernel's THP mode for this memory and whether madvise was accepted. A shortage of memory is
    a MemoryError naming the bytes."""
    t0 = time.perf_counter()
    advised, total = bool(arrays), 0
    for a in arrays:
        lo, hi = _span(a)
        total += hi - lo
        advised &= huge and _madvise(lo, hi - lo, MADV_HUGEPAGE) == 0
        n_units = -(-(hi - lo) // HUGE_PAGE_BYTES)
        w = max(1, min(int(workers), n_units))
        bounds = [(lo + n_units * i // w * HUGE_PAGE_BYTES, min(hi, lo + n_units * (i + 1) // w * HUGE_PAGE_BYTES))
                  for i in range(w)]
        errors = []
        if how == "populate":
            errors = [e for e in _run(lambda x, y: _madvise(x, y - x, MADV_POPULATE_WRITE) if y > x else 0, bounds) if e]
        if how != "populate" or (errors and all(e == errno.EINVAL for e in errors)):  # a kernel before 5.14
            if fd is not None:  # reserve the memfd's pages first: a shortage is an error now, not a SIGBUS later
                os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
            _run(_touch, bounds)
            how = "fallocate+touch" if fd is not None else "touch"
        elif errors:
            raise MemoryError(f"hint index: cannot fault in {hi - lo:,} bytes of memory ({os.strerror(errors[0])})")
    return dict(seconds=time.perf_counter() - t0, how=how, workers=int(workers), bytes=total,
                thp_mode=thp_mode(THP_SHMEM if fd is not None else THP_ANON), madvise_hugepage=advised)


def _touch(a, b):
    """Write one zero byte per page of [a, b) (pages of a fresh memfd read as zero already)."""
    if b > a:
        view = np.frombuffer((ctypes.c_char * (b - a)).from_address(a), dtype=np.uint8)
        view[::mmap.PAGESIZE] = 0


def huge_bytes_mapped(addr):
    """Bytes of the mapping containing `addr` that this process maps with huge pages
    (/proc/self/smaps: transparent huge pages and hugetlb pages), or None where unknown."""
    try:
        with open("/proc/self/smaps") as f:
            inside, total = False, 0
            for line in f:
                head = line.split()[0] if line.strip() else ""
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    if inside:
                        return total
                    inside = lo <= addr < hi
                elif inside and head in ("ShmemPmdMapped:", "FilePmdMapped:", "AnonHugePages:", "Shared_Hugetlb:",
                                         "Private_Hugetlb:"):
                    total += int(line.split()[1]) * 1024
            return total if inside else None
    except (OSError, ValueError):
        return None


def hugetlb_memfd(name, nbytes):
    """A memfd on the default hugetlb pool (MFD_HUGETLB), sized up to whole huge pages. Raises
    OSError when the pool cannot hold it (vm.nr_hugepages too small)."""
    if hugetlb_free_bytes() < nbytes:
        raise OSError(errno.ENOMEM, f"hugetlb pool has {hugetlb_free_bytes():,} free bytes, {nbytes:,} needed "
                                    f"(vm.nr_hugepages)")
    fd = os.memfd_create(name, os.MFD_CLOEXEC | MFD_HUGETLB)
    os.ftruncate(fd, -(-nbytes // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES)
    return fd


def measure(nbytes, workers, mode):
    """Reserve and pre-fault `nbytes` of memfd one way; (seconds, huge bytes mapped, facts).
    mode: 'fallocate' (one thread, the old way), 'populate' (workers threads, no madvise),
    'populate+thp' (madvise MADV_HUGEPAGE first), 'hugetlb' (MFD_HUGETLB, workers threads)."""
    if mode == "hugetlb":
        fd = hugetlb_memfd("hints-measure", nbytes)
        nbytes = os.fstat(fd).st_size
    else:
        fd = os.memfd_create("hints-measure", os.MFD_CLOEXEC)
        os.ftruncate(fd, nbytes)
    try:
        buf = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        arr = np.frombuffer(buf, dtype=np.uint64)
        if mode == "fallocate":
            t0 = time.perf_counter()
            os.posix_fallocate(fd, 0, nbytes)
            _touch(arr.ctypes.data, arr.ctypes.data + nbytes)  # and map it, as the build's first writes would
            facts = dict(seconds=time.perf_counter() - t0, how="fallocate", workers=1)
        else:
            facts = prefault([arr], workers, fd=fd, huge=mode == "populate+thp")
        huge = huge_bytes_mapped(arr.ctypes.data)
        del arr
        buf.close()
        return facts["seconds"], huge, facts
    finally:
        os.close(fd)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m hints.index.memory", description="Measure reserving and pre-faulting "
                                "shared memory for the background index, each way (docs/record.md).")
    p.add_argument("--gib", type=float, default=2.0, help="size to reserve, GiB")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="threads that pre-fault")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", default="fallocate,populate,populate+thp,hugetlb")
    args = p.parse_args(argv)
    nbytes = int(args.gib * (1 << 30)) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    if nbytes < HUGE_PAGE_BYTES or args.workers < 1 or args.repeats < 1:
        p.error(f"--gib {args.gib} / --workers {args.workers} / --repeats {args.repeats}: expected at least 2 MiB, "
                f"1 worker and 1 repeat")
    print(f"shmem THP mode: {thp_mode(THP_SHMEM)}; hugetlb pool free: {hugetlb_free_bytes() / 2**30:.2f} GiB; "
          f"{nbytes / 2**30:.2f} GiB, {args.workers} worker(s), {args.repeats} repeat(s), interleaved")
    modes = args.modes.split(",")
    times = {m: [] for m in modes}
    last = {}
    for _ in range(args.repeats):
        for m in modes:
            try:
                s, huge, facts = measure(nbytes, args.workers, m)
            except OSError as e:
                last[m] = f"unavailable: {e.strerror or e}"
                continue
            times[m].append(s)
            last[m] = f"huge pages mapped {(huge or 0) / 2**30:.2f} GiB ({facts['how']})"
    for m in modes:
        t = sorted(times[m])
        if t:
            print(f"{m:>14}: median {t[len(t) // 2]:.3f} s ({nbytes / 2**30 / t[len(t) // 2]:.2f} GiB/s), "
                  f"range {t[0]:.3f}-{t[-1]:.3f} s; {last[m]}")
        else:
            print(f"{m:>14}: {last[m]}")


if __name__ == "__main__":
    main()
