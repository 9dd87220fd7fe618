"""train/plan.py: the record's background index sized to a node. The article's node gets the
article's plan; smaller nodes get halved plans that fit; caps, overrides, refusals, the
staging formula against the real HintIndex, and this machine's facts."""
import json
import os

import numpy as np
import pytest

from data.shards import write_shard
from hints import Geometry, HintIndex
from train.plan import (ARTICLE_LOAD, BUILD_BUDGET_S, BUILD_TOKENS_PER_CORE_S, MAX_MEMORY_FRACTION, MIN_HINT_TOKENS,
                        PlanError, index_file_bytes, main, node_facts, parse_size, plan_record, staging_bytes)

TiB, GiB = 1 << 40, 1 << 30
B37 = 37_000_000_000
ARTICLE = Geometry(14, 14, 176, (6, 10, 20))


def node(ram, cores=224, tokens=B37, shm=None, **kw):
    return plan_record(node_ram_bytes=ram, node_cores=cores, node_tokens=tokens,
                       shm_bytes=ram // 2 if shm is None else shm, **kw)


def assert_fits(p, ram, shm):
    assert p.memory_bytes <= MAX_MEMORY_FRACTION * ram
    assert p.memory_bytes >= p.index_bytes + p.staging_bytes + p.n_ranks * p.rank_bytes
    assert p.index_bytes == index_file_bytes(p.geometry) <= shm
    assert p.hint_tokens <= ARTICLE_LOAD * p.geometry.n_slots + 1  # no fuller than the article's table


def test_article_node_gets_the_article_plan():
    p = node(2 * TiB, 224, B37, shm=TiB)
    assert p.hint_tokens == B37 and p.geometry == ARTICLE and p.halvings == 0
    assert p.table_bytes == 352 * GiB and p.builder_cores == 224 - 8 * 3
    assert p.shm_path == "/dev/shm" and p.notes == []
    assert p.reason.startswith("352.0 GiB table + ") and "37B tokens on 200 builder threads, one per free core" in p.reason
    d = json.loads(p.to_json())
    assert d["geometry"] == dict(partition_bits=14, bucket_bits=14, slots=176, lengths=[6, 10, 20])
    for key in ("hint_tokens", "table_bytes", "staging_bytes", "builder_cores", "reason", "shm_path"):
        assert key in d, key
    assert_fits(p, 2 * TiB, TiB)


def test_256_gib_node_gets_a_halved_plan_that_fits():
    p = node(256 * GiB, 224, B37)  # /dev/shm: the tmpfs default, half of RAM
    assert_fits(p, 256 * GiB, 128 * GiB)
    assert p.halvings >= 1 and p.hint_tokens == B37 >> p.halvings
    assert p.geometry.slots == 176 and p.geometry.bucket_bits == 14 and p.geometry.partition_bits == 14 - p.halvings
    assert "halved" in p.reason and all(n.startswith("halved: ") for n in p.notes)
    with pytest.raises(PlanError):  # the next size up would not fit: the plan is the largest
        node(256 * GiB, 224, B37, requested_tokens=2 * p.hint_tokens)


def test_too_few_tokens_on_disk_caps_the_corpus():
    p = node(2 * TiB, 224, tokens=5_000_000_000, shm=TiB)
    assert p.hint_tokens == 5_000_000_000 and p.fetch_tokens == 0
    assert p.geometry == Geometry(12, 14, 176, (6, 10, 20))  # the article's table halved twice: 9.25B > 5B > 4.6B
    assert any("capped" in n for n in p.notes)
    # with free disk the rest of the dataset can be fetched: the plan says how much
    q = node(2 * TiB, 224, tokens=5_000_000_000, shm=TiB, disk_bytes=100 * GiB, fetchable_tokens=98_000_000_000)
    assert 5_000_000_000 < q.hint_tokens < 5_000_000_000 + 100 * GiB // 2
    assert q.fetch_tokens == q.hint_tokens - 5_000_000_000 and "fetch" in q.reason


def test_small_dev_shm_gives_a_smaller_plan_or_the_given_directory():
    p = node(2 * TiB, 224, B37, shm=200 * GiB)
    assert p.hint_tokens == B37 // 2 and p.shm_path == "/dev/shm"
    assert_fits(p, 2 * TiB, 200 * GiB)
    assert "does not fit: /dev/shm has 200.0 GiB free" in p.notes[0]
    q = node(2 * TiB, 224, B37, shm=200 * GiB, shm_dirs=[("/dev/shm", 200 * GiB), ("/mnt/big", TiB)])
    assert q.hint_tokens == B37 and q.geometry == ARTICLE and q.shm_path == "/mnt/big"
    assert "index in /mnt/big" in q.reason and any("/dev/shm has 200.0 GiB free" in n for n in q.notes)


def test_overrides_are_respected():
    p = node(2 * TiB, 224, B37, shm=TiB, requested_tokens=1_200_000_000)
    assert p.hint_tokens == 1_200_000_000 and p.geometry.partition_bits == 10  # 37B / 32 = 1.16B < 1.2B: 2^10 partitions
    g = node(2 * TiB, 224, B37, shm=TiB, requested_geometry="12,14,176")
    assert g.geometry == Geometry(12, 14, 176, (6, 10, 20))
    assert g.hint_tokens == int(ARTICLE_LOAD * g.geometry.n_slots)  # as many tokens as it holds at the article's load
    both = node(2 * TiB, 224, B37, shm=TiB, requested_tokens=3_000_000_000, requested_geometry="13,14,176",
                lengths=(4, 6, 10, 20))
    assert both.hint_tokens == 3_000_000_000 and both.geometry == Geometry(13, 14, 176, (4, 6, 10, 20))
    # a user's token count is kept even over the build-time budget, with a note
    slow = node(2 * TiB, 40, B37, shm=TiB, requested_tokens=B37)
    assert slow.hint_tokens == B37 and any("over the" in n for n in slow.notes)


def test_too_large_requests_are_refused_naming_the_flag():
    with pytest.raises(PlanError, match="--hint-geometry.*does not fit this node's memory"):
        node(256 * GiB, 224, B37, requested_geometry="record")
    with pytest.raises(PlanError, match="--hint-tokens.*does not fit this node's memory"):
        node(256 * GiB, 224, B37, requested_tokens=B37)
    with pytest.raises(PlanError, match="--hint-geometry.*index file does not fit.*--hint-shm-dir"):
        node(2 * TiB, 224, B37, shm=100 * GiB, requested_geometry="record")


def test_few_free_cores_halve_to_the_build_budget():
    p = node(2 * TiB, 8 * 3 + 2, B37, shm=TiB)  # 2 cores left by 8 ranks
    assert p.builder_cores == 2
    assert p.hint_tokens / (2 * BUILD_TOKENS_PER_CORE_S) <= BUILD_BUDGET_S < 2 * p.hint_tokens / (2 * BUILD_TOKENS_PER_CORE_S)
    one = node(2 * TiB, 4, B37, shm=TiB, n_ranks=2)  # no free core: the builder shares them all
    assert one.builder_cores == 4 and any("no free core" in n for n in one.notes)


def test_a_node_too_small_for_any_index_says_so():
    p = node(10 * GiB, 8, B37, n_ranks=1)
    assert p.hint_tokens == 0 and p.table_bytes == 0
    assert "no background index" in p.reason and f"{MIN_HINT_TOKENS // 10**6}M" in p.reason
    off = node(2 * TiB, 224, B37, shm=TiB, requested_tokens=0)
    assert off.hint_tokens == 0 and off.reason == "no background index: --hint-tokens 0"


@pytest.mark.parametrize("workers,tokens", [(1, 5_000), (2, 70_000), (3, 1 << 22)])
def test_staging_formula_matches_the_index(workers, tokens):
    for geom in (Geometry(4, 8, 16), Geometry(6, 10, 176, (4, 6, 10, 20))):
        idx = HintIndex(geom, workers=workers).reserve(tokens)
        assert staging_bytes(geom, workers, tokens) == idx.staging_bytes()


def test_sizes_parse_binary_and_decimal_and_name_the_flag():
    assert parse_size("2TiB") == 2 * TiB == parse_size("2T") == parse_size(" 2 tib ")
    assert parse_size("256GiB") == 256 * GiB and parse_size("1.5G") == 3 * GiB // 2
    assert parse_size("2TB") == 2 * 10**12 and parse_size("4096") == 4096
    with pytest.raises(ValueError, match="--node-ram '2 lots'"):
        parse_size("2 lots", "--node-ram")


def test_node_facts_read_this_machine(tmp_path):
    write_shard(tmp_path / "t_000000.bin", np.arange(1000, dtype=np.uint16))
    write_shard(tmp_path / "t_000001.bin", np.arange(234, dtype=np.uint16))
    f = node_facts(str(tmp_path / "t_*.bin"), shm_dirs=(str(tmp_path),), dataset_tokens=10_000)
    assert f["node_tokens"] == 1234 and f["fetchable_tokens"] == 10_000 - 1234
    assert f["node_cores"] == len(os.sched_getaffinity(0)) and f["node_ram_bytes"] > 0
    assert f["shm_dirs"][0][0] == str(tmp_path) and f["shm_bytes"] > 0 and f["disk_bytes"] > 0


def test_cli_plans_another_node(capsys):
    assert main(["--node-ram", "2TiB", "--node-cores", "224", "--node-tokens", "37B"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["hint_tokens"] == B37 and d["geometry"]["partition_bits"] == 14 and d["n_ranks"] == 8
    assert d["builder_cores"] == 224 - 8 * 2  # another node is the article's: 2 threads a core, 2 cores a rank
    assert main(["--node-ram", "2TiB", "--node-cores", "224", "--node-threads-per-core", "1", "--node-tokens", "37B"]) == 0
    assert json.loads(capsys.readouterr().out)["builder_cores"] == 224 - 8 * 3
    assert main(["--node-ram", "256GiB", "--node-cores", "224", "--node-tokens", "37B", "--hint-geometry", "record"]) == 2
    assert "--hint-geometry" in capsys.readouterr().err


@pytest.mark.parametrize("threads_per_core", [1, 2, 3])
def test_builder_threads_are_what_the_placement_leaves(threads_per_core):
    """The plan's builder gets the physical cores train/placement.py leaves the builder (each
    rank's 1 + hint_workers threads take whole physical cores), one worker thread per core."""
    from train.placement import plan_placement, synthetic_topology
    from train.plan import RECORD_HINT_WORKERS
    topo = synthetic_topology(2, 56, threads_per_core)
    placed = plan_placement(topo, [rank // 4 for rank in range(8)], 1 + RECORD_HINT_WORKERS)
    p = node(2 * TiB, len(topo.cores), B37, shm=TiB, threads_per_core=threads_per_core)
    assert p.builder_cores * threads_per_core == len(placed.builder_cpus) and p.builder_threads == p.builder_cores
    with pytest.raises(PlanError, match="--node-threads-per-core"):
        node(2 * TiB, 224, B37, shm=TiB, threads_per_core=0)


def test_bench_times_the_record_step_on_the_records_threads():
    """`hints bench --record-step` times a rank's hint work on as many threads as the record
    preset gives it (hints/ imports nothing from train/, so the number is written twice)."""
    from hints.bench import RECORD_THREADS
    from train.plan import RECORD_HINT_WORKERS
    assert RECORD_THREADS == RECORD_HINT_WORKERS


def test_the_record_node_gets_the_articles_scale_and_fits(capsys):
    """The article's node (1575 GiB, 64 cores x 2 threads, 35B tokens on disk): its 352 GiB table,
    35B tokens, 48 builder threads (8 ranks keep 2 cores each for their 3 threads). No rate of this
    repo's builder is recorded for its CPU class (hints/index/build_rates.json holds only rates `hints bench
    --save-rate` measured), so the plan counts on the design floor and says the index would be ready
    after the last step; at the article's builder rate (--build-rate) it would be ready at ~6.4 s."""
    from train.plan import ARTICLE_TRAIN_S, BUILDER_START_S
    assert main(["--node-ram", "1575GiB", "--node-cores", "64", "--node-threads-per-core", "2",
                 "--node-tokens", "35B"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["hint_tokens"] == 35_000_000_000 and d["table_bytes"] == 352 * GiB and d["halvings"] == 0
    assert d["geometry"] == dict(partition_bits=14, bucket_bits=14, slots=176, lengths=[6, 10, 20])
    assert d["builder_threads"] == 48 and d["node"]["rank_cores_kept"] == 16
    assert d["memory_bytes"] <= d["budget_bytes"] <= MAX_MEMORY_FRACTION * 1575 * GiB
    assert d["build_rate"] == BUILD_TOKENS_PER_CORE_S and d["build_rate_source"].startswith("the design floor")
    assert d["ready_s"] == pytest.approx(BUILDER_START_S + 35e9 / (48 * BUILD_TOKENS_PER_CORE_S))
    assert d["train_seconds"] == ARTICLE_TRAIN_S and d["ready_before_last_step"] is False
    assert "AFTER the last step" in d["reason"]
    # the article's builder: 35B tokens in 6.36 s on 48 threads
    assert main(["--node-ram", "1575GiB", "--node-cores", "64", "--node-tokens", "35B", "--build-rate", "114.6M"]) == 0
    g = json.loads(capsys.readouterr().out)
    assert g["build_rate"] == 114.6e6 and g["build_rate_source"] == "given with --build-rate"
    assert 6.3 < g["ready_s"] < 6.6 and g["ready_before_last_step"] is True and "before the last step" in g["reason"]


def test_rates_file_round_trips_and_refuses_bad_entries(tmp_path):
    from hints.index import load_rates, save_rate
    path = tmp_path / "rates.json"
    assert load_rates(path) == {}
    save_rate("CPU X", 1.5e8, "bench on CPU X", path)
    assert load_rates(path) == {"CPU X": {"tokens_per_s_per_core": 1.5e8, "source": "bench on CPU X"}}
    path.write_text('{"CPU Y": {"tokens_per_s_per_core": 0}}')
    with pytest.raises(ValueError, match="rates.json.*CPU Y"):
        load_rates(path)
