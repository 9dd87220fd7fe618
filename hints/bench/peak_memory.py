"""Peak build memory: the growth of a fresh interpreter's peak RSS while it makes an index and adds
tokens to it (`python -m hints bench` and `python -m hints.bench.fresh` check it against the
index + staging + 256 MiB budget of docs/design.md)."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from ..index import Geometry, HintIndex

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # above hints/bench/


def _peak_rss():
    """This process's peak resident memory (VmHWM: unlike ru_maxrss, not inherited from a parent)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("VmHWM not found in /proc/self/status")


def _memory_child(geom_json, tokens_path, workers, prefault=None):
    """Run in a fresh interpreter: peak RSS growth of building an index, as JSON on stdout."""
    geom = Geometry(**json.loads(geom_json))
    tokens = np.load(tokens_path)
    HintIndex(Geometry(2, 4, 8, geom.lengths)).add(tokens[:1000])  # load kernels before the baseline
    before = _peak_rss()
    idx = HintIndex(geom, workers=workers, prefault=prefault)
    idx.add(tokens)
    print(json.dumps(dict(peak_increase=_peak_rss() - before, index_bytes=geom.nbytes, staging_bytes=idx.staging_bytes())))


def measure_memory(geom, tokens, workers, prefault=None):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tokens.npy")
        np.save(path, tokens)
        code = (f"from hints.bench.peak_memory import _memory_child; "
                f"_memory_child({json.dumps(geom.to_dict())!r}, {path!r}, {int(workers)}, {prefault!r})")
        env = dict(os.environ, PYTHONPATH=REPO_ROOT)  # this checkout's hints, installed or not
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])
