"""Low-level Numba helpers the kernels of every index share: prefetches, non-temporal stores, a
fence, an atomic claim counter, views without a reference count, and the fmix64 mixer.

Intrinsics (`numba.extending.intrinsic`) emit one LLVM instruction each where Numba has no
spelling for it: a prefetch, a 64-byte vector store marked non-temporal, a sequentially
consistent fence, an atomic add. `fmix64` is MurmurHash3's 64-bit finaliser, a bijection on
uint64 that every hash here ends in.
"""
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

U64 = np.uint64

FMIX_C1 = U64(0xFF51AFD7ED558CCD)       # MurmurHash3 fmix64 constants
FMIX_C2 = U64(0xC4CEB9FE1A85EC53)
LINE_WORDS = 8                          # uint64 words per 64-byte cache line (stream_line stores one)


def _prefetch_codegen(context, builder, signature, args):
    aryty = signature.args[0]
    ary = context.make_array(aryty)(context, builder, args[0])
    ptr = cgutils.get_item_pointer(context, builder, aryty, ary, args[1:], wraparound=False)
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
    # read (0), keep in all cache levels (3), data cache (1)
    builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
    return context.get_dummy_value()


@intrinsic
def unmanaged(typingctx, arr):
    """arr without its reference count: the same data, shape and strides, no meminfo.

    Numba counts the references of every view a kernel takes (a row, a slice) with an atomic
    increment and decrement of the array's meminfo. An atomic is a full fence on x86, so the core
    cannot run ahead to the next position's loads past it, and when workers take views of one
    array (the stream, the table) the counter's cache line moves between their cores each time.
    In the record step's lookup these counts were 13% of the samples (perf) and their fences
    held back the prefetches. A kernel calls this on the arrays it takes views of, at entry: its
    caller holds the arrays for the whole call, and no view outlives it."""
    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        src = context.make_array(aryty)(context, builder, args[0])
        out = context.make_array(aryty)(context, builder)
        for name in ("data", "shape", "strides", "itemsize", "nitems"):
            setattr(out, name, getattr(src, name))
        out.meminfo = cgutils.get_null_value(out.meminfo.type)  # NRT_incref/decref skip a null meminfo
        out.parent = cgutils.get_null_value(out.parent.type)
        return out._getvalue()
    return arr(arr), codegen


@intrinsic
def prefetch1(typingctx, arr, i):
    """Hint the CPU to load arr[i]'s cache line (no fault, no wait)."""
    return types.void(arr, i), _prefetch_codegen


@intrinsic
def prefetch2(typingctx, arr, i, j):
    """Hint the CPU to load arr[i, j]'s cache line (no fault, no wait)."""
    return types.void(arr, i, j), _prefetch_codegen


@intrinsic
def prefetch3(typingctx, arr, i, j, k):
    """Hint the CPU to load arr[i, j, k]'s cache line (no fault, no wait)."""
    return types.void(arr, i, j, k), _prefetch_codegen


@intrinsic
def stream_line(typingctx, dst, di, dj, src, si, sj):
    """dst[di, dj:dj+8] = src[si, sj:sj+8] (uint64) as one 64-byte non-temporal store: the line
    goes to memory without being read first or kept in cache. dst[di, dj] must start a cache line."""
    def codegen(context, builder, signature, args):
        dty, sty = signature.args[0], signature.args[3]
        dst_ary = context.make_array(dty)(context, builder, args[0])
        src_ary = context.make_array(sty)(context, builder, args[3])
        dp = cgutils.get_item_pointer(context, builder, dty, dst_ary, [args[1], args[2]], wraparound=False)
        sp = cgutils.get_item_pointer(context, builder, sty, src_ary, [args[4], args[5]], wraparound=False)
        line = ir.VectorType(ir.IntType(64), LINE_WORDS)
        v = builder.load(builder.bitcast(sp, line.as_pointer()), align=8)
        store = builder.store(v, builder.bitcast(dp, line.as_pointer()), align=64)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()
    return types.void(dst, di, dj, src, si, sj), codegen


@intrinsic
def store_fence(typingctx):
    """A full memory fence: non-temporal stores before it are visible to every core after it
    (on x86 an mfence; they are weakly ordered otherwise)."""
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.void(), codegen



@intrinsic
def atomic_add(typingctx, arr, i, v):
    """arr[i] += v atomically; returns the old arr[i] (a claim counter shared by workers)."""
    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        val = context.cast(builder, args[2], signature.args[2], aryty.dtype)
        return builder.atomic_rmw("add", ptr, val, "monotonic")
    return arr.dtype(arr, i, v), codegen



@numba.njit(cache=True, inline="always")
def fmix64(h):
    h ^= h >> U64(33)
    h *= FMIX_C1
    h ^= h >> U64(33)
    h *= FMIX_C2
    h ^= h >> U64(33)
    return h
