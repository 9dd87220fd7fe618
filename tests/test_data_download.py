"""Tests for data/download.py and the cached_fineweb scripts, without any network access."""

import hashlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

from data import download
from data.download import HubDownloadError, HubUnreachableError, download_fineweb, shard_names
from data.manifest import read_manifest
from data.shards import read_shard


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


def shard_bytes(tokens):
    """The bytes write_shard makes for `tokens` (what the fake hub serves)."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = 20240520, 1, len(tokens)
    return header.tobytes() + np.asarray(tokens, dtype="<u2").tobytes()


@pytest.fixture
def fake_hub(monkeypatch, online_env):
    """The hub client's two calls, serving `served` {name: bytes} at the pinned 10B commit; the
    code under test (listing, verification, manifest) is the real one."""
    import huggingface_hub
    from huggingface_hub.hf_api import RepoFile

    served, published, fetched = {}, {}, []
    pinned = download.VARIANTS["10B"]["revision"]

    def get_paths_info(self, repo_id, paths, revision=None, repo_type=None, **kw):
        assert repo_id == "kjj0/fineweb10B-gpt2" and repo_type == "dataset" and revision == pinned
        return [RepoFile(path=n, size=len(published.get(n, served[n])), oid="0" * 40,
                         lfs={"size": len(published.get(n, served[n])), "oid": hashlib.sha256(published.get(n, served[n])).hexdigest(),
                              "pointerSize": 134}) for n in paths]

    def hf_hub_download(repo_id, filename, repo_type, revision, local_dir):
        assert repo_id == "kjj0/fineweb10B-gpt2" and repo_type == "dataset" and revision == pinned
        fetched.append(filename)
        with open(os.path.join(local_dir, filename), "wb") as f:
            f.write(served[filename])
        return os.path.join(local_dir, filename)

    monkeypatch.setattr(download, "check_hub_reachable", lambda out_dir: None)
    monkeypatch.setattr(huggingface_hub.HfApi, "get_paths_info", get_paths_info)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    return served, published, fetched


def test_verifies_present_files_and_replaces_broken(tmp_path, fake_hub):
    served, published, fetched = fake_hub
    for i, name in enumerate(shard_names(3)):
        served[name] = shard_bytes(np.arange(10 + i))
        (tmp_path / name).write_bytes(served[name])  # copied by hand: no manifest yet
    (tmp_path / "fineweb_train_000002.bin").write_bytes(served["fineweb_train_000002.bin"][:1030])  # interrupted
    (tmp_path / "fineweb_train_000001.bin").write_bytes(shard_bytes(np.arange(11) + 1))  # right size, wrong bytes
    paths = download_fineweb("10B", 3, tmp_path, progress=False)
    assert sorted(fetched) == ["fineweb_train_000001.bin", "fineweb_train_000002.bin"]  # the val shard checked out
    assert [os.path.basename(p) for p in paths] == shard_names(3)
    assert [len(read_shard(p)) for p in paths] == [10, 11, 12, 13] and read_shard(paths[1])[0] == 0
    m = read_manifest(tmp_path)
    assert sorted(m["files"]) == sorted(shard_names(3)) and m["source"]["revision"] == download.VARIANTS["10B"]["revision"]
    assert m["files"]["fineweb_train_000002.bin"]["sha256"] == hashlib.sha256(served["fineweb_train_000002.bin"]).hexdigest()

    fetched.clear()
    served.clear()  # everything is listed in the manifest: no hub access at all
    download_fineweb("10B", 3, tmp_path, progress=False)
    assert fetched == []


def test_more_shards_into_a_folder_recorded_on_first_read(tmp_path, fake_hub, capsys):
    """modded-nanogpt's own download left shards and no manifest; a run's first read recorded them
    (no sha256); a download of more shards keeps them and adds the new, verified ones."""
    from data.loader import read_tokens
    from data.manifest import RECORDED_ON_READ, main
    served, published, fetched = fake_hub
    for i, name in enumerate(shard_names(2)):
        served[name] = shard_bytes(np.arange(10 + i))
    for name in shard_names(1):
        (tmp_path / name).write_bytes(served[name])
    assert len(read_tokens(str(tmp_path / "fineweb_train_*.bin"))) == 11
    m = read_manifest(tmp_path)
    assert m["source"] == RECORDED_ON_READ and {e["sha256"] for e in m["files"].values()} == {None}
    download_fineweb("10B", 2, tmp_path, progress=False)
    assert fetched == ["fineweb_train_000002.bin"]  # the recorded shards are kept as the manifest lists them
    m = read_manifest(tmp_path)
    assert sorted(m["files"]) == sorted(shard_names(2)) and m["source"]["revision"] == download.VARIANTS["10B"]["revision"]
    assert m["files"]["fineweb_train_000002.bin"]["sha256"] == hashlib.sha256(served["fineweb_train_000002.bin"]).hexdigest()
    capsys.readouterr()
    main([str(tmp_path), "--verify"])
    assert capsys.readouterr().out.strip() == (
        f"{tmp_path}: 3 shards agree with manifest.json; 2 of them with no sha256 recorded (recorded on first read), "
        f"so their sizes, token counts and largest ids only: python -m data.manifest {tmp_path} records hashes")


def test_a_download_that_fails_its_check_is_removed(tmp_path, fake_hub):
    served, published, fetched = fake_hub
    for name in shard_names(1):
        served[name] = shard_bytes(np.arange(10))
    published["fineweb_train_000001.bin"] = shard_bytes(np.arange(10) + 1)  # the hub publishes other bytes
    with pytest.raises(HubDownloadError, match=r"fineweb_train_000001\.bin has sha256 .* the hub says"):
        download_fineweb("10B", 1, tmp_path, progress=False)
    assert not (tmp_path / "fineweb_train_000001.bin").exists()
    assert sorted(read_manifest(tmp_path)["files"]) == ["fineweb_val_000000.bin"]  # only what passed


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="variant"):
        download_fineweb("1T", 1, tmp_path)
    with pytest.raises(ValueError, match=r"n_train_shards is 104, expected an integer in \[0, 103\]"):
        download_fineweb("10B", 104, tmp_path)


@pytest.mark.parametrize("module", ["data.cached_fineweb10B", "data.cached_fineweb100B", "data.fineweb", "data.manifest",
                                    "data.local_corpus"])
def test_cli_help(module):
    p = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "usage:" in p.stdout
