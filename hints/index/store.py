"""On-disk format of a hint index: one file, a 4 KiB header, the bucket fill counts, the slot
table and, for a sealed index, its side table.

    offset 0            header (HEADER_BYTES): magic, version, geometry, counts, stream tail,
                        data checksum, sealed flag, side-table size, and a CRC32 of the header
    offset 4096         fill counts, uint16[2^P, 2^B]
    page-aligned after  slot table, uint64[2^P, 2^B, S]
    sealed only:        bucket summaries uint16[2^P, 2^B, W], side-table offsets int64[2^P + 1]
                        and the side table uint64[2 n] (key, value pairs), each page-aligned
                        (see `hints.index.sealed`)

All arrays are page-aligned so `np.memmap` maps them as they are: loading with mmap=True
reads the header and the fill counts only. The data checksum (``build.checksum64`` over
fill, table and the side table) is checked on a full load and on request (``verify=True``);
the header CRC, the geometry, the file size and every bucket's fill count (<= slots, summing
to the header's hint count: the lookup kernels rely on it) are always checked, so no fill or
table content can make a kernel read or write out of bounds.

Files are created mode 0600 with O_EXCL|O_NOFOLLOW (never through a planted symlink), and
their blocks are reserved up front (posix_fallocate): a full disk or shared-memory folder is
an error naming the file when it is created, never a SIGBUS in the middle of a build.

Versions: 2 added the sealed flag and the sealed arrays; 3 added the presence filter to each
bucket's summary row; 4 changed the n-gram hash (`hints.index.hashing`: a multiply-shift in
place of the fmix64 finaliser), so every slot of an earlier file sits where this code would not
look for it. An earlier file is refused with a message that names it and says to build it again
(its tokens are not in it, so it cannot be converted).
"""
import errno
import os
import struct
import zlib

import numpy as np

from .geometry import MAX_LENGTH, MAX_LENGTHS, Geometry, human_bytes
from .sealed import summary_words

MAGIC = b"NGHINTS\x00"
VERSION = 4
HEADER_BYTES = 4096   # one page, so the arrays after it are page-aligned
PAGE = 4096
HEADER_LENGTHS = 8           # length fields the header has room for (Geometry allows at most MAX_LENGTHS)
HISTORY_TOKENS = MAX_LENGTH  # stream tail kept so a loaded index can go on adding (Geometry refuses longer lengths)
assert MAX_LENGTHS <= HEADER_LENGTHS

# magic, version, P, B, S, n_lengths, lengths[8], tokens_added, hints_stored, dropped,
# data_checksum, history_len, history[64] (uint16), sealed, side entries, then the CRC32 of all
# of that.
_FIELDS = struct.Struct(f"<8sIIIII{HEADER_LENGTHS}IQQQQI{HISTORY_TOKENS}HIQ")
_VERSION = struct.Struct("<8sI")
_CRC = struct.Struct("<I")
SEALED_ARRAYS = ("summary", "side_off", "side")


def round_up(n, to=PAGE):
    return -(-n // to) * to


def layout(geom, side_capacity=None):
    """(fill offset, table offset, total file bytes) of a geometry; with side_capacity (a sealed
    index), a dict of those and of the sealed arrays' offsets and shapes."""
    fill_off = HEADER_BYTES
    table_off = fill_off + round_up(geom.fill_bytes)
    end = table_off + geom.table_bytes
    if side_capacity is None:
        return fill_off, table_off, end
    words = summary_words(geom.slots)
    shapes = dict(summary=((geom.n_partitions, geom.n_buckets, words), np.uint16),
                  side_off=((geom.n_partitions + 1,), np.int64),
                  side=((2 * side_capacity,), np.uint64))
    out = dict(fill=fill_off, table=table_off, shapes=shapes)
    for name in SEALED_ARRAYS:
        shape, dtype = shapes[name]
        out[name] = end = round_up(end)
        end += int(np.prod(shape)) * np.dtype(dtype).itemsize
    out["total"] = end
    return out


def file_bytes(geom, sealed, side_capacity):
    return layout(geom, side_capacity)["total"] if sealed else layout(geom)[2]


def pack_header(geom, tokens_added, hints_stored, dropped, data_checksum, history, sealed=False, side_capacity=0):
    lengths = list(geom.lengths) + [0] * (HEADER_LENGTHS - geom.n_lengths)
    hist = list(int(x) for x in history) + [0] * (HISTORY_TOKENS - len(history))
    body = _FIELDS.pack(MAGIC, VERSION, geom.partition_bits, geom.bucket_bits, geom.slots, geom.n_lengths,
                        *lengths, int(tokens_added), int(hints_stored), int(dropped), int(data_checksum),
                        len(history), *hist, int(bool(sealed)), int(side_capacity))
    raw = body + _CRC.pack(zlib.crc32(body))
    return raw + b"\x00" * (HEADER_BYTES - len(raw))


def read_header(path):
    """Parse and check a saved index's header; returns a dict. Raises ValueError naming the file."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise FileNotFoundError(f"hint index {path}: cannot open ({e.strerror})") from None
    if size < _VERSION.size:
        raise ValueError(f"hint index {path}: file is {size} bytes, too short for a header; truncated?")
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
    magic, version = _VERSION.unpack(raw[:_VERSION.size])
    if magic != MAGIC:
        raise ValueError(f"hint index {path}: magic is {magic!r}, expected {MAGIC!r}; not a hint index file")
    if version < VERSION:
        raise ValueError(f"hint index {path}: format version is {version}, made before version {VERSION} changed the "
                         f"n-gram hash, so this code cannot find its slots; build it again from its tokens "
                         f"(python -m hints build)")
    if version != VERSION:
        raise ValueError(f"hint index {path}: format version is {version}, expected {VERSION}; made by newer code?")
    need = _FIELDS.size + _CRC.size
    if size < need:
        raise ValueError(f"hint index {path}: file is {size} bytes, too short for a header ({need} bytes); truncated?")
    body, (crc,) = raw[:_FIELDS.size], _CRC.unpack(raw[_FIELDS.size:need])
    fields = _FIELDS.unpack(body)
    if zlib.crc32(body) != crc:
        raise ValueError(f"hint index {path}: header checksum mismatch; the header is corrupt")
    p, b, s, n_len = fields[2:6]
    lengths = fields[6:6 + n_len]
    rest = fields[6 + HEADER_LENGTHS:]
    tokens_added, hints_stored, dropped, data_checksum, hist_len = rest[:5]
    sealed, side_capacity = bool(rest[5 + HISTORY_TOKENS]), int(rest[6 + HISTORY_TOKENS])
    try:
        geom = Geometry(p, b, s, tuple(lengths))
    except ValueError as e:
        raise ValueError(f"hint index {path}: bad geometry in header: {e}") from None
    if hist_len != min(tokens_added, max(geom.lengths)):
        raise ValueError(f"hint index {path}: header keeps {hist_len} history tokens, expected "
                         f"min(tokens added {tokens_added}, longest length {max(geom.lengths)}); corrupt header")
    for name, v in (("tokens_added", tokens_added), ("dropped", dropped)):
        if v >= 1 << 63:
            raise ValueError(f"hint index {path}: header field {name} is {v}, expected < 2^63; corrupt header")
    history = np.array(rest[5:5 + hist_len], dtype=np.uint16)
    expected = file_bytes(geom, sealed, side_capacity)
    if size != expected:
        raise ValueError(f"hint index {path}: file is {size} bytes, expected {expected} for geometry "
                         f"{geom.describe()}{' sealed' if sealed else ''}; truncated or corrupt")
    return dict(geometry=geom, tokens_added=tokens_added, hints_stored=hints_stored, dropped=dropped,
                data_checksum=data_checksum, history=history, version=version, sealed=sealed,
                side_capacity=side_capacity)


def check_fill(path, fill, slots, hints_stored):
    """Refuse fill counts the lookup kernels cannot trust: every bucket holds at most `slots`
    hints and the counts sum to the header's hint count. `fill` is the (small) uint16 array."""
    flat = np.asarray(fill).reshape(-1)
    worst = int(flat.argmax()) if flat.size else 0
    if flat.size and flat[worst] > slots:
        p, b = divmod(worst, fill.shape[1])
        raise ValueError(f"hint index {path}: bucket {b} of partition {p} claims {int(flat[worst])} hints, "
                         f"but a bucket has {slots} slots; the file is corrupt")
    total = int(flat.sum(dtype=np.int64))
    if total != hints_stored:
        raise ValueError(f"hint index {path}: the bucket fill counts sum to {total:,} hints, the header says "
                         f"{hints_stored:,}; the file is corrupt")


def check_side(path, side_off, side, side_capacity):
    """Refuse a sealed index's side table the lookup kernels cannot trust: its offsets run from 0
    to the capacity in power-of-two steps (a probe masks with them), and every partition's part
    has an empty entry (a probe for a missing key ends there). (The bucket summaries need no
    check: the kernels clamp the fill they read there to the slot count.)"""
    off = np.asarray(side_off, dtype=np.int64)
    caps = np.diff(off)
    if off[0] != 0 or off[-1] != side_capacity or (caps < 0).any() or (caps & (caps - 1)).any():
        raise ValueError(f"hint index {path}: the side-table offsets are not 0 .. {side_capacity} in power-of-two "
                         f"steps; the file is corrupt")
    used = caps > 0
    if used.any():
        empty = (np.asarray(side)[1::2] == 0).astype(np.int64)
        per_part = np.add.reduceat(empty, off[:-1][used])
        if (per_part == 0).any():
            raise ValueError(f"hint index {path}: a side table has no empty entry; the file is corrupt")


def write_header(path, header_bytes):
    with open(path, "r+b") as f:
        f.write(header_bytes)
        f.flush()
        os.fsync(f.fileno())


PRIVATE_FLAGS = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC  # a new file of our own, not a link's target
PRIVATE_MODE = 0o600                                                # index files and segments: owner only


def reserve(fd, nbytes, path):
    """Give the open file `fd` its `nbytes` of blocks now (posix_fallocate): writing through a
    memory map later cannot then fail with SIGBUS. No space is an OSError naming the file."""
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.ENOMEM):
            raise OSError(e.errno, f"hint index {path}: cannot reserve {nbytes:,} bytes ({human_bytes(nbytes)}): "
                                   f"{os.strerror(e.errno)}") from None
        raise


def create_file(path, geom):
    """A new file at `path` (an old file or link there is removed first), mode 0600, of the
    geometry's size with every block reserved, and an invalid (zero) header: readers refuse it
    until saved. On any failure nothing is left at `path`."""
    total = layout(geom)[2]
    if os.path.lexists(path):
        os.unlink(path)
    fd = os.open(path, os.O_RDWR | PRIVATE_FLAGS, PRIVATE_MODE)
    try:
        reserve(fd, total, path)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return total


def map_arrays(path, geom, mode):
    """(fill, table) memory maps of a file laid out for geom. mode: 'r', 'r+' or 'c'."""
    fill_off, table_off, _ = layout(geom)
    shape2 = (geom.n_partitions, geom.n_buckets)
    fill = np.memmap(path, dtype=np.uint16, mode=mode, offset=fill_off, shape=shape2)
    table = np.memmap(path, dtype=np.uint64, mode=mode, offset=table_off, shape=shape2 + (geom.slots,))
    return fill, table


def map_sealed(path, geom, side_capacity, mode):
    """(summary, side_off, side) memory maps of a sealed index's file."""
    lay = layout(geom, side_capacity)
    out = []
    for name in SEALED_ARRAYS:
        shape, dtype = lay["shapes"][name]
        if int(np.prod(shape)) == 0:  # np.memmap refuses empty maps
            out.append(np.zeros(shape, dtype=dtype))
        else:
            out.append(np.memmap(path, dtype=dtype, mode=mode, offset=lay[name], shape=shape))
    return tuple(out)
