"""Download pre-tokenized FineWeb GPT-2 shards (the modded-nanogpt cached sets) from the
Hugging Face hub; the logic behind `cached_fineweb10B.py` and `cached_fineweb100B.py`.

Files already present and complete (valid header and size) are kept. When the hub cannot
be reached, `HubUnreachableError` says so and how to proceed: copy the shards by hand.
"""

import argparse
import os
import socket
import sys
from urllib.parse import urlsplit

from tqdm import tqdm

from data.shards import is_complete_shard

DATA_DIR = os.path.dirname(os.path.abspath(__file__))

# The cached GPT-2 tokenizations of FineWeb used by modded-nanogpt's cached_fineweb*.py:
# 100M tokens per shard; fineweb10B has 103 train shards, fineweb100B has 1030.
VARIANTS = {
    "10B": {
        "repo_id": "kjj0/fineweb10B-gpt2",
        "dir": "fineweb10B",
        "max_train_shards": 103,
        "default_train_shards": 8,  # 800M tokens: more than a record run trains on
    },
    "100B": {
        "repo_id": "kjj0/fineweb100B-gpt2",
        "dir": "fineweb100B",
        "max_train_shards": 1030,
        "default_train_shards": 370,  # 37B tokens: the record's largest hint corpus
    },
}
REPO_TYPE = "dataset"
VAL_FILE = "fineweb_val_000000.bin"  # the FineWeb val shard: 100M tokens, the speedrun scores its first 10,485,760
TRAIN_FILE = "fineweb_train_{:06d}.bin"  # train shards are numbered from 000001
CONNECT_TIMEOUT_S = 5.0  # reachability probe; without it an offline hub costs ~30 s of retries


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
        f"({VAL_FILE}, {TRAIN_FILE.format(1)}, ...) into {out_dir} and rerun (complete files there are kept)"
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


def download_fineweb(variant="10B", n_train_shards=None, out_dir=None, progress=True):
    """Download the val shard and the first `n_train_shards` train shards of FineWeb `variant`.

    variant: "10B" or "100B". n_train_shards: default per variant (see VARIANTS).
    out_dir: default data/fineweb10B or data/fineweb100B. Returns the local paths
    (val first). Complete files already in `out_dir` are not downloaded again; a broken
    one is replaced. Raises HubUnreachableError when the hub cannot be reached.
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
    missing = [(n, p) for n, p in zip(names, paths) if not is_complete_shard(p)]
    if not missing:
        if progress:
            print(f"all {len(names)} shards of fineweb{variant} already in {out_dir}")
        return paths
    check_hub_reachable(out_dir)
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    for name, path in tqdm(missing, desc=f"fineweb{variant} shards", unit="file", disable=not progress):
        if os.path.exists(path):
            tqdm.write(f"{path} is incomplete or corrupt; downloading it again")
            os.remove(path)
        try:
            hf_hub_download(repo_id=spec["repo_id"], filename=name, repo_type=REPO_TYPE, local_dir=out_dir)
        except HfHubHTTPError as e:
            raise HubDownloadError(f"the hub refused {spec['repo_id']}/{name}: {str(e).splitlines()[0]}") from e
        except Exception as e:
            if _is_network_error(e):
                raise HubUnreachableError(_unreachable_message(out_dir, f"{type(e).__name__} while fetching {name}")) from e
            raise
        if not is_complete_shard(path):
            raise HubDownloadError(f"downloaded {path} is not a complete shard (bad header or size)")
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
    except (HubUnreachableError, HubDownloadError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"{len(paths)} shards ready in {os.path.dirname(paths[0])}")
