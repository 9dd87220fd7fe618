"""scripts/profile_kernels.py: samples are named by the kernel whose entry is nearest below them,
in the dumped code, which reads back as instructions; the build figures run (perf itself is
needed for none of it)."""
import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("profile_kernels", REPO / "scripts" / "profile_kernels.py")
profile_kernels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile_kernels)


def test_samples_go_to_the_nearest_entry_below_them_in_their_region():
    regions = [(0x1000, 0x2000), (0x8000, 0x9000)]
    entries = [(0x1100, "build.stage1"), (0x1800, "build.stage2"), (0x8000, "lookup.scan"), (0x5000, "elsewhere")]
    ips = [0x1100, 0x17ff, 0x1800, 0x1fff, 0x1050, 0x8000, 0x8abc, 0x5000, 0x9000, 0x17ff]
    per_kernel, per_ip, owners, outside = profile_kernels.attribute(ips, entries, regions)
    assert per_kernel == {"build.stage1": 3, "build.stage2": 2, "lookup.scan": 2}
    # before the region's first entry (0x1050), in no dumped region (0x5000, 0x9000): outside
    assert outside == 3 and sum(per_kernel.values()) + outside == len(ips)
    assert per_ip[0x17ff] == 2 and owners[0x17ff] == "build.stage1" and owners[0x8abc] == "lookup.scan"
    assert 0x1050 not in per_ip


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")
def test_disassembly_reads_addresses_at_the_mapped_start(tmp_path):
    code = bytes([0x48, 0x89, 0xd8, 0x48, 0xff, 0xc0, 0xc3])  # mov %rbx,%rax; inc %rax; ret
    path = tmp_path / "code.bin"
    path.write_bytes(code)
    got = profile_kernels.disassemble(path, 0x7f0000001000)
    assert sorted(got) == [0x7f0000001000, 0x7f0000001003, 0x7f0000001006]
    assert got[0x7f0000001000].startswith("mov") and got[0x7f0000001003].startswith("inc")


def test_build_figures_run_on_a_stream(tmp_path):
    from data.shards import write_shard
    from hints.index import Geometry
    tokens = np.random.default_rng(0).integers(0, 50_000, 200_000).astype(np.uint16)
    write_shard(tmp_path / "t_000.bin", tokens)
    for figure in ("build", "build-many"):
        idx = profile_kernels.figure_work(figure, str(tmp_path / "t_*.bin"))()
        assert idx.tokens_added == tokens.size
        assert idx.geom.partition_bits == (14 if figure == "build-many" else Geometry.for_tokens(tokens.size).partition_bits)


def test_bad_tokens_end_in_one_line_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        profile_kernels.main(["--figure", "build", "--tokens", str(tmp_path / "nope_*.bin")])
    assert str(e.value).startswith("profile_kernels: argument --tokens: ") and "nope_*.bin" in str(e.value)
    assert "\n" not in str(e.value)
