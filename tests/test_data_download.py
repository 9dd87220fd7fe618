"""Tests for data/download.py and the cached_fineweb scripts, without any network access."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

from data import download
from data.download import HubUnreachableError, download_fineweb, shard_names
from data.shards import read_shard, write_shard


@pytest.fixture
def online_env(monkeypatch):
    """Offline mode off, so the code under test goes as far as the (patched) network."""
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)


def test_shard_names():
    assert shard_names(2) == ["fineweb_val_000000.bin", "fineweb_train_000001.bin", "fineweb_train_000002.bin"]


@pytest.mark.parametrize("module", ["data.cached_fineweb10B", "data.cached_fineweb100B"])
def test_script_offline_gives_clear_error(tmp_path, module):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    p = subprocess.run([sys.executable, "-m", module, "1", "--out-dir", str(tmp_path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "could not reach the Hugging Face hub" in lines[0] and str(tmp_path) in lines[0]
    assert "Traceback" not in p.stderr


def test_module_offline_in_process(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubUnreachableError, match="HF_HUB_OFFLINE"):
        download_fineweb("10B", 1, tmp_path, progress=False)


def test_unreachable_host_fails_fast(tmp_path, monkeypatch, online_env):
    def refuse(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "create_connection", refuse)
    with pytest.raises(HubUnreachableError, match="could not reach the Hugging Face hub"):
        download_fineweb("100B", 1, tmp_path, progress=False)


def test_connection_error_during_download(tmp_path, monkeypatch, online_env):
    import huggingface_hub

    monkeypatch.setattr(download, "check_hub_reachable", lambda out_dir: None)

    def broken(**kwargs):
        raise ConnectionError("connection reset")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", broken)
    with pytest.raises(HubUnreachableError, match=str(tmp_path)):
        download_fineweb("10B", 1, tmp_path, progress=False)


def test_skips_complete_and_replaces_broken(tmp_path, monkeypatch, online_env):
    import huggingface_hub

    for name in shard_names(3):
        write_shard(tmp_path / name, np.arange(10))
    with open(tmp_path / "fineweb_train_000002.bin", "r+b") as f:
        f.truncate(1030)  # incomplete download
    fetched = []

    def fake_download(repo_id, filename, repo_type, local_dir):
        assert repo_id == "kjj0/fineweb10B-gpt2" and repo_type == "dataset"
        fetched.append(filename)
        write_shard(os.path.join(local_dir, filename), np.arange(20))
        return os.path.join(local_dir, filename)

    monkeypatch.setattr(download, "check_hub_reachable", lambda out_dir: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    paths = download_fineweb("10B", 3, tmp_path, progress=False)
    assert fetched == ["fineweb_train_000002.bin"]
    assert [os.path.basename(p) for p in paths] == shard_names(3)
    assert len(read_shard(paths[2])) == 20 and len(read_shard(paths[1])) == 10

    fetched.clear()
    download_fineweb("10B", 3, tmp_path, progress=False)  # everything complete: no hub access at all
    assert fetched == []


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="variant"):
        download_fineweb("1T", 1, tmp_path)
    with pytest.raises(ValueError, match=r"n_train_shards is 104, expected an integer in \[0, 103\]"):
        download_fineweb("10B", 104, tmp_path)


@pytest.mark.parametrize("module", ["data.cached_fineweb10B", "data.cached_fineweb100B", "data.fineweb",
                                    "data.local_corpus"])
def test_cli_help(module):
    p = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "usage:" in p.stdout
