"""scripts/hints_ab.py, the in-process A/B of the index's kernels: copies of hints/ at a git
revision, paired ratios, and a lookup A/B run end to end (the variants here are the checkout's
own package twice, so nothing is compiled again)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hints
from streams import phrase_stream

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("hints_ab", REPO / "scripts" / "hints_ab.py")
hints_ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hints_ab)


def in_git_checkout():
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True).returncode == 0


def git(*args):
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=True).stdout


@pytest.mark.skipif(not in_git_checkout(), reason="needs the repo's git history")
def test_copies_of_a_revision_hold_its_hints_package(tmp_path):
    # the revision before hints/ last changed: a copy of the checkout's package would differ from it
    rev = git("log", "-1", "--format=%H", "--", "hints/").decode().strip() + "~1"
    assert git("rev-parse", f"{rev}:hints") != git("rev-parse", "HEAD:hints")
    folder, names = hints_ab.materialize(rev, 2, root=tmp_path)
    assert len(set(names)) == 2
    files = git("ls-tree", "-r", "--name-only", rev, "hints/").decode().split()  # sub-packages too
    assert "hints/__init__.py" in files
    for name in names:
        for f in files:
            assert (folder / name / Path(f).relative_to("hints")).read_bytes() == git("show", f"{rev}:{f}"), (name, f)
    copy = hints_ab.import_copy(folder, names[1])  # its own package, not the checkout's
    assert copy.__name__ == names[1] and Path(copy.__file__).parent == folder / names[1]
    assert copy.HintIndex is not hints.HintIndex
    assert Path(sys.modules[copy.HintIndex.__module__].__file__).is_relative_to(folder / names[1])
    stamp = (folder / names[0] / "__init__.py").stat().st_mtime_ns
    assert hints_ab.materialize(rev, 2, root=tmp_path) == (folder, names)  # kept, not made again
    assert (folder / names[0] / "__init__.py").stat().st_mtime_ns == stamp
    held = sorted(str(p.relative_to(folder / names[0])) for p in (folder / names[0]).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)
    assert held == sorted(str(Path(f).relative_to("hints")) for f in files)
    with pytest.raises(SystemExit, match="no-such-revision"):
        hints_ab.materialize("no-such-revision", 2, root=tmp_path)


@pytest.mark.skipif(not in_git_checkout(), reason="needs the repo's git history")
def test_target_ab_finds_the_ceiling_kernel_before_and_after_the_wings(tmp_path, monkeypatch):
    """scripts/target_ab.py times hash_rounds of the checkout and of an --against revision: in
    hints.bench.limits now, in the flat hints/bench.py of the revisions before hints/ had wings."""
    monkeypatch.setitem(sys.modules, "hints_ab", hints_ab)  # target_ab imports it from beside itself
    spec = importlib.util.spec_from_file_location("target_ab", REPO / "scripts" / "target_ab.py")
    target_ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(target_ab)
    assert target_ab.limits_module(hints).__name__ == "hints.bench.limits"
    flat = git("log", "-1", "--format=%H", "--", "hints/bench.py").decode().strip() + "~1"  # bench.py's last
    folder, names = hints_ab.materialize(flat, 1, root=tmp_path)
    old = target_ab.limits_module(hints_ab.import_copy(folder, names[0]))
    assert old.__name__ == f"{names[0]}.bench" and Path(old.__file__) == folder / names[0] / "bench.py"
    for bench in (target_ab.limits_module(hints), old):
        assert callable(bench.hash_rounds) and bench.HASH_BLOCK == 256
    # the buffers it hands each hash_rounds hold what that revision writes: nothing past them changes
    # (the checkout's block scratch grew with the one-multiply hash; the old size overran it)
    geom = hints.Geometry.for_tokens(10_000)
    ix = hints.HintIndex(geom)
    s = phrase_stream(3, 4096, 40, 20, 500)
    for bench in (target_ab.limits_module(hints), old):
        bufs = target_ab.hash_buffers(bench, geom)
        guarded = [np.full(b.size + 1024, 0xA5A5A5A5A5A5A5A5, np.uint64) for b in bufs]
        bench.hash_rounds(s, 1, ix._lengths, ix._pows, geom.partition_bits, ix._bits, ix._shifts,
                          *[g[:b.size] for g, b in zip(guarded, bufs)])
        assert all((g[b.size:] == 0xA5A5A5A5A5A5A5A5).all() for g, b in zip(guarded, bufs)), bench.__name__


def test_paired_ratios():
    p = hints_ab.paired([2.0, 4.0, 9.0], [1.0, 2.0, 3.0])
    assert p["n"] == 3 and p["median"] == 2.0 and p["q1"] == 2.0 and p["q3"] == 2.5
    assert p["geomean"] == pytest.approx((2 * 2 * 3) ** (1 / 3))
    assert hints_ab.paired([1.0, 1.0], [1.0, 1.0])["two_se"] == 0.0


def test_lookup_ab_runs_and_reports_every_variant(capsys):
    train = phrase_stream(7, 60_000, 40, 20, 500)
    query = phrase_stream(8, 2 * hints_ab.LOOKUP_BLOCK, 40, 20, 500)
    args = hints_ab.parse_args(["--against", "HEAD", "--rounds", "1"])
    hints_ab.lookup([hints, hints], ["a", "b"], train, query, args)
    out = capsys.readouterr().out
    assert "sealed" in out and "scan" in out and "identical hints" in out
    assert out.count("vs a: median") == 2  # one ratio line per kind of index
    # the whole query in one lookup, on 2 workers
    args = hints_ab.parse_args(["--against", "HEAD", "--rounds", "1", "--block", "0", "--workers", "2"])
    hints_ab.lookup([hints, hints], ["a", "b"], train, query, args)
    out = capsys.readouterr().out
    assert f"1 block(s) of {query.size:,}, 2 worker(s)" in out and out.count("vs a: median") == 2
