"""Data for the speedrun: token shards, the GPT-2 tokenizer, downloads, corpus builders, loaders.

Modules: `shards` (the .bin shard format), `tokenizer` (GPT-2 via tiktoken, offline),
`download` + `cached_fineweb10B` / `cached_fineweb100B` (pre-tokenized FineWeb from the
Hugging Face hub), `fineweb` (tokenize a Hugging Face dataset into shards), `local_corpus`
(any local text files into train/val shards, for the CPU demo), `manifest` (which shards
form a folder's complete set, and their largest token ids; recorded on the first read of a
folder without one, and readers refuse shards that disagree with it),
`loader` (distributed, deterministic, resumable batches over shards), `packed_loader` (the
record's BOS-aligned packed rows, attention segments and unaligned validation batches).
"""
