"""Shape of the hint index: partitions x buckets x slots, the n-gram lengths, and the slot bit layout.

A slot is one uint64 that stands for one stream position i and all n-gram lengths at once:

    bit 63 ............................................. 16 15 ........ 0
        [ checksum(L0) | checksum(L1) | ... | checksum(Lk-1) ] [ next token ]

The next token s[i] sits in the low 16 bits (GPT-2's 50,257 ids fit). Above it come 48
checksum bits, the shortest length (which picks the partition and the buckets) in the top
field with the most bits, each longer length in a narrower field below it (CHECKSUM_BITS).
Because the fields are nested, ``slot >> shift[k]`` is the key of length k: the
checksums of all lengths up to k, so a longer n-gram matches only if every shorter one did.
A checksum field of 0 means "this position is too early for that length"; real checksums
are never 0, so an early position never matches that length.

The shortest length's 64-bit hash h gives the partition (its top P bits) and its checksum
(the next CHECKSUM_BITS[0] bits). Both buckets are a function of that checksum alone
(``bucket_pair``), so stage 2 of the build finds them from the 8-byte slot and the staging
area needs no more than 8 bytes per hint.
"""
import dataclasses
import os

from ..tokens import TOKEN_BITS

SLOT_BYTES = 8
CHECKSUM_TOTAL_BITS = 48  # 64-bit slot minus the token
SLOTS_PER_LINE = 8        # 8 slots x 8 bytes = one 64-byte cache line; S must be a multiple
# At most 4 n-gram lengths share a slot: 48 checksum bits leave the longest of 4 lengths a
# 6-bit field, and the lookup kernels keep one query key per length in MAX_LENGTHS lanes.
MAX_LENGTHS = 4
MAX_PARTITION_BITS = 20   # 2^20 partitions: with 2^24 buckets, 44 bits of a lookup's 49-bit sort key
FILL_BITS = 16            # a bucket's fill is a uint16 ...
MAX_SLOTS = (1 << FILL_BITS) - SLOTS_PER_LINE  # ... so at most 65528 slots (a multiple of 8)

# Checksum bits per length, shortest first, for each count of lengths 1..MAX_LENGTHS. The
# shortest gets the most: a collision there gives a wrong hint, a collision of a longer
# length only changes how much it is trusted (the article's "shared slot for all hint
# lengths"). Each tuple sums to CHECKSUM_TOTAL_BITS.
CHECKSUM_BITS = {
    1: (48,),
    2: (30, 18),
    3: (26, 12, 10),
    4: (24, 10, 8, 6),
}

# Longest n-gram length: a saved index keeps the last MAX_LENGTH tokens of its stream so that a
# loaded index can go on adding (hints/index/store.py reserves that many history tokens in its header).
MAX_LENGTH = 64

# Fraction of a machine's available memory a table may take before we refuse to allocate it:
# the rest is left for staging, the OS and the training processes.
MAX_MEMORY_FRACTION = 0.9

# Geometry.for_tokens aims for this many tokens per slot (load factor). At 0.5 the fill of a
# bucket is Poisson-like with mean S/2, so almost no hint of a rare n-gram is dropped, while
# frequent n-grams (which fill their two buckets) are dropped as the record drops them.
TARGET_LOAD = 0.5


# The article's n-gram lengths: every CLI, the trainer, scaling and ablation default to them.
DEFAULT_LENGTHS = (6, 10, 20)


def parse_lengths(spec):
    """'6,10,20' (or a sequence of ints) -> (6, 10, 20)."""
    try:
        lengths = tuple(int(x) for x in (spec.split(",") if isinstance(spec, str) else spec))
    except ValueError:
        raise ValueError(f"n-gram lengths {spec!r}: expected comma-separated integers like 6,10,20") from None
    if not lengths:
        raise ValueError(f"n-gram lengths {spec!r}: expected at least one length")
    return lengths


def available_memory_bytes():
    """Memory the OS says is available now (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def human_bytes(n):
    """n bytes as text: '512 B', '1.5 GiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


@dataclasses.dataclass(frozen=True)
class Geometry:
    """2^partition_bits partitions x 2^bucket_bits buckets x slots uint64 slots."""

    partition_bits: int = 14
    bucket_bits: int = 14
    slots: int = 176
    lengths: tuple = DEFAULT_LENGTHS

    def __post_init__(self):
        try:
            lengths = tuple(self.lengths)
            if any(int(x) != x for x in lengths):
                raise ValueError
        except (TypeError, ValueError):
            raise ValueError(f"lengths={self.lengths!r}: expected a sequence of integer n-gram lengths") from None
        object.__setattr__(self, "lengths", tuple(int(x) for x in lengths))
        p, b, s, lengths = self.partition_bits, self.bucket_bits, self.slots, self.lengths
        if not (0 <= p <= MAX_PARTITION_BITS):
            raise ValueError(f"partition_bits={p}: expected 0..{MAX_PARTITION_BITS}")
        if not (1 <= b <= 24):
            raise ValueError(f"bucket_bits={b}: expected 1..24 (buckets come from the shortest length's checksum)")
        if s <= 0 or s % SLOTS_PER_LINE or s > MAX_SLOTS:
            raise ValueError(f"slots={s}: expected a positive multiple of {SLOTS_PER_LINE} (one 64-byte line) up to {MAX_SLOTS}")
        if not 1 <= len(lengths) <= MAX_LENGTHS:
            raise ValueError(f"lengths={lengths}: expected 1 to {MAX_LENGTHS} n-gram lengths")
        if lengths[0] < 1 or any(a >= b_ for a, b_ in zip(lengths, lengths[1:])):
            raise ValueError(f"lengths={lengths}: expected strictly increasing positive lengths")
        if lengths[-1] > MAX_LENGTH:
            raise ValueError(f"lengths={lengths}: the longest supported n-gram length is {MAX_LENGTH} "
                             f"(a saved index keeps {MAX_LENGTH} tokens of stream history)")
        if p + CHECKSUM_BITS[len(lengths)][0] > 64:
            raise ValueError(f"partition_bits={p}: too many for a 64-bit hash")

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def n_partitions(self):
        return 1 << self.partition_bits

    @property
    def n_buckets(self):
        return 1 << self.bucket_bits

    @property
    def n_slots(self):
        return self.n_partitions * self.n_buckets * self.slots

    @property
    def table_bytes(self):
        return self.n_slots * SLOT_BYTES

    @property
    def fill_bytes(self):
        return self.n_partitions * self.n_buckets * 2  # uint16 fill count per bucket

    @property
    def nbytes(self):
        return self.table_bytes + self.fill_bytes

    @property
    def n_lengths(self):
        return len(self.lengths)

    @property
    def checksum_bits(self):
        return CHECKSUM_BITS[self.n_lengths]

    @property
    def key_shifts(self):
        """shift[k]: slot >> shift[k] is the nested key of lengths 0..k."""
        bits = self.checksum_bits
        return tuple(TOKEN_BITS + sum(bits[k + 1:]) for k in range(len(bits)))

    def describe(self):
        return (f"{self.n_partitions} partitions x {self.n_buckets} buckets x {self.slots} slots"
                f" = {human_bytes(self.table_bytes)}, lengths {self.lengths}")

    def to_dict(self):
        return dataclasses.asdict(self)

    # ---- construction --------------------------------------------------------------------
    @classmethod
    def preset(cls, name):
        try:
            return PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown geometry preset {name!r}: expected one of {sorted(PRESETS)}") from None

    @classmethod
    def for_tokens(cls, n_tokens, slots=176, lengths=DEFAULT_LENGTHS, load=TARGET_LOAD, max_bucket_bits=14):
        """Smallest geometry holding n_tokens at `load` tokens per slot (power-of-two sizes).

        Buckets grow first up to 2^max_bucket_bits per partition (the record's 2^14, so a
        partition stays a unit one worker places on its own), then partitions.
        """
        if n_tokens <= 0:
            raise ValueError(f"n_tokens={n_tokens}: expected a positive token count")
        need_buckets = max(2, -(-int(n_tokens / load) // slots))
        total_bits = max(1, (need_buckets - 1).bit_length())
        bucket_bits = min(total_bits, max_bucket_bits)
        partition_bits = total_bits - bucket_bits
        return cls(partition_bits, bucket_bits, slots, lengths)

    @classmethod
    def parse(cls, spec, n_tokens=None, lengths=DEFAULT_LENGTHS):
        """A geometry from text: a preset name, 'auto' (for_tokens(n_tokens)) or 'P,B,S'
        (partition bits, bucket bits, slots), with the given n-gram lengths."""
        if spec == "auto":
            return cls.for_tokens(n_tokens, lengths=lengths)
        if spec in PRESETS:
            return dataclasses.replace(PRESETS[spec], lengths=tuple(lengths))
        try:
            p, b, s = (int(x) for x in spec.split(","))
        except ValueError:
            raise ValueError(f"geometry {spec!r}: expected a preset ({', '.join(PRESETS)}), 'auto' or 'P,B,S'") from None
        return cls(p, b, s, tuple(lengths))

    def check_fits_memory(self, what="hint index", available=None):
        """Refuse, before allocating anything, a table larger than the machine can hold."""
        available = available_memory_bytes() if available is None else available
        if available is not None and self.nbytes > MAX_MEMORY_FRACTION * available:
            raise MemoryError(
                f"{what}: geometry {self.describe()} needs {human_bytes(self.nbytes)}, but only "
                f"{human_bytes(available)} of memory is available (limit {MAX_MEMORY_FRACTION:.0%}); "
                f"use a smaller geometry (Geometry.for_tokens or a preset) or a file backing (path=...)")


assert sorted(CHECKSUM_BITS) == list(range(1, MAX_LENGTHS + 1))
assert all(sum(b) == CHECKSUM_TOTAL_BITS and list(b) == sorted(b, reverse=True) for b in CHECKSUM_BITS.values())

PRESETS = {
    # The record: 2^14 x 2^14 x 176 x 8 bytes = 352 GiB (article, "Hint corpus details").
    "record": Geometry(14, 14, 176, DEFAULT_LENGTHS),
    # 1.5 GiB, ~90M tokens at load 0.5: a laptop, or benchmarks on a small machine.
    "laptop": Geometry(8, 12, 176, DEFAULT_LENGTHS),
    # 92 MiB, ~6M tokens at load 0.5: the CPU demo on a local corpus.
    "demo": Geometry(6, 10, 176, DEFAULT_LENGTHS),
    # Tests: 16 x 256 x 16 slots = 512 KiB.
    "tiny": Geometry(4, 8, 16, DEFAULT_LENGTHS),
}
