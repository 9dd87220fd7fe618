"""Shard folder manifests: which shards belong to a folder's set, so that stale, partial or
foreign files are never read by accident, and which token ids they hold.

`manifest.json` in a folder of shards lists every shard of the set: its tokens, bytes,
sha256 and largest token id. It is written last and atomically by whatever wrote the set
(`shard_set`, used by data.fineweb and data.local_corpus; the FineWeb download after
verifying each file against the hub; or `python -m data.manifest DIR` for shards made
elsewhere), so a folder with a manifest holds a complete set.

Shards made elsewhere (modded-nanogpt's or llm.c's folders) have none. The first read of such
a folder through a glob records one (`record_on_first_read`): every .bin file in it (and every
file the glob matched) is read once (header and size checked, largest token id recorded for
check_token_ids; no sha256, whose hashing would cost a 10B-token folder minutes of CPU: `python
-m data.manifest DIR` records hashes too), and the set is written as the folder's
manifest.json when the folder takes the write, or else held in memory for the life of the
process; one line says which. From then on the folder reads like any other.

The rule readers apply (`check_shards`, behind data.loader.resolve_files: training,
validation, the hint builders and the hints CLI):
- a glob pattern: a folder it matches files in without a manifest is recorded as above; every
  matched file must be listed with its size and token count; every listed file the pattern
  matches must exist. Anything else is a ValueError naming the file and what to do.
- an explicit file path (no wildcard): if its folder has a manifest, the file must agree
  with it; otherwise the file is read on its own (its header and size are checked, as always).
A file's sha256, where recorded, is checked by `python -m data.manifest --verify DIR` (it reads
every byte), not on every read.

`check_token_ids(files, vocab_size)` refuses ids >= the vocabulary before training, from the
manifest's recorded maxima (no shard is read) or, for a file without a manifest, from one
vectorised pass over it, cached per (path, size, mtime) for the life of the process.
"""

import argparse
import contextlib
import fnmatch
import hashlib
import json
import os
import shutil
import sys

import numpy as np
from tqdm import tqdm

from data.shards import HEADER_BYTES, TOKEN_DTYPE, list_shards, read_header

MANIFEST = "manifest.json"
FORMAT = "llmc-shards"  # the manifest's "format" field; the shards are llm.c .bin files
VERSION = 1
PARTIAL_PREFIX = ".partial-"  # shard_set's temporary folder inside the output folder (no glob of shards matches it)
READ_BYTES = 1 << 24    # one pass over a shard reads it 16 MiB at a time (hash and max id together)
PROGRESS_DELAY_S = 2.0  # a folder read faster than this shows no progress bar (a tiny run's log stays clean)

_max_id_cache = {}  # (realpath, size, mtime_ns) -> largest token id, for files without a manifest
_held = {}  # absolute folder -> the manifest recorded on its first read, where the folder could not be written
RECORDED_ON_READ = {"recorded": "on the first read of the folder"}  # the "source" of record_on_first_read's manifests


def describe_shard(path, digest=True):
    """One pass over shard `path`: {"tokens", "bytes", "sha256", "max_id"} (max_id -1 when empty).
    digest=False: sha256 None, and the pass is the id pass alone over a memory map (hashing costs
    ~30x as much: ~4 s/GiB on one core of the 2-core test machine)."""
    count = read_header(path)
    if not digest:
        return {"tokens": count, "bytes": os.path.getsize(path), "sha256": None, "max_id": largest_id(path)}
    h, top = hashlib.sha256(), -1
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
        h.update(head)
        carry = b""
        while block := f.read(READ_BYTES):
            h.update(block)
            block = carry + block
            usable = len(block) - len(block) % TOKEN_DTYPE.itemsize
            if usable:
                top = max(top, int(np.frombuffer(block[:usable], dtype=TOKEN_DTYPE).max()))
            carry = block[usable:]
    return {"tokens": count, "bytes": os.path.getsize(path), "sha256": h.hexdigest(), "max_id": top}


def manifest_path(folder):
    return os.path.join(folder, MANIFEST)


def read_manifest(folder):
    """The manifest dict of `folder`, or None when it has none. A damaged one is a ValueError."""
    path = manifest_path(folder)
    try:
        with open(path) as f:
            m = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: unreadable manifest ({e}); rewrite it: python -m data.manifest {folder}") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT or m.get("version") != VERSION or \
            not isinstance(m.get("files"), dict):
        raise ValueError(f"{path}: not a {FORMAT} manifest of version {VERSION}; "
                         f"rewrite it: python -m data.manifest {folder}")
    return m


def _fsync_dir(folder):
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def describe_files(folder, names, progress=False, digest=True):
    """{name: describe_shard(...)} for the shards `names` of `folder` (each read once). The progress
    bar shows only once reading has taken PROGRESS_DELAY_S: a small folder's record is one line."""
    return {n: describe_shard(os.path.join(folder, n), digest)
            for n in tqdm(sorted(names), desc=f"manifest {folder}", unit="shard", disable=not progress,
                          delay=PROGRESS_DELAY_S)}


def new_manifest(entries, source=None):
    return {"format": FORMAT, "version": VERSION, "source": source, "files": dict(sorted(entries.items()))}


def write_manifest(folder, entries=None, source=None, progress=False):
    """Write `folder`'s manifest atomically (temp file, fsync, rename). entries: {name:
    describe_shard(...)}; by default every *.bin file in the folder is described (read once).
    source: where the set came from (e.g. the hub repo and revision). Returns the manifest."""
    folder = os.path.abspath(folder)
    if entries is None:
        names = [n for n in os.listdir(folder) if n.endswith(".bin") and os.path.isfile(os.path.join(folder, n))]
        if not names:
            raise FileNotFoundError(f"{folder}: no .bin shards to record in a manifest")
        entries = describe_files(folder, names, progress)
    m = new_manifest(entries, source)
    tmp = manifest_path(folder) + f".tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(m, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, manifest_path(folder))
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    _fsync_dir(folder)
    return m


def manifest_of(folder):
    """`folder`'s manifest: its manifest.json, else the one this process recorded and holds for
    it (a folder it could not write); None when there is neither."""
    m = read_manifest(folder)
    return m if m is not None else _held.get(os.path.abspath(folder))


def record_on_first_read(folder, matched=(), log=print, progress=True):
    """Record the shards of `folder`, which has no manifest: every .bin file in it and the
    `matched` paths, each read once (header, size, largest id, no sha256; a bad one is a ValueError
    naming it). The set is written as the folder's manifest.json when the folder takes the write,
    else held in memory for this process; one line to `log` says which. Returns the manifest."""
    folder = os.path.abspath(folder)
    names = {n for n in os.listdir(folder) if n.endswith(".bin") and os.path.isfile(os.path.join(folder, n))}
    names |= {os.path.basename(f) for f in matched}
    try:
        entries = describe_files(folder, names, progress, digest=False)
    except ValueError as e:
        raise ValueError(f"{e} (read to record {folder}, which has no {MANIFEST}: every .bin file in it is taken "
                         f"as a shard of its set; move out what is not)") from None
    what = (f"{len(entries)} shards ({sum(e['tokens'] for e in entries.values()):,} tokens, each read once: header "
            f"and size checked, largest id {max(e['max_id'] for e in entries.values())})")
    try:
        m = write_manifest(folder, entries, source=RECORDED_ON_READ)
    except OSError as e:  # a read-only folder (or a full disk): the run goes on with the set held here
        m = _held[folder] = new_manifest(entries, RECORDED_ON_READ)
        if log:
            log(f"shards: {folder} has no {MANIFEST} and could not take one ({e.strerror}); its {what} are held "
                f"in memory for this run")
        return m
    if log:
        log(f"shards: {folder} had no {MANIFEST}; recorded its {what} in {manifest_path(folder)}")
    return m


def agrees(path, entry):
    """None when shard `path` has the size and token count `entry` records, else what differs."""
    size = os.path.getsize(path)
    if size != entry["bytes"]:
        return f"it is {size:,} bytes, the manifest says {entry['bytes']:,}"
    count = read_header(path)
    if count != entry["tokens"]:
        return f"it holds {count:,} tokens, the manifest says {entry['tokens']:,}"
    return None


def _has_wildcard(pattern):
    return any(c in pattern for c in "*?[")


def _how_to_record(folder):
    return f"if its shards are complete and current, record them: python -m data.manifest {folder}"


def check_shards(patterns, log=print, progress=True):
    """The sorted shard paths named by `patterns` (a glob, a path, or a list of them), each
    checked against its folder's manifest by the rule in this module's docstring. log and
    progress: the one-line notice and the progress bar of a folder recorded on first read (log None:
    no line; progress False: no bar)."""
    patterns = [patterns] if isinstance(patterns, (str, os.PathLike)) else list(patterns)
    files = list_shards(patterns)
    manifests = {}

    def folder_manifest(folder):
        if folder not in manifests:
            manifests[folder] = manifest_of(folder)
        return manifests[folder]

    for p in patterns:
        p = os.path.expanduser(os.fspath(p))
        if not _has_wildcard(p):  # an explicit file: checked only if its folder has a manifest
            folder = os.path.dirname(os.path.abspath(p))
            m = folder_manifest(folder)
            if m is not None:
                _check_listed(os.path.abspath(p), folder, m)
            continue
        matched = [os.path.abspath(f) for f in list_shards(p)]
        for folder in sorted({os.path.dirname(f) for f in matched}):
            here = [f for f in matched if os.path.dirname(f) == folder]
            m = folder_manifest(folder)
            if m is None:
                m = manifests[folder] = record_on_first_read(folder, here, log, progress)
            for f in here:
                _check_listed(f, folder, m)
            if not _has_wildcard(os.path.dirname(p)):
                name_pattern = os.path.basename(p)
                for name in m["files"]:
                    if fnmatch.fnmatchcase(name, name_pattern) and not os.path.exists(os.path.join(folder, name)):
                        raise ValueError(f"shard folder {folder}: {MANIFEST} lists {name}, which is missing "
                                         f"(an interrupted write or download?); write or download the set again")
    return files


def _check_listed(path, folder, m):
    name = os.path.basename(path)
    entry = m["files"].get(name)
    if entry is None:
        raise ValueError(f"shard {path} is not in {manifest_path(folder)} (left from an older run, or added by "
                         f"hand?); remove it, or {_how_to_record(folder)}")
    why = agrees(path, entry)
    if why:
        raise ValueError(f"shard {path} disagrees with {manifest_path(folder)}: {why}; it changed after the set "
                         f"was written: write the set again, or {_how_to_record(folder)}")


def _max_id(path, m):
    """Largest token id of shard `path`: its folder's manifest `m` records it when the file
    agrees with it; else one pass over the file (cached per path, size and mtime)."""
    entry = m["files"].get(os.path.basename(path)) if m else None
    if entry is not None and "max_id" in entry and agrees(path, entry) is None:
        return entry["max_id"]
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if key not in _max_id_cache:
        _max_id_cache[key] = largest_id(path)
    return _max_id_cache[key]


def largest_id(path):
    """The largest token id of shard `path` (-1 when empty): one vectorised pass over its memory map."""
    tokens = _tokens(path)
    step = READ_BYTES // TOKEN_DTYPE.itemsize
    return max((int(tokens[i:i + step].max()) for i in range(0, len(tokens), step)), default=-1)


def _tokens(path):
    count = read_header(path)
    return np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(count,)) if count else \
        np.zeros(0, dtype=TOKEN_DTYPE)


def first_id_at_least(path, vocab_size):
    """(position, value) of the first token id >= vocab_size in shard `path`, or None."""
    tokens = _tokens(path)
    step = READ_BYTES // TOKEN_DTYPE.itemsize
    for start in range(0, len(tokens), step):
        bad = np.flatnonzero(tokens[start:start + step] >= vocab_size)
        if bad.size:
            pos = start + int(bad[0])
            return pos, int(tokens[pos])
    return None


def check_token_ids(files, vocab_size, log=print, progress=True):
    """Refuse shards holding a token id >= vocab_size, before any training step: ValueError
    naming the file, the position and the value. files: a glob, a path or a list (checked
    against manifests as data.loader reads them; log, progress: as check_shards). Returns the
    largest id found."""
    top, manifests = -1, {}
    for path in check_shards(files, log, progress):
        folder = os.path.dirname(os.path.abspath(path))
        if folder not in manifests:
            manifests[folder] = manifest_of(folder)
        m = _max_id(path, manifests[folder])
        if m >= vocab_size:
            pos, value = first_id_at_least(path, vocab_size)
            raise ValueError(f"shard {path}: token id {value} at position {pos:,} is outside the vocabulary "
                             f"(ids must be < {vocab_size}); was it tokenized with another tokenizer?")
        top = max(top, m)
    return top


def _pid_alive(text):
    try:
        os.kill(int(text), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        pass
    return True


@contextlib.contextmanager
def shard_set(out_dir, owned):
    """Write a complete set of shards into `out_dir`, or nothing at all.

    Yields a fresh temporary folder inside out_dir: write every file of the set there. On
    success the set replaces the old one: the old manifest goes first (readers refuse the
    folder while it changes), the new files are renamed into place, files of the old set
    (names the regex `owned` matches) that the new set lacks are removed, and the new
    manifest, listing the new set's .bin shards, goes last. On failure the temporary folder
    is removed and out_dir is left as it was.
    """
    out_dir = os.path.abspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    for n in os.listdir(out_dir):  # left by a writer that was killed
        if n.startswith(PARTIAL_PREFIX) and not _pid_alive(n[len(PARTIAL_PREFIX):]):
            shutil.rmtree(os.path.join(out_dir, n), ignore_errors=True)
    tmp = os.path.join(out_dir, f"{PARTIAL_PREFIX}{os.getpid()}")
    os.makedirs(tmp)
    try:
        yield tmp
        names = sorted(os.listdir(tmp))
        entries = {n: describe_shard(os.path.join(tmp, n)) for n in names if n.endswith(".bin")}
        with contextlib.suppress(FileNotFoundError):
            os.remove(manifest_path(out_dir))
        for n in names:
            os.replace(os.path.join(tmp, n), os.path.join(out_dir, n))
        for n in os.listdir(out_dir):
            if owned.match(n) and n not in names:
                os.remove(os.path.join(out_dir, n))
        write_manifest(out_dir, entries)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def verify_folder(folder, progress=True):
    """Read every shard listed in `folder`'s manifest and compare its sha256 and max id."""
    m = read_manifest(folder)
    if m is None:
        raise ValueError(f"shard folder {folder} has no {MANIFEST}; {_how_to_record(folder)}")
    for name, entry in tqdm(m["files"].items(), desc="verify", unit="shard", disable=not progress):
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            raise ValueError(f"shard folder {folder}: {MANIFEST} lists {name}, which is missing")
        got = describe_shard(path)
        for key in ("bytes", "tokens", "sha256", "max_id"):
            if key == "sha256" and entry.get(key) is None:
                continue  # recorded on first read: no hash to compare (main says so)
            if got[key] != entry.get(key):
                raise ValueError(f"shard {path}: {key} is {got[key]}, {manifest_path(folder)} says {entry.get(key)}")
    return m


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Record the .bin shards of a folder as one complete set in its manifest.json (the first read "
        "of a folder without one records it too), or verify a folder against its manifest.")
    parser.add_argument("folder", help="folder of .bin shards")
    parser.add_argument("--verify", action="store_true", help="check every listed shard's sha256, size and ids instead")
    args = parser.parse_args(argv)
    try:
        if args.verify:
            m = verify_folder(args.folder)
            unhashed = sum(e.get("sha256") is None for e in m["files"].values())
            print(f"{args.folder}: {len(m['files'])} shards agree with {MANIFEST}" + (
                f"; {unhashed} of them with no sha256 recorded (recorded on first read), so their sizes, token "
                f"counts and largest ids only: python -m data.manifest {args.folder} records hashes" if unhashed else ""))
        else:
            m = write_manifest(args.folder, progress=True)
            tokens = sum(e["tokens"] for e in m["files"].values())
            print(f"{manifest_path(os.path.abspath(args.folder))}: {len(m['files'])} shards, {tokens:,} tokens")
    except (ValueError, OSError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
