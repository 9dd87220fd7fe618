"""Download the cached GPT-2 tokens of FineWeb100B (val shard + first N train shards) into data/fineweb100B/.

Usage: python data/cached_fineweb100B.py [N]   (or python -m data.cached_fineweb100B [N]); see --help.
"""

import os
import sys

if __package__ in (None, ""):  # run as a script: import from the repo root, not from data/
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from data.download import main  # noqa: E402

if __name__ == "__main__":
    main("100B")
