"""Download pre-tokenized FineWeb GPT-2 shards (the modded-nanogpt cached sets) from the
Hugging Face hub; the logic behind `cached_fineweb10B.py` and `cached_fineweb100B.py`.

Downloads come from one pinned commit of the dataset repo, and each file is checked against
what the hub publishes for it at that commit (size and sha256 of its LFS object) before it is
recorded in the folder's manifest.json (data/manifest.py), which readers check. Files the
manifest already lists, and that still agree with it, are kept without contacting the hub.
When the hub cannot be reached, `HubUnreachableError` says so and how to proceed: copy the
shards by hand (the first read records them, or `python -m data.manifest DIR`).
"""

import argparse
import hashlib
import os
import socket
import sys
from urllib.parse import urlsplit

from tqdm import tqdm

from data.manifest import agrees, describe_shard, read_manifest, write_manifest

DATA_DIR = os.path.dirname(os.path.abspath(__file__))

# The cached GPT-2 tokenizations of FineWeb used by modded-nanogpt's cached_fineweb*.py:
# 100M tokens per shard; fineweb10B has 103 train shards, fineweb100B has 1030.
# revision: the dataset commit downloads come from. 10B: the commit that public reproductions of
# the speedrun pin for these shards. 100B: None, as no commit could be checked from here; the
# first download into a folder resolves the branch head to its commit and records it in the
# folder's manifest, and later downloads into that folder use that commit.
VARIANTS = {
    "10B": {
        "repo_id": "kjj0/fineweb10B-gpt2",
        "revision": "889765ea1f903759787add96995d81171b632d0c",
        "dir": "fineweb10B",
        "max_train_shards": 103,
        "default_train_shards": 8,  # 800M tokens: more than a record run trains on
    },
    "100B": {
        "repo_id": "kjj0/fineweb100B-gpt2",
        "revision": None,
        "dir": "fineweb100B",
        "max_train_shards": 1030,
        "default_train_shards": 370,  # 37B tokens: the record's largest hint corpus
    },
}
REPO_TYPE = "dataset"
VAL_FILE = "fineweb_val_000000.bin"  # the FineWeb val shard: 100M tokens, the speedrun scores its first 10,485,760
TRAIN_FILE = "fineweb_train_{:06d}.bin"  # train shards are numbered from 000001
CONNECT_TIMEOUT_S = 5.0  # reachability probe; without it an offline hub costs ~30 s of retries
DEFAULT_BRANCH = "main"  # resolved to a commit when a variant pins none
GIT_BLOB_READ = 1 << 24  # bytes per read when hashing a non-LFS file as git does


class HubUnreachableError(RuntimeError):
    """The Hugging Face hub could not be reached (offline, no DNS, blocked, HF_HUB_OFFLINE set)."""


class HubDownloadError(RuntimeError):
    """The hub was reached but refused a file (missing repo or file, access denied)."""


def shard_names(n_train_shards):
    """File names of the val shard and the first `n_train_shards` train shards."""
    return [VAL_FILE] + [TRAIN_FILE.format(i) for i in range(1, n_train_shards + 1)]


def _offline_env():
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "") or os.environ.get("TRANSFORMERS_OFFLINE", "")
    return env.strip().upper() in {"1", "ON", "YES", "TRUE"} or constants.is_offline_mode()


def _unreachable_message(out_dir, reason):
    return (
        f"could not reach the Hugging Face hub ({reason}); copy the shards "
        f"({VAL_FILE}, {TRAIN_FILE.format(1)}, ...) into {out_dir} and record them with "
        f"python -m data.manifest {out_dir}"
    )


def check_hub_reachable(out_dir):
    """Raise HubUnreachableError fast when offline mode is on or the hub's host refuses a TCP connection.

    Skipped behind a proxy (HTTPS_PROXY etc.), where only the proxy knows.
    """
    if _offline_env():
        raise HubUnreachableError(_unreachable_message(out_dir, "HF_HUB_OFFLINE is set"))
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")):
        return
    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        raise HubUnreachableError(_unreachable_message(out_dir, f"{host}:{port}: {e}")) from e


def _is_network_error(exc):
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    if isinstance(exc, (OfflineModeIsEnabled, LocalEntryNotFoundError, ConnectionError, TimeoutError, socket.error)):
        return True
    names = " ".join(c.__name__ for c in type(exc).__mro__)
    return any(w in names for w in ("Transport", "Connect", "Timeout", "Network", "Proxy"))


def resolve_revision(repo_id, revision):
    """The commit to download from: `revision` when pinned, else the default branch's head."""
    if revision:
        return revision
    from huggingface_hub import HfApi

    return HfApi().repo_info(repo_id, repo_type=REPO_TYPE, revision=DEFAULT_BRANCH).sha


def hub_file_info(repo_id, names, revision):
    """{name: (size, kind, digest)} as the hub publishes them at `revision`: kind "sha256" (the
    LFS object's hash) or "git-sha1" (the blob id of a file stored in git itself)."""
    from huggingface_hub import HfApi

    info = {}
    for f in HfApi().get_paths_info(repo_id, list(names), revision=revision, repo_type=REPO_TYPE):
        if f.lfs is not None:
            info[f.path] = (f.lfs.size, "sha256", f.lfs.sha256)
        elif hasattr(f, "blob_id"):
            info[f.path] = (f.size, "git-sha1", f.blob_id)
    missing = [n for n in names if n not in info]
    if missing:
        raise HubDownloadError(f"the hub lists no {', '.join(missing)} in {repo_id} at {revision}")
    return info


def _git_blob_sha1(path):
    h = hashlib.sha1(f"blob {os.path.getsize(path)}\0".encode())
    with open(path, "rb") as f:
        while block := f.read(GIT_BLOB_READ):
            h.update(block)
    return h.hexdigest()


def verify_download(path, expected):
    """Check a downloaded file against the hub's (size, kind, digest); return its manifest
    entry (data.manifest.describe_shard). A mismatch is a HubDownloadError naming the file."""
    size, kind, digest = expected
    got = os.path.getsize(path)
    if got != size:
        raise HubDownloadError(f"downloaded {path} is {got:,} bytes, the hub says {size:,}")
    try:
        entry = describe_shard(path)
    except ValueError as e:
        raise HubDownloadError(f"downloaded {path} is not a valid shard: {e}") from None
    actual = entry["sha256"] if kind == "sha256" else _git_blob_sha1(path)
    if actual != digest:
        raise HubDownloadError(f"downloaded {path} has {kind} {actual}, the hub says {digest}; corrupt or tampered")
    return entry


def download_fineweb(variant="10B", n_train_shards=None, out_dir=None, progress=True):
    """Download the val shard and the first `n_train_shards` train shards of FineWeb `variant`.

    variant: "10B" or "100B". n_train_shards: default per variant (see VARIANTS).
    out_dir: default data/fineweb10B or data/fineweb100B. Returns the local paths
    (val first). Files the folder's manifest lists and that agree with it are kept without
    contacting the hub; any other file is checked against the hub (size and sha256 at the
    pinned commit) and downloaded again when it differs. Raises HubUnreachableError when the
    hub cannot be reached, HubDownloadError when it refuses a file or a file fails its check.
    """
    if variant not in VARIANTS:
        raise ValueError(f"download_fineweb: variant is {variant!r}, expected one of {sorted(VARIANTS)}")
    spec = VARIANTS[variant]
    if n_train_shards is None:
        n_train_shards = spec["default_train_shards"]
    if not isinstance(n_train_shards, int) or not 0 <= n_train_shards <= spec["max_train_shards"]:
        raise ValueError(
            f"download_fineweb: n_train_shards is {n_train_shards!r}, expected an integer in "
            f"[0, {spec['max_train_shards']}] for fineweb{variant}"
        )
    out_dir = os.path.abspath(out_dir or os.path.join(DATA_DIR, spec["dir"]))
    os.makedirs(out_dir, exist_ok=True)
    names = shard_names(n_train_shards)
    paths = [os.path.join(out_dir, n) for n in names]
    manifest = read_manifest(out_dir)
    entries = {}  # what the new manifest lists: files that agree with the old one, then each verified download
    for name, entry in (manifest["files"] if manifest else {}).items():
        path = os.path.join(out_dir, name)
        if os.path.exists(path) and agrees(path, entry) is None:
            entries[name] = entry
    todo = [n for n in names if n not in entries]
    if not todo:
        if progress:
            print(f"all {len(names)} shards of fineweb{variant} already in {out_dir} (listed in its manifest)")
        return paths
    check_hub_reachable(out_dir)
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    recorded = (manifest or {}).get("source") or {}
    try:
        revision = spec["revision"] or (recorded.get("revision") if recorded.get("repo_id") == spec["repo_id"] else None)
        revision = resolve_revision(spec["repo_id"], revision)
        info = hub_file_info(spec["repo_id"], names, revision)
    except HfHubHTTPError as e:
        raise HubDownloadError(f"the hub refused {spec['repo_id']}: {str(e).splitlines()[0]}") from e
    except Exception as e:
        if _is_network_error(e):
            raise HubUnreachableError(_unreachable_message(out_dir, f"{type(e).__name__} while listing files")) from e
        raise
    source = {"repo_id": spec["repo_id"], "revision": revision}
    if recorded.get("revision") not in (None, revision):  # entries recorded at another commit: keep equal files only
        entries = {n: e for n, e in entries.items() if n not in info or info[n][1:] == ("sha256", e["sha256"])}
        todo = [n for n in names if n not in entries]
    for name in tqdm(todo, desc=f"fineweb{variant} shards", unit="file", disable=not progress):
        path = os.path.join(out_dir, name)
        if os.path.exists(path):  # present but not recorded (copied by hand, or interrupted): check it first
            try:
                entries[name] = verify_download(path, info[name])
                write_manifest(out_dir, entries, source=source)
                continue
            except HubDownloadError as e:
                tqdm.write(f"{e}; downloading it again")
                os.remove(path)
        try:
            hf_hub_download(repo_id=spec["repo_id"], filename=name, repo_type=REPO_TYPE, revision=revision,
                            local_dir=out_dir)
        except HfHubHTTPError as e:
            raise HubDownloadError(f"the hub refused {spec['repo_id']}/{name}: {str(e).splitlines()[0]}") from e
        except Exception as e:
            if _is_network_error(e):
                raise HubUnreachableError(_unreachable_message(out_dir, f"{type(e).__name__} while fetching {name}")) from e
            raise
        try:
            entries[name] = verify_download(path, info[name])
        except HubDownloadError:
            os.remove(path)  # never leave a file that failed its check where a glob could find it
            raise
        write_manifest(out_dir, entries, source=source)  # after each file: an interruption keeps the verified ones
    return paths


def main(variant, argv=None):
    """Command line of cached_fineweb{variant}.py."""
    spec = VARIANTS[variant]
    parser = argparse.ArgumentParser(
        description=f"Download pre-tokenized FineWeb{variant} GPT-2 shards ({spec['repo_id']}, "
        f"100M tokens each): the val shard plus the first N train shards.",
    )
    parser.add_argument(
        "n", nargs="?", type=int, default=spec["default_train_shards"],
        help=f"number of train shards (default {spec['default_train_shards']}, at most {spec['max_train_shards']})",
    )
    parser.add_argument(
        "--out-dir", default=os.path.join(DATA_DIR, spec["dir"]),
        help="where the shards go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        paths = download_fineweb(variant, args.n, args.out_dir)
    except (HubUnreachableError, HubDownloadError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"{len(paths)} shards ready in {os.path.dirname(paths[0])}")
