"""Triton kernels of the exact count (hints.exact.triton_count drives them; hints.exact.count defines the result).

Three tables live on the GPU, all open addressing with linear probing and 0 as "empty":
  * query table, per length k: keys[k * C + slot] = the fingerprint of a distinct query
    n-gram (C = 2^CAP_BITS slots per length, load <= 1/2);
  * pair table: pairs[2 p] = (k * C + slot) << 16 | follower, plus 1 (so never 0), and
    pairs[2 p + 1] its count: key and count share a 16-byte line;
  * per query slot: total (n-gram count) and best = count << 16 | (65535 - token), whose
    maximum is the most frequent follower with ties to the smallest id.

Kernels, in the order they run: `insert_queries` (fingerprint the query, claim a slot per
distinct n-gram with compare-and-swap), `count_stream` once per training chunk (fingerprint
each position, probe the query table, count the follower in the pair table), `grow_pairs`
when the pair table must double, `reduce_pairs` (fold the pair table into total/best with
atomics) and `gather_hints` (per query position: token, count, top count).

Hopper habits: positions are contiguous across the lanes of a program, so every token load is
coalesced (the window's earlier tokens are the same lines, from L1); the stream kernel runs a
persistent grid (a few programs per multiprocessor, each looping over tiles); a longer length
is probed only where the shorter one was found (a query n-gram ends in a shorter query
n-gram), so most positions cost one probe; nothing waits on the host. Lanes that have no
compare-and-swap to do point theirs at a per-program scratch cell (atomic_cas takes no mask).
A lane leaves a probe loop when it finds its key or an empty slot: tables never fill (the
host keeps the pair table's load <= 3/4), so every loop ends.
"""
import os

import triton
import triton.language as tl

# Both ways in one process. The kernels are compiled for the GPU, and a second copy of this module
# is loaded for Triton's interpreter (hints.exact.triton_count.load_kernels, under TRITON_INTERPRET=1).
# triton.language's own @triton.jit helpers (tl.sum, tl.max, tl.cdiv, tl.zeros) are either compiled
# or interpreted in one process: the kernels call none of them directly (tl.full is a builtin), only
# _total(x), the sum of x over its lanes, defined per copy:
#   compiled:    tl.sum, the public reduction;
#   interpreted: tl.reduce with the combine function the interpreter sums natively with NumPy (it
#                recognises triton.language's own; any other runs lane by lane in Python, ~10x
#                slower end to end), or, should a Triton lack it, a combine function of our own.
# what triton.jit decides at decoration time (its knob reads TRITON_INTERPRET; older Tritons: the variable)
_knobs = getattr(triton, "knobs", None)
INTERPRETED = bool(_knobs.runtime.interpret) if _knobs is not None else \
    os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@triton.jit
def _add(a, b):
    return a + b


if INTERPRETED:
    _NATIVE_SUM = getattr(getattr(tl, "standard", None), "_sum_combine", None) or _add

    @triton.jit
    def _total(x):
        return tl.reduce(x, 0, _NATIVE_SUM)
else:
    @triton.jit
    def _total(x):
        return tl.sum(x, 0)


@triton.jit
def _fmix64(h):
    """MurmurHash3's 64-bit finalizer (uint64 in, uint64 out): spreads a fingerprint's bits
    over the top bits that pick a slot."""
    h ^= h >> 33
    h *= 0xFF51AFD7ED558CCD
    h ^= h >> 33
    h *= 0xC4CEB9FE1A85EC53
    h ^= h >> 33
    return h


@triton.jit
def _add_terms(s, last_ptr, lo: tl.constexpr, hi: tl.constexpr, mask, a_ptr):
    """s + sum_{i=lo..hi-1} (last_ptr[-i] + 1) * A[i]: the fingerprint terms of distances lo..hi-1
    from each window's last token. Buffers have LMAX zeros (or history) in front: no bounds check."""
    for i in tl.static_range(lo, hi):
        x = tl.load(last_ptr - i, mask=mask, other=0).to(tl.uint64)
        s += (x + 1) * tl.load(a_ptr + i).to(tl.uint64, bitcast=True)
    return s


@triton.jit(do_not_specialize=["n"])
def insert_queries(q_ptr, n, a_ptr, keys_ptr, slot_ptr, scratch_ptr,
                   BOUNDS: tl.constexpr, CAP_BITS: tl.constexpr, BLOCK: tl.constexpr):
    """For each query position t and length index k: claim (or find) the slot of the n-gram
    q[t-L+1..t] in keys[k] (BOUNDS = (0,) + lengths); slot_ptr[k * n + t] = slot, or -1 when
    t < L - 1. q_ptr: the query behind LMAX = BOUNDS[-1] zeros."""
    pid = tl.program_id(0)
    lane = tl.arange(0, BLOCK)
    cap = 1 << CAP_BITS
    scratch = scratch_ptr + pid * BLOCK + lane  # this program's own cells (hold 0; CAS 0 -> 0)
    zero = tl.full([BLOCK], 0, tl.int64)
    for tile in range(pid, (n + BLOCK - 1) // BLOCK, tl.num_programs(0)):
        t = (tl.full([BLOCK], 0, tl.int64) + tile) * BLOCK + lane
        inb = t < n
        s = tl.full([BLOCK], 0, tl.uint64)
        for k in tl.static_range(len(BOUNDS) - 1):
            s = _add_terms(s, q_ptr + BOUNDS[len(BOUNDS) - 1] + t, BOUNDS[k], BOUNDS[k + 1], inb, a_ptr)
            key = tl.where(s == 0, 1, s).to(tl.int64, bitcast=True)
            p = (_fmix64(s) >> (64 - CAP_BITS)).to(tl.int64)
            slot = tl.full([BLOCK], -1, tl.int64)
            searching = inb & (t >= BOUNDS[k + 1] - 1)
            while _total(searching.to(tl.int32)) > 0:
                cur = tl.load(keys_ptr + k * cap + p, mask=searching, other=0)
                found = searching & (cur == key)
                empty = searching & (cur == 0)
                if _total(empty.to(tl.int32)) > 0:
                    ptr = tl.where(empty, keys_ptr + k * cap + p, scratch)
                    old = tl.atomic_cas(ptr, zero, tl.where(empty, key, zero), sem="relaxed")
                    found = found | (empty & ((old == 0) | (old == key)))
                slot = tl.where(found, p, slot)
                searching = searching & ~found
                p = tl.where(searching, (p + 1) & (cap - 1), p)
            tl.store(slot_ptr + k * n + t, slot.to(tl.int32), mask=inb)


@triton.jit(do_not_specialize=["end", "first"])
def count_stream(tok_ptr, end, first, a_ptr, keys_ptr, pairs_ptr, fill_ptr, scratch_ptr,
                 BOUNDS: tl.constexpr, CAP_BITS: tl.constexpr, PAIR_BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Count the followers tok[j] (LMAX <= j < end) of the windows tok[j-L..j-1] that are query
    n-grams. tok[0..LMAX-1] is the end of the stream so far (zeros before its start); `first` is
    the stream index of tok[0] (negative early on; capped at 0 by the host): a window exists
    when first + j >= L. New pair keys add to fill_ptr[0]."""
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    lane = tl.arange(0, BLOCK)
    cap = 1 << CAP_BITS
    pcap = 1 << PAIR_BITS
    scratch = scratch_ptr + pid * BLOCK + lane
    zero = tl.full([BLOCK], 0, tl.int64)
    start: tl.constexpr = BOUNDS[len(BOUNDS) - 1]
    n_tiles = (end - start + BLOCK - 1) // BLOCK
    for tile in range(pid, n_tiles, n_prog):
        j = (tl.full([BLOCK], 0, tl.int64) + tile) * BLOCK + lane + start
        alive = j < end
        follower = tl.load(tok_ptr + j, mask=alive, other=0).to(tl.int64)
        s = tl.full([BLOCK], 0, tl.uint64)
        for k in tl.static_range(len(BOUNDS) - 1):
            s = _add_terms(s, tok_ptr + j - 1, BOUNDS[k], BOUNDS[k + 1], alive, a_ptr)
            alive = alive & (first + j >= BOUNDS[k + 1])
            # probe the query table (read-only here)
            key = tl.where(s == 0, 1, s).to(tl.int64, bitcast=True)
            p = (_fmix64(s) >> (64 - CAP_BITS)).to(tl.int64)
            slot = tl.full([BLOCK], -1, tl.int64)
            searching = alive
            while _total(searching.to(tl.int32)) > 0:
                cur = tl.load(keys_ptr + k * cap + p, mask=searching, other=0)
                slot = tl.where(searching & (cur == key), p, slot)
                searching = searching & (cur != key) & (cur != 0)
                p = (p + 1) & (cap - 1)
            alive = slot >= 0  # longer lengths only where this one was found
            # count (query slot, follower) in the pair table
            pkey = ((k * cap + slot) << 16 | follower) + 1
            pp = (_fmix64(pkey.to(tl.uint64, bitcast=True)) >> (64 - PAIR_BITS)).to(tl.int64)
            searching = alive
            while _total(searching.to(tl.int32)) > 0:
                cur = tl.load(pairs_ptr + 2 * pp, mask=searching, other=0)
                found = searching & (cur == pkey)
                empty = searching & (cur == 0)
                if _total(empty.to(tl.int32)) > 0:
                    ptr = tl.where(empty, pairs_ptr + 2 * pp, scratch)
                    old = tl.atomic_cas(ptr, zero, tl.where(empty, pkey, zero), sem="relaxed")
                    claimed = empty & (old == 0)
                    found = found | claimed | (empty & (old == pkey))
                    tl.atomic_add(fill_ptr, _total(claimed.to(tl.int64)), sem="relaxed")
                tl.atomic_add(pairs_ptr + 2 * pp + 1, tl.full([BLOCK], 1, tl.int64), mask=found, sem="relaxed")
                searching = searching & ~found
                pp = tl.where(searching, (pp + 1) & (pcap - 1), pp)


@triton.jit(do_not_specialize=["n_old"])
def grow_pairs(old_ptr, n_old, new_ptr, scratch_ptr, PAIR_BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Re-insert every (key, count) of the old pair table (n_old slots) into the new, empty one."""
    pid = tl.program_id(0)
    lane = tl.arange(0, BLOCK)
    scratch = scratch_ptr + pid * BLOCK + lane
    zero = tl.full([BLOCK], 0, tl.int64)
    pcap = 1 << PAIR_BITS
    for tile in range(pid, (n_old + BLOCK - 1) // BLOCK, tl.num_programs(0)):
        i = (tl.full([BLOCK], 0, tl.int64) + tile) * BLOCK + lane  # int64: tables may pass 2^31 slots
        key = tl.load(old_ptr + 2 * i, mask=i < n_old, other=0)
        count = tl.load(old_ptr + 2 * i + 1, mask=i < n_old, other=0)
        pp = (_fmix64(key.to(tl.uint64, bitcast=True)) >> (64 - PAIR_BITS)).to(tl.int64)
        searching = key != 0
        while _total(searching.to(tl.int32)) > 0:
            ptr = tl.where(searching, new_ptr + 2 * pp, scratch)
            old = tl.atomic_cas(ptr, zero, tl.where(searching, key, zero), sem="relaxed")
            claimed = searching & (old == 0)  # keys are distinct: a taken slot is another key's
            tl.store(new_ptr + 2 * pp + 1, count, mask=claimed)
            searching = searching & ~claimed
            pp = tl.where(searching, (pp + 1) & (pcap - 1), pp)


@triton.jit(do_not_specialize=["n_pairs"])
def reduce_pairs(pairs_ptr, n_pairs, total_ptr, best_ptr, BLOCK: tl.constexpr):
    """Fold each counted (query slot, follower) into the slot's total and best."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    key = tl.load(pairs_ptr + 2 * i, mask=i < n_pairs, other=0)
    count = tl.load(pairs_ptr + 2 * i + 1, mask=i < n_pairs, other=0)
    used = key != 0
    v = key - 1
    slot = v >> 16
    token = v & 0xFFFF
    tl.atomic_add(total_ptr + slot, count, mask=used, sem="relaxed")
    tl.atomic_max(best_ptr + slot, (count << 16) | (0xFFFF - token), mask=used, sem="relaxed")


@triton.jit(do_not_specialize=["n", "n_all"])
def gather_hints(slot_ptr, n, n_all, total_ptr, best_ptr, tok_ptr, cnt_ptr, top_ptr,
                 CAP_BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Per (length index k, query position t), flattened as k * n + t: hinted token (-1 none),
    n-gram count and the top follower's count (int32)."""
    r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    k = r // n
    inb = r < n_all
    slot = tl.load(slot_ptr + r, mask=inb, other=-1).to(tl.int64)
    has = inb & (slot >= 0)
    idx = k * (1 << CAP_BITS) + slot
    total = tl.load(total_ptr + idx, mask=has, other=0)
    best = tl.load(best_ptr + idx, mask=has, other=0)
    tl.store(tok_ptr + r, tl.where(total > 0, 0xFFFF - (best & 0xFFFF), -1).to(tl.int32), mask=inb)
    tl.store(cnt_ptr + r, total.to(tl.int32), mask=inb)
    tl.store(top_ptr + r, (best >> 16).to(tl.int32), mask=inb)
