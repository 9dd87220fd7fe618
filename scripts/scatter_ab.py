"""Stage 1's scatter alone, seven ways, on this host: what the append of a slot to its partition's
burst line costs, and what the record's branch-free queue or a prefetch would change.

Stage 1 (hints.index.build.stage1_worker) appends each hashed slot to its partition's burst line
of 8 slots (64 bytes; 2^14 partitions make 1 MiB of lines, L2-resident) and, on the 8th, streams
the line to the partition's staging block with a non-temporal store. Here the same loop runs on
random partitions and slots, outside the index, in these variants:

  branch    the loop as stage 1 has it: store the slot, and on the line's 8th slot (a branch the
            predictor cannot know) stream the line out
  insert    the same, with the slot put in through a 64-byte load of its line, an insert and a
            64-byte store (volatile, so that LLVM keeps the whole-line store): the line is read
            before it is written, as a load, which can overlap others, where a store miss waits
  queue     the record's builder: each slot is inserted so, the whole line is also copied to a
            small queue whose end moves on only when the line is full, and every --chunk slots
            the queued lines are streamed out (no branch on the data per slot)
  prefetch  branch, with the line --ahead slots on prefetched for writing
  plain     branch, with the full line copied out by plain stores (read for ownership first)
  wide      bursts of 32 slots (four lines; 4 MiB at 2^14 partitions), streamed out whole on
            the 32nd: a quarter of the branches, the same non-temporal lines
  floor     the slot stored into its line and the fill moved on, nothing streamed out: the
            random stores into the lines alone, under every variant

Every variant but the floor must leave the same bytes in the staging blocks (asserted). Times
are per slot, medians of --rounds rounds with the variants alternated, and each variant's
ratio to `branch` paired round by round (median [IQR]).

Usage: python scripts/scatter_ab.py [--partitions 16,16384] [--slots 8000000] [--rounds 9]
"""
import argparse
import time

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hints.numba_ops import stream_line
from hints.parallel import line_aligned

U64 = np.uint64
LINE = 8              # slots a burst line: one 64-byte cache line, as stage 1's at 2^14 partitions
BLOCK = 512           # slots a staging block (hints.index.sizing's STAGE_BLOCK)
BLOCKS_A_PARTITION = 4  # blocks each partition cycles through (the staging area of a run, kept small)
WIDE_SLOTS = 32       # slots a burst of the `wide` variant: four lines, as stage 1's bursts with few partitions
VARIANTS = ("branch", "insert", "queue", "prefetch", "plain", "wide", "floor")
BRANCH, INSERT, QUEUE, PREFETCH, PLAIN, WIDE, FLOOR = range(len(VARIANTS))  # scatter()'s variant ids


def _volatile(store):
    """Print an LLVM store as `store volatile`: llvmlite's StoreInstr has no flag for it."""
    class VolatileStore(type(store)):
        def descr(self, buf):
            val, ptr = self.operands
            buf.append(f"store volatile {val.type} {val.get_reference()}, {ptr.type} {ptr.get_reference()}, "
                       f"align 64\n")
    store.__class__ = VolatileStore


def _insert_codegen(with_queue):
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        vec = ir.VectorType(i64, LINE)
        aty = signature.args[0]
        ary = context.make_array(aty)(context, builder, args[0])
        p = cgutils.get_item_pointer(context, builder, aty, ary, [args[1], ir.Constant(i64, 0)], wraparound=False)
        vp = builder.bitcast(p, vec.as_pointer())
        v = builder.insert_element(builder.load(vp, align=64), args[3], args[2])
        _volatile(builder.store(v, vp, align=64))
        if with_queue:
            qty = signature.args[4]
            qary = context.make_array(qty)(context, builder, args[4])
            q = cgutils.get_item_pointer(context, builder, qty, qary, [args[5], ir.Constant(i64, 0)], wraparound=False)
            _volatile(builder.store(v, builder.bitcast(q, vec.as_pointer()), align=64))
        return context.get_dummy_value()
    return codegen


@intrinsic
def insert_slot(typingctx, lines, i, lane, x):
    """lines[i, lane] = x through a 64-byte load of the line, an insert and a 64-byte store."""
    return types.void(lines, i, lane, x), _insert_codegen(False)


@intrinsic
def insert_slot_queued(typingctx, lines, i, lane, x, queue, n):
    """insert_slot, and the whole new line also stored to queue[n]."""
    return types.void(lines, i, lane, x, queue, n), _insert_codegen(True)


@intrinsic
def prefetch_write(typingctx, arr, i):
    """Hint the CPU to take arr[i, 0]'s line for writing (prefetchw)."""
    def codegen(context, builder, signature, args):
        aty = signature.args[0]
        ary = context.make_array(aty)(context, builder, args[0])
        i64, i32 = ir.IntType(64), ir.IntType(32)
        p = cgutils.get_item_pointer(context, builder, aty, ary, [args[1], ir.Constant(i64, 0)], wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(p, i8p), ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.void(arr, i), codegen


# The kernels here compile on each run (~1 s) rather than into Numba's cache: an entry cached while
# the tests load this file as a module of no importable name could not be loaded by the script.
@numba.njit(cache=False, inline="always")
def next_line(tail, part):
    """(block, offset) of partition part's next line of staging (its blocks in turn), taken."""
    o = tail[part]
    tail[part] = o + LINE
    return part * BLOCKS_A_PARTITION + (o // BLOCK) % BLOCKS_A_PARTITION, o % BLOCK


@numba.njit(cache=False, inline="always")
def stream_out(arena, tail, part, src, row, col=0):
    """Stream src[row, col:col+8] to partition part's next line of staging."""
    blk, o = next_line(tail, part)
    stream_line(arena, blk, o, src, row, col)


@numba.njit(cache=False, nogil=True)
def scatter(variant, parts, slots, lines, fill, arena, tail, queue, qpart, chunk, ahead):
    """Append slots[i] to partition parts[i]'s line, the variant's way (VARIANTS, by index)."""
    n_slots = parts.shape[0]
    if variant == WIDE:
        for i in range(n_slots):
            part = parts[i]
            f = np.int64(fill[part])
            lines[part, f] = slots[i]
            if f == WIDE_SLOTS - 1:
                for x in range(0, WIDE_SLOTS, LINE):
                    stream_out(arena, tail, part, lines, part, x)
            fill[part] = (f + 1) % WIDE_SLOTS
        for part in range(fill.shape[0]):  # the whole lines of the last bursts, so the bytes match the others'
            for x in range(0, np.int64(fill[part]) // LINE * LINE, LINE):
                stream_out(arena, tail, part, lines, part, x)
        return
    if variant == QUEUE:
        for c0 in range(0, n_slots, chunk):
            n = 0
            for i in range(c0, min(c0 + chunk, n_slots)):
                part = parts[i]
                f = fill[part]
                insert_slot_queued(lines, part, f, slots[i], queue, n)
                qpart[n] = part
                n += np.int64(f == LINE - 1)
                fill[part] = (f + 1) & (LINE - 1)
            for x in range(n):
                stream_out(arena, tail, qpart[x], queue, x)
        return
    for i in range(n_slots):
        part = parts[i]
        f = fill[part]
        if variant == FLOOR:
            lines[part, f] = slots[i]
            fill[part] = (f + 1) & (LINE - 1)
            continue
        if variant == PREFETCH and i + ahead < n_slots:
            prefetch_write(lines, parts[i + ahead])
        if variant == INSERT:
            insert_slot(lines, part, f, slots[i])
        else:
            lines[part, f] = slots[i]
        if f == LINE - 1 and variant == PLAIN:
            blk, o = next_line(tail, part)
            for x in range(LINE):
                arena[blk, o + x] = lines[part, x]
        elif f == LINE - 1:
            stream_out(arena, tail, part, lines, part)
        fill[part] = (f + 1) & (LINE - 1)


def run(variant, parts, slots, n_partitions, chunk, ahead):
    """(seconds, staging blocks) of one scatter of every slot, from empty lines."""
    lines = line_aligned((n_partitions, WIDE_SLOTS if variant == "wide" else LINE), np.uint64)
    lines[:] = 0
    arena = line_aligned((n_partitions * BLOCKS_A_PARTITION, BLOCK), np.uint64)
    arena[:] = 0
    fill = np.zeros(n_partitions, np.uint8)  # as stage 1's burst_fill: 16 KiB at 2^14 partitions
    tail = np.zeros(n_partitions, np.int64)
    queue = line_aligned((chunk, LINE), np.uint64)
    qpart = np.zeros(chunk, np.int64)
    t0 = time.perf_counter()
    scatter(VARIANTS.index(variant), parts, slots, lines, fill, arena, tail, queue, qpart, chunk, ahead)
    return time.perf_counter() - t0, arena


def compare(n_partitions, n_slots, rounds, chunk, ahead, log, seed=0):
    """Per-slot seconds of every variant, alternated over `rounds`: {variant: [seconds a slot]}."""
    rng = np.random.default_rng(seed)
    parts = rng.integers(0, n_partitions, n_slots).astype(np.int64)
    slots = rng.integers(0, 1 << 62, n_slots).astype(np.uint64)
    first = {v: run(v, parts, slots, n_partitions, chunk, ahead)[1] for v in VARIANTS}  # compiled, and the bytes
    for v in VARIANTS[1:-1]:
        assert np.array_equal(first[v], first["branch"]), f"{v} staged other bytes than branch"
    times = {v: [] for v in VARIANTS}
    for r in range(rounds):
        for v in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
            times[v].append(run(v, parts, slots, n_partitions, chunk, ahead)[0] / n_slots)
    base = np.array(times["branch"])
    log(f"{n_partitions:,} partitions ({n_partitions * LINE * 8 / 1024:,.0f} KiB of lines), {n_slots:,} slots, "
        f"{rounds} rounds: ns a slot, median [min-max]; ratio to branch, paired, median [IQR]")
    for v in VARIANTS:
        t = np.array(times[v]) * 1e9
        r = np.array(times[v]) / base
        log(f"  {v:9s} {np.median(t):6.2f} [{t.min():.2f}-{t.max():.2f}]   "
            f"{np.median(r):.3f} [{np.percentile(r, 25):.3f}-{np.percentile(r, 75):.3f}]")
    return times


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--partitions", default="16,16384", help="comma-separated partition counts")
    p.add_argument("--slots", type=int, default=8_000_000, help="slots scattered a round")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--chunk", type=int, default=64,
                   help="queue: slots between the streams of the queued lines (64: the record's builder, "
                        "CHUNK in exact_match/src/slot.rs)")
    p.add_argument("--ahead", type=int, default=16, help="prefetch: slots ahead")
    args = p.parse_args(argv)
    try:
        counts = [int(x) for x in args.partitions.split(",")]
    except ValueError:
        p.error(f"--partitions {args.partitions}: expected comma-separated integers")
    for name, v in (("partitions", min(counts)), ("slots", args.slots), ("rounds", args.rounds),
                    ("chunk", args.chunk), ("ahead", args.ahead)):
        if v < 1:
            p.error(f"--{name} {getattr(args, name)}: expected at least 1")
    for n in counts:
        compare(n, args.slots, args.rounds, args.chunk, args.ahead, print)


if __name__ == "__main__":
    main()
