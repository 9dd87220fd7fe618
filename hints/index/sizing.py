"""Sizes of the hashed index's build: staging blocks, burst lines, the chunks stage-1 workers claim,
add()'s sub-chunks, and the staging bytes they take (train/plan.py sizes the record's run with them).
"""
from .build import BURST
from .geometry import SLOTS_PER_LINE
from .hashing import HASH_BLOCK, HASH_SCRATCH

STAGE_BLOCK = 512          # slots per staging block (4 KiB, one page): a chain link
# Positions a stage-1 worker claims at a time: "chunks of 64k tokens", or more with many partitions,
# so that a chunk brings each partition CHUNK_SLOTS_PER_PARTITION slots on average and stage 2's
# step per (chunk, partition) is spread over them (at 2^14 partitions a 64k chunk brought 4, and
# stage 2 with 2 workers ran slower than with 1).
STAGE1_MIN_CHUNK = 1 << 16
CHUNK_SLOTS_PER_PARTITION = 64
# Stage 1's burst line per partition: 8 slots (one cache line) at the record's 2^14 partitions (1 MiB,
# L2-resident), 16 at 128 partitions, 32 at 64 or fewer, so that a partition's slots leave in fewer,
# larger flushes (each flush is a branch that mispredicts), within BURST_BYTES. 32 slots: stage 1
# of the stdlib build at 16 partitions took 0.90x the time of 8 (A/A 1.00x), a record-step add 0.92x.
MAX_BURST_SLOTS = 32
BURST_BYTES = 1 << 14   # all partitions' burst lines: half of this machine's 32 KiB L1D, beside the hash buffers
STAGE_OVERHEAD = 0.1       # target: partial blocks add <= 10% to staging (DESIGN: staging <= 1.1 x 8 B/token)
MIN_CHUNK_TOKENS = 1 << 22  # smallest sub-chunk of an add() (4M tokens, 32 MiB of staging)


def burst_slots(geom):
    """Slots of a stage-1 burst line per partition: whole cache lines (BURST slots each),
    as many as keep all partitions' lines within BURST_BYTES, up to MAX_BURST_SLOTS."""
    s = BURST
    while 2 * s <= MAX_BURST_SLOTS and geom.n_partitions * 2 * s * 8 <= BURST_BYTES:
        s *= 2
    return s


def stage1_chunk(geom):
    """Positions a stage-1 worker claims at a time, for this geometry."""
    return max(STAGE1_MIN_CHUNK, geom.n_partitions * CHUNK_SLOTS_PER_PARTITION)


def default_chunk_tokens(geom, workers):
    """Sub-chunk of add(): large enough that each range's partial last block per partition
    adds at most STAGE_OVERHEAD to staging."""
    return max(MIN_CHUNK_TOKENS, int(workers * geom.n_partitions * STAGE_BLOCK / STAGE_OVERHEAD))


def staging_nbytes(geom, workers, n, stage1_chunk):
    """Bytes of the staging area HintIndex._staging allocates for sub-chunks of up to n tokens
    (what staging_bytes() then reports; a test checks they agree): the arena of blocks with
    their lengths and links, the chunk claims, and every worker's chain ends, burst lines and
    stage-2 bucket lines."""
    P, w = geom.n_partitions, workers
    n_blocks = -(-n // STAGE_BLOCK) + w * P + 1
    n_chunks = -(-n // stage1_chunk) if w > 1 else 0
    shared = n_blocks * (STAGE_BLOCK * 8 + 2 * 8) + 2 * 8 + n_chunks * (4 + 4 * P)
    per_worker = P * (5 * 8 + burst_slots(geom) * 8 + 1) + 8  # head, tail, tail_len, full_blocks, staged; bursts; fills; skipped
    per_worker += (max(geom.lengths) + HASH_SCRATCH + 2 * HASH_BLOCK) * 8 + 2 * w * 8  # hash buffers; stage-2 cursor
    per_worker += geom.n_buckets * (SLOTS_PER_LINE * 8 + 2)  # stage 2's bucket lines and base
    return shared + w * per_worker
