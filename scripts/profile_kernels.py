"""Where the hint index's kernels spend their time: a sampling profile down to the instruction.

These VMs expose no hardware counters (`perf stat -e cache-misses` answers "not supported"), but
`perf record -e cpu-clock` samples the instruction pointer. Numba's kernels are JIT code with no
symbols, so a child process runs one figure, in a loop, and before the loop writes out what
`perf` cannot know: each kernel's entry address (its dispatcher's overloads) and the bytes of the
executable anonymous mappings that hold them. The parent samples the child, names each sample
by the kernel whose entry is the nearest below it, and disassembles the dumped bytes with
`objdump`, so the hottest addresses read as instructions. Everything a kernel inlines counts as
that kernel. A sample lands on the instruction after the one that stalled (skid): read the line
above a hot one.

Figures (--figure), on the standard-library corpus (or --tokens):
  build          HintIndex(...).add() of 8M tokens at the corpus's geometry (2^14 buckets a
                 partition: the record's partition shape), a fresh index each time
  build-many     the same at 2^14 partitions (the record's count) of 16 buckets
  record-add     the record step's add of 262,144 tokens into an index sized for 70.8M tokens
                 with 12M in (python -m hints bench --record-step), again and again
  record-lookup  the record step's lookup of 32,768 positions in that index
  sealed         lookups of the prose validation split in the sealed prose index

Usage: python scripts/profile_kernels.py --figure record-add --seconds 10
Needs `perf` (Linux) and `objdump` (binutils).
"""
import argparse
import ast
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIGURES = ("build", "build-many", "record-add", "record-lookup", "sealed")
SAMPLE_HZ = 4000   # cpu-clock samples a second
BUILD_TOKENS = 8_000_000


def attribute(ips, entries, regions):
    """Name each sampled address: (samples per kernel, samples per address inside a kernel, the
    kernel of each such address, samples outside every kernel). entries: (entry address, kernel
    name) pairs; regions: (start, end) of the dumped code mappings. An address counts for the
    kernel with the nearest entry at or below it in the same region."""
    entries = sorted(entries)
    per_kernel, per_ip, owners, outside = collections.Counter(), collections.Counter(), {}, 0
    for ip in ips:
        region = next(((a, b) for a, b in regions if a <= ip < b), None)
        owner = None
        if region is not None:
            for addr, name in entries:
                if region[0] <= addr <= ip:
                    owner = name
                elif addr > ip:
                    break
        if owner is None:
            outside += 1
        else:
            per_kernel[owner] += 1
            per_ip[ip] += 1
            owners[ip] = owner
    return per_kernel, per_ip, owners, outside


def disassemble(path, start):
    """{address: instruction} of raw x86-64 code in `path` that was mapped at `start`."""
    out = subprocess.run(["objdump", "-D", "-b", "binary", "-mi386:x86-64", f"--adjust-vma={start:#x}", str(path)],
                         capture_output=True, text=True, check=True).stdout
    code = {}
    for line in out.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(?:[0-9a-f]{2} )+\s*(\S.*)", line)
        if m:
            code[int(m.group(1), 16)] = m.group(2).strip()
    return code


def figure_work(figure, tokens):
    """A function that runs one round of the figure."""
    from hints.bench import RECORD_ADD, RECORD_INDEX_TOKENS, RECORD_LOOKUP, RECORD_PREFILL
    from hints.index import Geometry, HintIndex
    from hints.tokens import read_all
    if figure == "sealed":
        from data.prose_corpus import build_prose_corpus
        corpus = build_prose_corpus()
        train, query = read_all(corpus["train_pattern"]), read_all(corpus["val_pattern"])
        idx = HintIndex(Geometry.for_tokens(train.size), workers=1).add(train).seal()
        return lambda: idx.lookup(query)
    if tokens:
        train = read_all(tokens)
    else:
        from data.local_corpus import build_local_corpus
        train = read_all(build_local_corpus()["train_pattern"])
    if figure in ("build", "build-many"):
        geom = Geometry.for_tokens(train.size)
        if figure == "build-many":
            geom = Geometry(partition_bits=14, bucket_bits=max(1, geom.partition_bits + geom.bucket_bits - 14),
                            slots=geom.slots, lengths=geom.lengths)
        part = train[:BUILD_TOKENS]
        return lambda: HintIndex(geom, workers=1).add(part)
    if train.size < RECORD_PREFILL + RECORD_ADD:
        raise SystemExit(f"--figure {figure}: needs at least {RECORD_PREFILL + RECORD_ADD:,} tokens, got {train.size:,}")
    idx = HintIndex(Geometry.for_tokens(RECORD_INDEX_TOKENS), workers=1).reserve(RECORD_ADD).add(train[:RECORD_PREFILL])
    at = [RECORD_PREFILL]

    def step():  # the stream's steps over and over (the index keeps growing, as a run's does)
        p = at[0] if at[0] + RECORD_ADD <= train.size else RECORD_PREFILL
        if figure == "record-lookup":
            idx.lookup(train[p:p + RECORD_LOOKUP])
        else:
            idx.add(train[p:p + RECORD_ADD])
        at[0] = p + RECORD_ADD
    return step


def child(args):
    """Warm the figure up, write the kernels' entries and code, say ready, then loop."""
    work = figure_work(args.figure, args.tokens)
    work()
    work()
    entries = []  # every compiled kernel of the hints package: each dispatcher's overloads
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("hints."):
            continue
        for name, obj in list(vars(mod).items()):
            for ov in getattr(obj, "overloads", {}).values() if getattr(obj, "__module__", None) == mod_name else ():
                entries.append((ov.library.get_pointer_to_function(ov.fndesc.llvm_func_name),
                                f"{mod_name.rsplit('.', 1)[-1]}.{name}"))
    regions = []
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb") as mem:
        for line in maps:
            f = line.split()
            if f[1] != "r-xp" or len(f) > 5:  # executable and anonymous: the JIT's code
                continue
            a, b = (int(x, 16) for x in f[0].split("-"))
            if any(a <= e < b for e, _ in entries):
                mem.seek(a)
                (Path(args.child) / f"code_{a:x}.bin").write_bytes(mem.read(b - a))
                regions.append((a, b))
    (Path(args.child) / "kernels.txt").write_text(repr((entries, regions)))
    (Path(args.child) / "ready").write_text("1")
    end = time.time() + args.seconds + 10
    while time.time() < end and not (Path(args.child) / "stop").exists():
        work()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--figure", choices=FIGURES, default="record-add")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long to sample")
    ap.add_argument("--top", type=int, default=25, help="hottest instructions to print")
    ap.add_argument("--tokens", help="training token shards (.bin glob); default: the standard-library corpus")
    ap.add_argument("--listing", help="write every kernel instruction with its samples to this file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    if args.tokens:  # a bad glob or shard ends here, in one line, not in the child's traceback
        from hints.tokens import count_tokens
        try:
            count_tokens(args.tokens)
        except (OSError, ValueError) as e:
            raise SystemExit(f"profile_kernels: argument --tokens: {e}") from None
    for tool in ("perf", "objdump"):
        if shutil.which(tool) is None:
            raise SystemExit(f"profile_kernels: `{tool}` is not installed; it needs perf (Linux) and objdump (binutils)")
    with tempfile.TemporaryDirectory(prefix="profile-kernels-") as tmp:
        cmd = [sys.executable, __file__, "--figure", args.figure, "--seconds", str(args.seconds), "--child", tmp]
        if args.tokens:
            cmd += ["--tokens", args.tokens]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        proc = subprocess.Popen(cmd, env=env)
        while not os.path.exists(os.path.join(tmp, "ready")):
            if proc.poll() is not None:
                raise SystemExit(f"profile_kernels: the figure's process ended (exit {proc.returncode}) before it was ready")
            time.sleep(0.2)
        data = os.path.join(tmp, "perf.data")
        rec = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(SAMPLE_HZ), "-p", str(proc.pid),
                              "-o", data, "--", "sleep", str(args.seconds)], capture_output=True, text=True)
        Path(tmp, "stop").write_text("1")
        proc.wait()
        if rec.returncode:
            raise SystemExit(f"profile_kernels: perf record failed: {rec.stderr.strip()}")
        out = subprocess.run(["perf", "script", "-i", data, "-F", "ip"], capture_output=True, text=True, check=True).stdout
        ips = [int(x, 16) for x in out.split()]
        entries, regions = ast.literal_eval(Path(tmp, "kernels.txt").read_text())
        per_kernel, per_ip, owner, outside = attribute(ips, entries, regions)
        code = {}
        for a, _ in regions:
            code.update(disassemble(Path(tmp, f"code_{a:x}.bin"), a))
    n = max(1, len(ips))
    print(f"{args.figure}: {len(ips):,} samples in {args.seconds:g} s; outside the kernels {outside / n:.1%} "
          f"(Python, the OS: page zeroing, allocation)")
    for name, c in per_kernel.most_common():
        print(f"  {c / n:6.1%}  {name}")
    print("hottest instructions (a sample lands after the one that stalled):")
    for ip, c in per_ip.most_common(args.top):
        print(f"  {c / n:6.2%}  {ip:x}  {owner[ip]:26s} {code.get(ip, '?')}")
    if args.listing:
        with open(args.listing, "w") as f:
            for ip in sorted(code):
                f.write(f"{per_ip.get(ip, 0):7d}  {ip:x}  {code[ip]}\n")
        print(f"listing: {args.listing}")


if __name__ == "__main__":
    main()
