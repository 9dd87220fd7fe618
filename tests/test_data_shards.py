"""Tests for data/shards.py: round trips, header validation, refused inputs, listing."""

import os

import numpy as np
import pytest

from data.shards import (
    HEADER_BYTES, MAGIC, VERSION, ShardWriter, is_complete_shard, list_shards,
    read_header, read_shard, shard_token_count, write_shard,
)


def _header(path):
    with open(path, "rb") as f:
        return np.frombuffer(f.read(HEADER_BYTES), dtype="<i4").copy()


def _patch_header(path, index, value):
    h = _header(path)
    h[index] = value
    with open(path, "r+b") as f:
        f.write(h.tobytes())


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64, np.uint64])
def test_round_trip(tmp_path, dtype):
    tokens = np.array([0, 1, 50256, 65535, 7], dtype=dtype)
    path = tmp_path / "a.bin"
    assert write_shard(path, tokens) == str(path)
    out = read_shard(path)
    assert out.dtype == np.uint16 and out.shape == (5,)
    np.testing.assert_array_equal(out, tokens.astype(np.uint16))
    assert not out.flags.writeable
    assert shard_token_count(path) == 5
    h = _header(path)
    assert (h[0], h[1], h[2]) == (MAGIC, VERSION, 5) and not h[3:].any()
    assert os.path.getsize(path) == HEADER_BYTES + 2 * 5
    assert not [p for p in os.listdir(tmp_path) if p != "a.bin"]  # no temp file left behind


def test_round_trip_list_and_empty(tmp_path):
    write_shard(tmp_path / "l.bin", [3, 2, 1])
    np.testing.assert_array_equal(read_shard(tmp_path / "l.bin"), [3, 2, 1])
    write_shard(tmp_path / "e.bin", [])
    assert read_shard(tmp_path / "e.bin").shape == (0,)
    assert shard_token_count(tmp_path / "e.bin") == 0


def test_write_creates_parent_dirs_and_overwrites(tmp_path):
    path = tmp_path / "x" / "y" / "s.bin"
    write_shard(path, np.arange(10))
    write_shard(path, np.arange(3))
    np.testing.assert_array_equal(read_shard(path), [0, 1, 2])


@pytest.mark.parametrize("tokens, words", [
    (np.array([0, 65536]), "[0, 65535]"),
    (np.array([-1, 5]), "[0, 65535]"),
    (np.array([1.0, 2.0]), "integer dtype"),
    (np.array([True, False]), "integer dtype"),
    (np.zeros((2, 3), dtype=np.int64), "1-D"),
])
def test_write_refuses_bad_tokens(tmp_path, tokens, words):
    path = tmp_path / "bad.bin"
    with pytest.raises(ValueError, match="tokens") as e:
        write_shard(path, tokens)
    assert words in str(e.value) and str(path) in str(e.value)
    assert not os.listdir(tmp_path)


def test_bad_magic(tmp_path):
    path = tmp_path / "m.bin"
    write_shard(path, np.arange(4))
    _patch_header(path, 0, 123)
    with pytest.raises(ValueError, match=r"magic is 123, expected 20240520") as e:
        read_shard(path)
    assert str(path) in str(e.value)
    assert not is_complete_shard(path)


def test_bad_version(tmp_path):
    path = tmp_path / "v.bin"
    write_shard(path, np.arange(4))
    _patch_header(path, 1, 2)
    with pytest.raises(ValueError, match=r"version is 2, expected 1"):
        shard_token_count(path)


def test_negative_count(tmp_path):
    path = tmp_path / "n.bin"
    write_shard(path, np.arange(4))
    _patch_header(path, 2, -5)
    with pytest.raises(ValueError, match=r"token count is -5"):
        read_shard(path)


def test_count_larger_than_file(tmp_path):
    path = tmp_path / "c.bin"
    write_shard(path, np.arange(4))
    _patch_header(path, 2, 5)
    with pytest.raises(ValueError, match=r"token count is 5.*truncated"):
        read_shard(path)


def test_truncated_tokens(tmp_path):
    path = tmp_path / "t.bin"
    write_shard(path, np.arange(100))
    with open(path, "r+b") as f:
        f.truncate(HEADER_BYTES + 150)
    with pytest.raises(ValueError, match=r"should be 1224 bytes, but it is 1174 bytes \(truncated\)") as e:
        read_shard(path)
    assert str(path) in str(e.value)
    assert not is_complete_shard(path)


def test_truncated_header(tmp_path):
    path = tmp_path / "h.bin"
    path.write_bytes(b"\0" * 100)
    with pytest.raises(ValueError, match=r"shorter than the 1024-byte header"):
        read_header(path)


def test_too_long(tmp_path):
    path = tmp_path / "l.bin"
    write_shard(path, np.arange(4))
    with open(path, "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(ValueError, match=r"too long"):
        read_shard(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_shard(tmp_path / "nope.bin")
    assert not is_complete_shard(tmp_path / "nope.bin")


def test_list_shards(tmp_path):
    for name in ["b_000002.bin", "b_000000.bin", "b_000001.bin", "other.txt"]:
        write_shard(tmp_path / name, [1])
    pattern = str(tmp_path / "b_*.bin")
    assert [os.path.basename(p) for p in list_shards(pattern)] == ["b_000000.bin", "b_000001.bin", "b_000002.bin"]
    both = list_shards([str(tmp_path / "b_000002.bin"), str(tmp_path / "b_00000[01].bin")])
    assert both == list_shards(pattern)
    with pytest.raises(FileNotFoundError, match="nothing_"):
        list_shards(str(tmp_path / "nothing_*.bin"))


def test_shard_writer(tmp_path):
    w = ShardWriter(lambda i: str(tmp_path / f"s_{i:06d}.bin"), shard_tokens=10, max_tokens=25)
    assert w.add(np.arange(7)) == 7
    assert w.add(np.arange(100, 115)) == 15
    assert w.add(np.arange(200, 210)) == 3 and w.full
    w.close()
    assert w.counts == [10, 10, 5] and w.total == 25
    got = np.concatenate([read_shard(p) for p in w.paths])
    want = np.concatenate([np.arange(7), np.arange(100, 115), np.arange(200, 203)])
    np.testing.assert_array_equal(got, want)
