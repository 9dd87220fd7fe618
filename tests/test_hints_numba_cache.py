"""Numba kernels never run stale (hints/numba_cache.py): a kernel cached from one file compiles again
when a module it reads changes. The kernel here is index/results.py's purity_kinds, which inlines
kinds.py's kind_of and its purity edges; the edit is to kinds.py alone, in a copy of hints/, and
nothing is cleared by hand between the runs."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hints.kinds import N_PURITY_BUCKETS, kind_parts

REPO = Path(__file__).resolve().parents[1]
# One n-gram seen 10 times, 4 of them followed by its top token: purity 0.4, in the bucket
# [0.3, 0.5) while the first edge is 3/10, in [0, 0.3) once it is 45/100.
KIND = ("import numpy as np; from hints.index import hints_from_counts; "
        "h = hints_from_counts(np.array([[7]], np.int32), np.array([[10]], np.int32), np.array([[4]], np.int32)); "
        "print('kind', int(h.kind[0, 0]))")
EDGE, MOVED = "PURITY_BUCKET_EDGES = ((3, 10),", "PURITY_BUCKET_EDGES = ((45, 100),"


def kind_in(root, env):
    """(kind, Numba's cache log) of KIND run on the copy of hints/ under root."""
    p = subprocess.run([sys.executable, "-c", KIND], capture_output=True, text=True, timeout=300, cwd=root,
                       env=dict(env, PYTHONPATH=os.pathsep.join([str(root), str(REPO)]), NUMBA_DEBUG_CACHE="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    kind = int(p.stdout.split("kind ")[-1])
    return kind, p.stdout


def purity_kinds_events(log):
    """What Numba's cache did for purity_kinds: 'loaded' and/or 'saved' lines."""
    return {word for line in log.splitlines() if "purity_kinds" in line for word in ("loaded", "saved") if word in line}


@pytest.mark.parametrize("where", ["in-tree", "NUMBA_CACHE_DIR"])
def test_an_edit_to_kinds_reaches_a_kernel_cached_from_another_file(tmp_path, where):
    shutil.copytree(REPO / "hints", tmp_path / "hints", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    if where == "NUMBA_CACHE_DIR":  # the user's own cache folder: the keying holds there too
        env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba-cache")
    kind, log = kind_in(tmp_path, env)
    assert tuple(int(x) for x in kind_parts(kind)[1:]) == (4, 1) and "saved" in purity_kinds_events(log)  # count 9-16, purity .3-.5
    kind, log = kind_in(tmp_path, env)
    assert tuple(int(x) for x in kind_parts(kind)[1:]) == (4, 1) and purity_kinds_events(log) == {"loaded"}  # cached: not compiled again
    kinds_py = tmp_path / "hints" / "kinds.py"
    text = kinds_py.read_text()
    assert text.count(EDGE) == 1
    kinds_py.write_text(text.replace(EDGE, MOVED))
    kind, log = kind_in(tmp_path, env)
    assert tuple(int(x) for x in kind_parts(kind)[1:]) == (4, 0), "the kernel ran on the old purity edge: its cache went stale"
    assert "saved" in purity_kinds_events(log)
    assert N_PURITY_BUCKETS == 6  # the edit moved an edge, not the bucket count
