"""Download the cached GPT-2 tokens of FineWeb10B (val shard + first N train shards) into data/fineweb10B/.

Usage: python -m data.cached_fineweb10B [N]; see --help.
"""
from data.download import main

if __name__ == "__main__":
    main("10B")
