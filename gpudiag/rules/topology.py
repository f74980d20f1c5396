"""Topology rules: GPU pairs without a direct path, uneven NVLink, and CPU pinning far from the GPU.

Every rule reads ``SystemReport.topology`` (live NVML, or recorded ``nvidia-smi topo -m`` /
``topo -p2p r`` text). On a multi-GPU system whose topology is unknown the rules say so
(not evaluated) instead of passing. Facts cited:

- NCCL environment variables, https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html:
  NCCL_P2P_LEVEL takes LOC, NVL, PIX, PXB, PHB or SYS, "the maximum distance between GPUs where
  NCCL will use the P2P transport"; when it is not set NCCL picks a value for the platform. The
  SHM transport (NCCL_SHM_DISABLE) "is used between devices when peer-to-peer cannot happen,
  therefore, host memory is used".
- NCCL troubleshooting, https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html:
  IO virtualization (VT-d / IOMMU) with PCI ACS enabled can redirect all PCI point-to-point
  traffic to the CPU root complex; `sudo lspci -vvv | grep ACSCtl` shows "SrcValid+" where ACS
  is on; it is switched off in the BIOS (VT-d / IO virtualization) or with setpci.
- torchrun ``--numa-binding=node`` (PyTorch 2.9+, https://docs.pytorch.org/docs/main/elastic/numa.html)
  binds each worker to the CPUs of the NUMA node of its GPU.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpudiag.analysis.nccl import (
    LOW_SHARE,
    MIN_JUDGED_BYTES,
    NCCL_EFFICIENCY,
    link_budget,
    measured_busbw,
)
from gpudiag.probe.topology import (
    P2P_UNSUPPORTED,
    GpuPlacement,
    Topology,
    format_cpulist,
    parse_cpulist,
)
from gpudiag.rules._facts import trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, NotEvaluated, Severity

CATEGORY = "topology"
SHOWN_PAIRS = 6  # pairs listed as evidence; the count says how many there are in all

_UNKNOWN = (
    "the GPU topology (live NVML, or `nvidia-smi topo -m` output passed as "
    "gd.inspect(replay=..., topology=...))"
)
_ORDER = "CUDA_DEVICE_ORDER=PCI_BUS_ID"  # makes CUDA indices follow nvidia-smi's (PCI) order


def _topology(evidence: EvidenceBundle, rule_id: str) -> Iterator[Topology | NotEvaluated]:
    """The topology to judge; NotEvaluated on a multi-GPU system without one; none for one GPU."""
    system = evidence.system_report
    topology = system.topology
    if topology is not None:
        yield topology
    elif len(system.gpus) >= 2:
        yield NotEvaluated(rule_id, _UNKNOWN)


def _pair_name(topology: Topology, i: int, j: int) -> str:
    return f"{topology.gpus[i].name}-{topology.gpus[j].name}"


def _pair_evidence(
    topology: Topology, pairs: list[tuple[int, int]], *, with_p2p: bool
) -> tuple[Evidence, ...]:
    items = []
    for i, j in pairs[:SHOWN_PAIRS]:
        value = topology.link(i, j).label
        if with_p2p:
            value += f", P2P {topology.p2p_status(i, j) or 'unknown'}"
        items.append(Evidence(_pair_name(topology, i, j), value, source=topology.source))
    total = sum(1 for _ in topology.pairs())
    items.append(Evidence("pairs affected", len(pairs), f"of {total}", topology.source))
    return tuple(items)


def _near_group(topology: Topology) -> tuple[int, ...]:
    """The largest set of GPUs with no SYS pair among them (one NUMA node when known)."""
    groups = list(topology.numa_groups().values())
    if not groups:
        parent = list(range(topology.gpu_count))

        def root(n: int) -> int:
            while parent[n] != n:
                n = parent[n]
            return n

        for i, j in topology.pairs():
            if topology.link(i, j).label not in ("SYS", "?"):
                parent[root(j)] = root(i)
        by_root: dict[int, list[int]] = {}
        for n in range(topology.gpu_count):
            by_root.setdefault(root(n), []).append(n)
        groups = [tuple(g) for g in by_root.values()]
    best = max(groups, key=len)
    return tuple(topology.gpus[n].index for n in best)


def _visible(indices: tuple[int, ...]) -> str:
    return f"{_ORDER} CUDA_VISIBLE_DEVICES={','.join(str(n) for n in indices)}"


@rule("topo.host_path", category=CATEGORY, needs=("gpu",))
def host_path(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """GPU pairs without P2P, or only across the CPU socket interconnect (SYS)."""
    for topology in _topology(evidence, "topo.host_path"):
        if isinstance(topology, NotEvaluated):
            yield topology
            return
        yield from _no_p2p(topology)
        yield from _cross_socket(topology)
        unknown = [
            (i, j)
            for i, j in topology.pairs()
            if not topology.link(i, j).is_nvlink and topology.p2p_status(i, j) is None
        ]
        if (
            topology.links
            and unknown
            and not any(topology.link(i, j).label == "SYS" for i, j in unknown)
        ):
            yield NotEvaluated(
                "topo.host_path",
                "the P2P status of the PCIe GPU pairs (live NVML, or `nvidia-smi topo -p2p r` "
                "output passed with topology=)",
            )


def _no_p2p(topology: Topology) -> Iterator[Finding]:
    pairs = [(i, j) for i, j in topology.pairs() if topology.p2p_status(i, j) in P2P_UNSUPPORTED]
    if not pairs:
        return
    codes = sorted({str(topology.p2p_status(i, j)) for i, j in pairs})
    yield Finding(
        "topo.p2p_unsupported",
        Severity.MEDIUM,
        CATEGORY,
        f"{len(pairs)} GPU pair{'s' if len(pairs) != 1 else ''} cannot reach each other's "
        f"memory directly (P2P {'/'.join(codes)}): NCCL collectives and peer copies between "
        "them go through host memory",
        _pair_evidence(topology, pairs, with_p2p=True),
        threshold="nvidia-smi topo -p2p r status CNS, GNS, TNS, NS or DR for a GPU pair",
        instruction="CNS = the chipset, GNS = the GPU, TNS = the PCIe topology does not allow "
        "P2P (`nvidia-smi topo -p2p r` shows it per pair). On PCIe boards, NCCL's "
        "troubleshooting guide names IO virtualization (VT-d/IOMMU) with PCI ACS as a cause "
        "that redirects peer traffic to the CPU: check `sudo lspci -vvv | grep ACSCtl` "
        "(SrcValid+ = ACS on) and switch VT-d / ACS off in the BIOS where the machine allows it. "
        "For one job, use GPUs whose pairs show OK "
        f"({_ORDER} CUDA_VISIBLE_DEVICES=...), or NVLink-joined GPUs",
    )


def _cross_socket(topology: Topology) -> Iterator[Finding]:
    pairs = [
        (i, j)
        for i, j in topology.pairs()
        if topology.link(i, j).label == "SYS" and topology.p2p_status(i, j) not in P2P_UNSUPPORTED
    ]
    if not pairs:
        return
    p2p_ok = all(topology.p2p_status(i, j) == "OK" for i, j in pairs)
    group = _near_group(topology)
    keep = (
        f"keep a job's GPUs on one socket: {_visible(group)} (no SYS pair among them)"
        if len(group) >= 2
        else "keep a job's GPUs on one socket"
    )
    yield Finding(
        "topo.cross_socket",
        Severity.LOW if p2p_ok else Severity.MEDIUM,
        CATEGORY,
        f"{len(pairs)} GPU pair{'s' if len(pairs) != 1 else ''} connect only across the CPU "
        "socket interconnect (SYS)"
        + (
            ": P2P works, but every transfer crosses QPI/UPI"
            if p2p_ok
            else ": unless NCCL uses P2P at that distance, their traffic goes through host memory"
        ),
        _pair_evidence(topology, pairs, with_p2p=bool(topology.p2p)),
        threshold="nvidia-smi topo -m link SYS between two GPUs (low when P2P is known OK)",
        instruction=f"{keep}. NCCL_P2P_LEVEL sets the farthest path NCCL still uses P2P on "
        "(LOC, NVL, PIX, PXB, PHB, SYS; NCCL picks one for the platform when unset): "
        "measure with gd.bench.allreduce before and after changing it",
    )


@rule("topo.nvlink_asymmetric", category=CATEGORY, needs=("gpu",))
def nvlink_asymmetric(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """On an NVLink machine, some GPU pairs have fewer NVLinks than others, or none."""
    for topology in _topology(evidence, "topo.nvlink_asymmetric"):
        if isinstance(topology, NotEvaluated):
            yield topology
            return
        if not topology.has_nvlink:
            return
        pairs = list(topology.pairs())
        nv = [(i, j) for i, j in pairs if topology.link(i, j).is_nvlink]
        without = [(i, j) for i, j in pairs if topology.link(i, j).label not in ("?",)]
        without = [p for p in without if p not in nv]
        most = max(topology.link(i, j).nvlinks for i, j in nv)
        fewer = [(i, j) for i, j in nv if topology.link(i, j).nvlinks < most]
        counts = ", ".join(f"{n} {label}" for label, n in sorted(topology.link_counts().items()))
        if fewer:
            yield _fewer_links(topology, fewer, most, counts, all_nvlink=not without)
        if without:
            yield _partial_nvlink(topology, without, nv, counts)


def _fewer_links(
    topology: Topology, fewer: list[tuple[int, int]], most: int, counts: str, *, all_nvlink: bool
) -> Finding:
    return Finding(
        "topo.nvlink_uneven",
        Severity.MEDIUM if all_nvlink else Severity.LOW,
        CATEGORY,
        f"{len(fewer)} GPU pair{'s' if len(fewer) != 1 else ''} have fewer NVLinks than the "
        f"best-connected pair (NV{most})"
        + (
            ": on a board where every pair has NVLink, a short pair usually means a link is down"
            if all_nvlink
            else ""
        ),
        (
            *_pair_evidence(topology, fewer, with_p2p=False),
            Evidence("pairs by link", counts, source=topology.source),
        ),
        threshold="NVLink count of a GPU pair below the highest pair's (medium when every "
        "pair has NVLink)",
        instruction="`nvidia-smi nvlink --status` lists each link's state and speed per GPU: "
        "a link that is down needs a GPU reset, a reboot or service. Some boards mix link "
        "counts by design (DGX-1 with V100: NV1 and NV2); there, keep the ranks that exchange "
        "the most (tensor-parallel groups) on the best-linked GPUs",
    )


def _partial_nvlink(
    topology: Topology, without: list[tuple[int, int]], nv: list[tuple[int, int]], counts: str
) -> Finding:
    joined = sorted({n for pair in nv for n in pair})
    indices = tuple(topology.gpus[n].index for n in joined)
    return Finding(
        "topo.nvlink_partial",
        Severity.LOW,
        CATEGORY,
        f"NVLink joins {len(nv)} of {len(nv) + len(without)} GPU pairs; the others use "
        "PCIe or the CPU: a collective over all GPUs runs at the pace of its slowest hop",
        (
            *_pair_evidence(topology, without, with_p2p=bool(topology.p2p)),
            Evidence("pairs by link", counts, source=topology.source),
        ),
        threshold="an NVLink machine with GPU pairs that have no NVLink",
        instruction="keep the ranks that exchange the most (tensor-parallel groups) on "
        f"NVLink-joined GPUs (here GPU {format_cpulist(indices)}; select them with "
        f"{_ORDER} CUDA_VISIBLE_DEVICES=...), and data-parallel traffic across the rest",
    )


@rule("topo.cpu_affinity", category=CATEGORY, needs=("gpu",))
def cpu_affinity(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """This process runs on CPUs outside the primary GPU's CPU affinity (another NUMA node)."""
    system = evidence.system_report
    for topology in _topology(evidence, "topo.cpu_affinity"):
        if isinstance(topology, NotEvaluated):
            yield topology
            return
        if system.is_recording or not topology.process_cpus:
            yield NotEvaluated(
                "topo.cpu_affinity", "this process's CPU affinity (read on a live system only)"
            )
            return
        gpu = system.primary_gpu
        placement = topology.placement(gpu.info.index) if gpu is not None else None
        if gpu is None or placement is None or placement.cpus is None:
            yield NotEvaluated("topo.cpu_affinity", "the primary GPU's CPU affinity (NVML)")
            return
        yield from _affinity_finding(topology, placement, gpu.info.cuda_index)


def _affinity_finding(
    topology: Topology, placement: GpuPlacement, cuda_index: int | None
) -> Iterator[Finding]:
    gpu_name = placement.name
    near = placement.cpus or frozenset()
    allowed = parse_cpulist(topology.process_cpus)
    every_gpu_cpu = frozenset().union(*(g.cpus or frozenset() for g in topology.gpus))
    outside = allowed - near
    if not outside:
        return
    numa = placement.numa_affinity
    label = f"{gpu_name}" + (f" (cuda:{cuda_index})" if cuda_index is not None else "")
    items = (
        Evidence("process CPU affinity", topology.process_cpus, source="os.sched_getaffinity"),
        Evidence(f"{gpu_name} CPU affinity", placement.cpu_affinity, source=topology.source),
        Evidence(f"{gpu_name} NUMA node", numa or "unknown", source=topology.source),
    )
    bind = (
        f"`numactl --cpunodebind={numa} --membind={numa} python train.py`, or under torchrun "
        "(PyTorch 2.9+) `torchrun --numa-binding=node ...`, which binds each worker to the "
        "NUMA node of its GPU"
        if numa
        else f"`taskset -c {placement.cpu_affinity} python train.py`"
    )
    if not allowed & near:
        yield Finding(
            "topo.cpu_affinity_remote",
            Severity.MEDIUM,
            CATEGORY,
            f"this process is pinned to CPUs {topology.process_cpus}, none of them near "
            f"{label}: copies between its host memory and the GPU cross the socket "
            "interconnect",
            items,
            threshold="process CPU affinity disjoint from the primary GPU's CPU affinity",
            instruction=f"start it on the GPU's own CPUs: {bind}",
        )
    elif allowed >= every_gpu_cpu:
        if len({g.cpu_affinity for g in topology.gpus if g.cpu_affinity}) < 2:
            return
        yield Finding(
            "topo.cpu_affinity_unpinned",
            Severity.INFO,
            CATEGORY,
            f"this process may run on every CPU ({len(allowed)}), "
            f"{len(outside)} of them on another NUMA node than {label}",
            items,
            threshold="process not pinned on a machine whose GPUs sit on different NUMA nodes",
            instruction="PyTorch's NUMA-binding docs report typical gains of 1-10 % from "
            f"binding to the GPU's NUMA node: {bind}",
        )
    else:
        yield Finding(
            "topo.cpu_affinity_partly_remote",
            Severity.LOW,
            CATEGORY,
            f"this process is pinned to CPUs {topology.process_cpus}; "
            f"{format_cpulist(outside)} of them are not near {label}",
            items,
            threshold="process pinned to CPUs partly outside the primary GPU's CPU affinity",
            instruction=f"pin it to the GPU's own CPUs instead: {bind}",
        )


# --- NCCL bandwidth against the links ---------------------------------------------------


def _cc_major(evidence: EvidenceBundle) -> int | None:
    gpu = evidence.system_report.primary_gpu if evidence.system is not None else None
    cc = gpu.compute_capability if gpu is not None else None
    return int(cc[0]) if cc else None


def _pcie_gen(evidence: EvidenceBundle) -> int | None:
    """The lowest PCIe generation the GPUs' links can run at (NVML ``gen_max``)."""
    gens = [int(g) for gpu in evidence.system_report.gpus if (g := gpu.info.pcie.gen_max.get())]
    return min(gens) if gens else None


def _measured(evidence: EvidenceBundle) -> tuple[float, int, str] | None:
    """The best large-message bus bandwidth over at most this node's GPUs: measured results
    first, then a GPU trace's calls. Collectives over more ranks cross the network between
    nodes, which the GPU links do not bound."""
    node_gpus = len(evidence.system_report.gpus)
    results = evidence.collectives
    if results is not None:
        items = results if isinstance(results, (list, tuple)) else [results]
        found = measured_busbw(items, max_ranks=node_gpus)
        if found is not None:
            return found
    trace = evidence.trace
    if trace is None or not trace.has_gpu_events:
        return None
    best: tuple[float, int, str] | None = None
    for call in trace.collectives().calls:
        bw = call.busbw_gbps
        if (
            bw is None
            or call.timed_on != "gpu"
            or call.group_size > node_gpus
            or (call.size_bytes or 0) < MIN_JUDGED_BYTES
            or call.op not in ("all_reduce", "all_gather", "reduce_scatter")
        ):
            continue
        if best is None or bw > best[0]:
            best = (bw, call.size_bytes or 0, f"{trace_source(trace)} ({call.op} #{call.seq})")
    return best


@rule("nccl.busbw", category=CATEGORY, needs=("gpu",))
def nccl_bus_bandwidth(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """Measured NCCL bus bandwidth well below what the node's GPU links should give."""
    if len(evidence.system_report.gpus) < 2 and evidence.collectives is None:
        return  # one GPU: no collective inside this node to judge
    measured = _measured(evidence)
    if measured is None:
        yield NotEvaluated(
            "nccl.busbw",
            "a measured collective of 32 MiB or more within this node's GPUs (gd.bench.allreduce, "
            "an nccl-tests log passed as collectives=, or a GPU trace with large all-reduce / "
            "all-gather calls; collectives across nodes are bound by the network instead)",
        )
        return
    topology = evidence.system.topology if evidence.system is not None else None
    budget = link_budget(
        topology.links if topology is not None else (),
        cc_major=_cc_major(evidence),
        pcie_gen=_pcie_gen(evidence),
    )
    if budget is None or topology is None:
        yield NotEvaluated("nccl.busbw", _UNKNOWN)
        return
    busbw, size, source = measured
    share = busbw / budget.link_gbps
    if share >= LOW_SHARE:
        return
    yield Finding(
        "nccl.busbw_low",
        Severity.HIGH if share < LOW_SHARE / 2 else Severity.MEDIUM,
        CATEGORY,
        f"collectives reach {busbw:.0f} GB/s bus bandwidth, {share:.0%} of the {budget.link_gbps:g}"
        f" GB/s the GPUs' links carry ({budget.link}); a healthy node reaches about "
        f"{budget.expected_busbw_gbps:.0f} GB/s",
        (
            Evidence("measured bus bandwidth", round(busbw, 1), "GB/s", source),
            Evidence("message size", f"{size / 2**20:,.0f}", "MiB", source),
            Evidence(
                "link bandwidth per GPU and direction", budget.link_gbps, "GB/s", topology.source
            ),
            Evidence(
                "expected bus bandwidth",
                round(budget.expected_busbw_gbps, 1),
                "GB/s",
                f"{budget.basis}; x{NCCL_EFFICIENCY:g}",
            ),
            *(Evidence("assumed", note, source="gpudiag") for note in budget.notes),
        ),
        threshold=f"bus bandwidth of the largest messages < {LOW_SHARE:.0%} of the link bandwidth "
        f"(high below {LOW_SHARE / 2:.0%})",
        instruction="run NCCL with NCCL_DEBUG=INFO and read which transport each channel uses "
        "(P2P/CUMEM, SHM or NET): SHM or NET between GPUs of one node means P2P is off "
        "(NCCL_P2P_DISABLE, IOMMU/ACS) or a link is down (`nvidia-smi nvlink --status`); "
        "compare with nccl-tests' all_reduce_perf on the same GPUs",
    )


@rule("topo.nic_affinity", category=CATEGORY, needs=("gpu",))
def nic_affinity(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """GPUs whose nearest network card is across the CPU socket link (SYS)."""
    for topology in _topology(evidence, "topo.nic_affinity"):
        if isinstance(topology, NotEvaluated):
            yield topology
            return
        if not topology.nics or not topology.nic_links:
            return
        far = [
            (g, row)
            for g, row in zip(topology.gpus, topology.nic_links, strict=False)
            if row and all(label in ("SYS", "NODE") for label in row)
        ]
        if not far:
            return
        labels = sorted({label for _, row in far for label in row})
        yield Finding(
            "topo.nic_far",
            Severity.LOW,
            CATEGORY,
            f"{len(far)} of {topology.gpu_count} GPUs reach every network card "
            f"({', '.join(topology.nics)}) only through the CPU ({'/'.join(labels)}): across "
            "nodes their NCCL traffic crosses the host, and GPUDirect RDMA is usually not used "
            "at that distance",
            (
                *(
                    Evidence(
                        f"{g.name} to {', '.join(topology.nics)}",
                        "/".join(row),
                        source=topology.source,
                    )
                    for g, row in far[:SHOWN_PAIRS]
                ),
                Evidence("GPUs affected", len(far), f"of {topology.gpu_count}", topology.source),
            ),
            threshold="every NIC is NODE or SYS away from a GPU in `nvidia-smi topo -m`",
            instruction="for jobs across nodes: a NIC under the same PCIe switch as each GPU "
            "(PIX/PXB) lets NCCL use GPUDirect RDMA; NCCL_NET_GDR_LEVEL sets the farthest "
            "distance it is used at, and NCCL_DEBUG=INFO shows whether it is (GDRDMA). On one "
            "node this does not matter",
        )
