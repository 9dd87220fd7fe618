"""CPU placement on a training node: which cores each training rank and the background hint
builder run on.

The topology comes from /sys (logical CPUs grouped into physical cores by their SMT siblings,
and NUMA nodes) as a small frozen dataclass, so the policy is a pure function that tests feed
with any topology:
  * each local rank gets whole physical cores (with all their SMT siblings) on the NUMA node of
    its GPU, enough for `threads_per_rank` threads (the loop, the hint-prep thread and the
    training-time index's workers);
  * the builder gets only the physical cores no rank uses, again with all their siblings, so it
    never shares a core's execution units with a rank; it runs at a lower priority (BUILDER_NICE).
A node short of cores lends a rank cores from the node with the most free ones, and the plan says
so in its notes.

The trainer: placement = plan_placement(read_topology(), gpu_nodes, threads_per_rank); every
local rank calls pin(placement.rank_cpus[local_rank]) before it starts threads (threads inherit
the mask); local rank 0 starts the builder on placement.builder_cpus and lower_priority(its pid).
`python -m train.placement` prints this machine's topology and a plan.
"""
import argparse
import os
from dataclasses import dataclass

SYS_ROOT = "/sys"
# The builder yields to the training ranks when they want a core (nice 10 of 0..19).
BUILDER_NICE = 10


@dataclass(frozen=True)
class Core:
    """One physical core: its NUMA node, package, core id and logical CPUs (SMT siblings)."""
    node: int
    package: int
    core_id: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class Topology:
    cores: tuple[Core, ...]

    @property
    def nodes(self) -> list[int]:
        return sorted({c.node for c in self.cores})

    @property
    def cpus(self) -> list[int]:
        return sorted(cpu for c in self.cores for cpu in c.cpus)

    def cores_on(self, node: int) -> list[Core]:
        return [c for c in self.cores if c.node == node]

    def describe(self) -> str:
        threads = sorted({len(c.cpus) for c in self.cores})
        per_node = ", ".join(f"node {n}: {len(self.cores_on(n))} cores" for n in self.nodes)
        return (f"{len(self.cpus)} CPUs, {len(self.cores)} physical cores ({'/'.join(map(str, threads))} "
                f"thread(s) each), {len(self.nodes)} NUMA node(s) ({per_node})")


@dataclass(frozen=True)
class Placement:
    rank_cpus: tuple[tuple[int, ...], ...]   # per local rank
    builder_cpus: tuple[int, ...]
    notes: tuple[str, ...] = ()


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8,10-11' (the /sys list format) -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def read_topology(sys_root: str = SYS_ROOT, allowed=None) -> Topology:
    """The topology of the online CPUs this process may run on (`allowed`, default its affinity).

    NUMA nodes come from <sys_root>/devices/system/node/node*/cpulist (all node 0 where that is
    missing, e.g. a kernel without NUMA); physical cores from each CPU's topology/core_id and
    physical_package_id.
    """
    cpu_dir = os.path.join(sys_root, "devices", "system", "cpu")
    try:
        online = parse_cpu_list(_read(os.path.join(cpu_dir, "online")))
    except (OSError, ValueError) as e:
        raise ValueError(f"read_topology: cannot read the online CPUs from {cpu_dir}/online ({e})") from e
    allowed = set(os.sched_getaffinity(0) if allowed is None else allowed)
    node_of = {}
    node_dir = os.path.join(sys_root, "devices", "system", "node")
    if os.path.isdir(node_dir):
        for name in os.listdir(node_dir):
            if name.startswith("node") and name[4:].isdigit():
                for cpu in parse_cpu_list(_read(os.path.join(node_dir, name, "cpulist"))):
                    node_of[cpu] = int(name[4:])
    groups = {}
    for cpu in online:
        if cpu not in allowed:
            continue
        topo = os.path.join(cpu_dir, f"cpu{cpu}", "topology")
        try:
            package, core_id = int(_read(os.path.join(topo, "physical_package_id"))), int(_read(os.path.join(topo, "core_id")))
        except (OSError, ValueError):
            package, core_id = 0, cpu  # no topology files: every CPU its own core
        groups.setdefault((package, core_id), []).append(cpu)
    if not groups:
        raise ValueError(f"read_topology: none of the online CPUs {online} is in the allowed set {sorted(allowed)}")
    cores = [Core(node_of.get(cpus[0], 0), package, core_id, tuple(sorted(cpus)))
             for (package, core_id), cpus in groups.items()]
    return Topology(tuple(sorted(cores, key=lambda c: (c.node, c.package, c.core_id))))


def synthetic_topology(sockets: int, cores_per_socket: int, threads_per_core: int) -> Topology:
    """A node as Linux numbers one: socket s = NUMA node s; logical CPU t * sockets * cores +
    s * cores + c is thread t of core c of socket s (siblings are a whole socket-width apart)."""
    width = sockets * cores_per_socket
    return Topology(tuple(
        Core(s, s, c, tuple(t * width + s * cores_per_socket + c for t in range(threads_per_core)))
        for s in range(sockets) for c in range(cores_per_socket)))


def plan_placement(topo: Topology, gpu_nodes, threads_per_rank: int) -> Placement:
    """Cores for each local rank (gpu_nodes[r]: the NUMA node of rank r's GPU, None if unknown)
    and for the builder (every physical core no rank uses)."""
    if threads_per_rank < 1:
        raise ValueError(f"plan_placement: threads_per_rank must be >= 1, got {threads_per_rank}")
    free = {n: topo.cores_on(n) for n in topo.nodes}
    notes, ranks = [], []
    for rank, node in enumerate(gpu_nodes):
        if node is not None and node not in free:
            raise ValueError(f"plan_placement: rank {rank}'s GPU is on NUMA node {node}, which has none of "
                             f"this process's CPUs (nodes {topo.nodes})")
        taken = []
        while sum(len(c.cpus) for c in taken) < threads_per_rank:
            home = node if node is not None and free[node] else max(free, key=lambda n: len(free[n]))
            if not free[home]:
                raise ValueError(f"plan_placement: {len(gpu_nodes)} ranks x {threads_per_rank} threads do not fit "
                                 f"in {topo.describe()}")
            if home != node:
                notes.append(f"rank {rank}: GPU on node {node}, took a core of node {home}")
            taken.append(free[home].pop(0))
        ranks.append(tuple(sorted(cpu for c in taken for cpu in c.cpus)))
    builder = tuple(sorted(cpu for cores in free.values() for c in cores for cpu in c.cpus))
    if not builder:
        notes.append("no core is left for the background builder")
    return Placement(tuple(ranks), builder, tuple(notes))


def pci_address(domain: int, bus: int, device: int) -> str:
    """The /sys/bus/pci/devices name of a GPU (torch.cuda.get_device_properties: pci_domain_id,
    pci_bus_id, pci_device_id)."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def gpu_numa_node(address: str, sys_root: str = SYS_ROOT):
    """NUMA node of the PCI device `address` (e.g. '0000:1b:00.0'); None when the kernel does not
    say (no file, or -1 on a machine without NUMA)."""
    try:
        node = int(_read(os.path.join(sys_root, "bus", "pci", "devices", address.lower(), "numa_node")))
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def place_cuda_ranks(local_world_size: int, threads_per_rank: int) -> Placement:
    """The placement of this node's training ranks, local rank r on GPU r, from /sys and each
    GPU's PCI address (torch.cuda.get_device_properties); unknown NUMA nodes place anywhere."""
    import torch
    nodes = []
    for r in range(local_world_size):
        p = torch.cuda.get_device_properties(r)
        nodes.append(gpu_numa_node(pci_address(p.pci_domain_id, p.pci_bus_id, p.pci_device_id)))
    return plan_placement(read_topology(), nodes, threads_per_rank)


def pin_cuda_rank(local_rank: int, local_world_size: int, threads_per_rank: int, log=print):
    """Pin this rank to its cores (place_cuda_ranks) and return the builder's cores (None: none left)."""
    placement = place_cuda_ranks(local_world_size, threads_per_rank)
    pin(placement.rank_cpus[local_rank])
    builder = list(placement.builder_cpus) or None
    log(f"placement: rank cpus {list(placement.rank_cpus)}, builder cpus {builder} {list(placement.notes)}")
    return builder


def pin(cpus) -> None:
    """Pin the calling thread (and the threads it starts later) to `cpus`."""
    os.sched_setaffinity(0, cpus)


def lower_priority(pid: int = 0, nice: int = BUILDER_NICE) -> None:
    """Give process `pid` (0: this one) a lower CPU priority."""
    os.setpriority(os.PRIO_PROCESS, pid, nice)


def main(argv=None):
    p = argparse.ArgumentParser(description="Print this machine's CPU topology and a placement of training "
                                "ranks and the background hint builder.")
    p.add_argument("--gpu-nodes", default="0", help="NUMA node of each local rank's GPU, comma-separated "
                   "('-' for unknown), e.g. 0,0,0,0,1,1,1,1")
    p.add_argument("--threads-per-rank", type=int, default=3, help="threads each rank runs (loop + hint prep + index workers)")
    p.add_argument("--synthetic", help="plan for SOCKETS,CORES,THREADS instead of this machine, e.g. 2,56,2")
    p.add_argument("--sys-root", default=SYS_ROOT)
    args = p.parse_args(argv)
    if args.synthetic:
        try:
            sockets, cores, threads = (int(v) for v in args.synthetic.split(","))
        except ValueError:
            p.error(f"--synthetic expects SOCKETS,CORES,THREADS, got {args.synthetic!r}")
        topo = synthetic_topology(sockets, cores, threads)
    else:
        topo = read_topology(args.sys_root)
    nodes = [None if v.strip() == "-" else int(v) for v in args.gpu_nodes.split(",")]
    plan = plan_placement(topo, nodes, args.threads_per_rank)
    print(f"topology: {topo.describe()}")
    for rank, cpus in enumerate(plan.rank_cpus):
        print(f"rank {rank} (GPU on node {nodes[rank]}): CPUs {list(cpus)}")
    print(f"builder: {len(plan.builder_cpus)} CPUs {list(plan.builder_cpus)}")
    for note in plan.notes:
        print(f"note: {note}")


if __name__ == "__main__":
    main()
