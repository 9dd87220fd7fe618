"""Download the cached GPT-2 tokens of FineWeb100B (val shard + first N train shards) into data/fineweb100B/.

Usage: python -m data.cached_fineweb100B [N]; see --help.
"""
from data.download import main

if __name__ == "__main__":
    main("100B")
