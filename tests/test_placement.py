"""train/placement.py: /sys topology parsing and the placement of ranks and the hint builder."""
import os

import pytest

from train.placement import (Core, gpu_numa_node, parse_cpu_list, pci_address, plan_placement,
                             read_topology, synthetic_topology)


def core_of(topo):
    return {cpu: c for c in topo.cores for cpu in c.cpus}


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("5") == [5]


def test_two_socket_smt_node_with_eight_gpus():
    """2 sockets x 56 cores x SMT-2 (224 CPUs), GPUs 0-3 on node 0 and 4-7 on node 1, 3 threads
    per rank: each rank gets 2 whole cores (4 CPUs) of its GPU's node, the builder every other
    whole core, and no rank shares a physical core with another rank or the builder."""
    topo = synthetic_topology(2, 56, 2)
    assert len(topo.cpus) == 224 and len(topo.cores) == 112 and topo.nodes == [0, 1]
    assert set(topo.cores[0].cpus) == {0, 112}  # Linux numbering: siblings 112 apart
    gpu_nodes = [0, 0, 0, 0, 1, 1, 1, 1]
    plan = plan_placement(topo, gpu_nodes, threads_per_rank=3)
    owner = core_of(topo)
    rank_cores = []
    for rank, cpus in enumerate(plan.rank_cpus):
        assert len(cpus) == 4
        cores = {owner[c] for c in cpus}
        assert len(cores) == 2 and all(c.node == gpu_nodes[rank] for c in cores)
        assert {cpu for c in cores for cpu in c.cpus} == set(cpus)  # whole cores, siblings included
        rank_cores.append(cores)
    assert sum(len(c) for c in rank_cores) == len(set().union(*rank_cores)) == 16  # no core shared by ranks
    builder_cores = {owner[c] for c in plan.builder_cpus}
    assert not builder_cores & set().union(*rank_cores)  # not even an SMT sibling of a rank's CPU
    assert len(plan.builder_cpus) == 224 - 32 and {cpu for c in builder_cores for cpu in c.cpus} == set(plan.builder_cpus)
    assert plan.notes == ()


def test_short_node_lends_cores_and_says_so():
    topo = synthetic_topology(2, 2, 2)
    plan = plan_placement(topo, [0, 0, 0], threads_per_rank=2)
    owner = core_of(topo)
    assert [owner[plan.rank_cpus[r][0]].node for r in range(3)] == [0, 0, 1]
    assert any("rank 2" in n and "node 1" in n for n in plan.notes)
    assert len(plan.builder_cpus) == 2
    with pytest.raises(ValueError, match="do not fit"):
        plan_placement(topo, [0] * 5, threads_per_rank=2)
    with pytest.raises(ValueError, match="node 3"):
        plan_placement(topo, [3], threads_per_rank=1)
    unknown = plan_placement(topo, [None], threads_per_rank=1)  # unknown node: the freest one
    assert len(unknown.rank_cpus[0]) == 2


def write_sys(root, cpus, nodes):
    """A /sys tree: cpus = {cpu: (package, core_id)}, nodes = {node: [cpus]}."""
    cpu_dir = root / "devices" / "system" / "cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text(f"0-{max(cpus)}\n")
    for cpu, (package, core_id) in cpus.items():
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core_id}\n")
    for node, members in nodes.items():
        d = root / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(",".join(map(str, members)) + "\n")


def test_read_topology_from_a_sys_tree(tmp_path):
    # 2 packages x 2 cores x 2 threads, siblings 4 apart; core ids restart per package
    cpus = {cpu: (cpu % 4 // 2, cpu % 2) for cpu in range(8)}
    write_sys(tmp_path, cpus, {0: [0, 1, 4, 5], 1: [2, 3, 6, 7]})
    topo = read_topology(str(tmp_path), allowed=range(8))
    assert topo.cores == (Core(0, 0, 0, (0, 4)), Core(0, 0, 1, (1, 5)), Core(1, 1, 0, (2, 6)), Core(1, 1, 1, (3, 7)))
    # CPUs outside the affinity mask are left out, and a core keeps only its allowed siblings
    assert read_topology(str(tmp_path), allowed={0, 1, 4}).cores == (Core(0, 0, 0, (0, 4)), Core(0, 0, 1, (1,)))
    with pytest.raises(ValueError, match="allowed"):
        read_topology(str(tmp_path), allowed={42})
    with pytest.raises(ValueError, match="online"):
        read_topology(str(tmp_path / "missing"))


def test_read_this_machines_topology():
    topo = read_topology()
    allowed = sorted(os.sched_getaffinity(0))
    assert topo.cpus == allowed  # every allowed CPU in exactly one core
    assert len({cpu for c in topo.cores for cpu in c.cpus}) == sum(len(c.cpus) for c in topo.cores)
    plan = plan_placement(topo, [topo.nodes[0]], threads_per_rank=1)
    assert not set(plan.rank_cpus[0]) & set(plan.builder_cpus)
    assert set(plan.rank_cpus[0]) | set(plan.builder_cpus) == set(allowed)


def test_gpu_numa_node(tmp_path):
    address = pci_address(0, 0x1B, 0)
    assert address == "0000:1b:00.0"
    d = tmp_path / "bus" / "pci" / "devices" / address
    d.mkdir(parents=True)
    (d / "numa_node").write_text("1\n")
    assert gpu_numa_node(address, str(tmp_path)) == 1
    (d / "numa_node").write_text("-1\n")
    assert gpu_numa_node(address, str(tmp_path)) is None
    assert gpu_numa_node("0000:ff:00.0", str(tmp_path)) is None
