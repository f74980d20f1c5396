"""Environment rules: CUDA / PyTorch variables that slow every kernel, and allocator settings."""

from __future__ import annotations

from collections.abc import Iterator

from gpudiag._values import digits
from gpudiag.rules._facts import memory_used_fraction
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, FixRef, Severity

CATEGORY = "environment"

# Variables that cost performance when set, with the severity and why. Follows the spirit of
# DCGM's deployment check (DCGM_FR_BAD_CUDA_ENV, "CUDA performance-limiting environment
# variable"), plus PyTorch's own debug switches.
_LIMITING: dict[str, tuple[Severity, str]] = {
    "CUDA_LAUNCH_BLOCKING": (
        Severity.HIGH,
        "every kernel launch waits for the kernel to finish: no CPU/GPU overlap",
    ),
    "PYTORCH_NO_CUDA_MEMORY_CACHING": (
        Severity.HIGH,
        "PyTorch's caching allocator is off: every tensor is a cudaMalloc/cudaFree",
    ),
    "CUDA_PROFILE": (Severity.MEDIUM, "the legacy CUDA command-line profiler is on"),
    "COMPUTE_PROFILE": (Severity.MEDIUM, "the legacy CUDA command-line profiler is on"),
    "OPENCL_PROFILE": (Severity.LOW, "the legacy OpenCL profiler is on"),
    "CUDA_INJECTION64_PATH": (
        Severity.MEDIUM,
        "a tool library is injected into CUDA (a profiler or tracer intercepts calls)",
    ),
    "CUDA_INJECTION32_PATH": (Severity.MEDIUM, "a tool library is injected into CUDA"),
    "NSIGHT_CUDA_DEBUGGER": (Severity.MEDIUM, "the Nsight CUDA debugger is attached"),
    "CUDA_ENABLE_COREDUMP_ON_EXCEPTION": (
        Severity.LOW,
        "GPU core dumps on exception are enabled (debugging setting)",
    ),
    "CUDA_DEVICE_WAITS_ON_EXCEPTION": (
        Severity.LOW,
        "the GPU halts on exception for a debugger (debugging setting)",
    ),
    "TORCH_USE_CUDA_DSA": (Severity.LOW, "device-side assertions add checks to kernels"),
    "CUDA_CACHE_DISABLE": (
        Severity.LOW,
        "the CUDA JIT cache is off: PTX is recompiled at every start",
    ),
}

_OFF_VALUES = {"", "0", "false", "no", "off"}


@rule("env.cuda_limiting", category=CATEGORY, needs=("env",))
def cuda_limiting_variables(evidence: EvidenceBundle) -> Iterator[Finding]:
    """CUDA / PyTorch environment variables that limit performance are set."""
    for name, (severity, why) in _LIMITING.items():
        value = evidence.environment.get(name)
        if value is None or value.strip().lower() in _OFF_VALUES:
            continue
        yield Finding(
            f"env.{name.lower()}",
            severity,
            CATEGORY,
            f"{name}={value} is set: {why}",
            (Evidence(name, value, source="environment"),),
            threshold=f"{name} set to a value other than 0/empty",
            instruction=f"unset {name} for performance runs (keep it for debugging only)",
            estimated_gain=0.3 if severity is Severity.HIGH else None,
        )


@rule("env.allocator_config", category=CATEGORY, needs=("gpu", "env"))
def allocator_config(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Memory nearly full without expandable segments: fragmentation can cause OOM."""
    env = evidence.environment
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF", "") or env.get("PYTORCH_ALLOC_CONF", "")
    if "expandable_segments:true" in conf.replace(" ", "").lower():
        return
    fullest = max(
        (f for g in evidence.system_report.gpus if (f := memory_used_fraction(g)) is not None),
        default=None,
    )
    if fullest is None or fullest <= 0.90:
        return
    yield Finding(
        "env.allocator_expandable_segments",
        Severity.LOW,
        CATEGORY,
        f"GPU memory is {fullest:.0%} used and the allocator does not use expandable segments: "
        "fragmentation can turn into an out-of-memory",
        (
            Evidence("memory used (fullest GPU)", round(100 * fullest, 1), "%", "nvml"),
            Evidence("PYTORCH_CUDA_ALLOC_CONF", conf or "(unset)", source="environment"),
        ),
        threshold="memory used > 90 % and PYTORCH_CUDA_ALLOC_CONF lacks expandable_segments:True",
        fix=FixRef("allocator.config", {"expandable_segments": True}),
        instruction="export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before starting",
    )


# --- NCCL variables ------------------------------------------------------------------------------
# Facts from NCCL's environment-variable documentation
# (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html): NCCL_P2P_DISABLE=1 turns
# off the peer-to-peer transport (NVLink or PCIe between GPUs); NCCL_P2P_LEVEL=LOC never uses
# P2P; NCCL_SHM_DISABLE=1 turns off the shared-memory transport used when P2P cannot be;
# NCCL_IB_DISABLE=1 stops NCCL from using InfiniBand/RoCE, falling back to IP sockets;
# NCCL_NET=Socket forces the socket transport; NCCL_NET_GDR_LEVEL=LOC never uses GPUDirect
# RDMA; NCCL_MAX_NCHANNELS caps the channels (the parallel rings/trees that carry bandwidth);
# NCCL_ALGO / NCCL_PROTO override NCCL's own per-size choice; NCCL_DEBUG=TRACE "prints replayable
# trace information on every call" and needs a build with tracing.
_NCCL_SOURCE = "environment"


def _is_on(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in _OFF_VALUES


def _ib_nics(evidence: EvidenceBundle) -> tuple[str, ...] | None:
    """InfiniBand/RoCE NICs (mlx5_*, ...) the topology lists; None when it cannot tell."""
    topology = evidence.system.topology if evidence.system is not None else None
    if topology is None or not topology.nics:
        return None
    return tuple(n for n in topology.nics if n.startswith(("mlx", "ib", "bnxt_re", "irdma")))


def _nccl_finding(
    name: str,
    value: str,
    severity: Severity,
    message: str,
    *,
    fix: dict[str, str] | None,
    instruction: str,
    extra: tuple[Evidence, ...] = (),
) -> Finding:
    return Finding(
        f"env.nccl.{name.lower().removeprefix('nccl_')}",
        severity,
        CATEGORY,
        message,
        (Evidence(name, value, source=_NCCL_SOURCE), *extra),
        threshold=f"{name}={value} is set for a job that runs NCCL collectives",
        fix=FixRef("nccl.env", {"variables": fix}) if fix else None,
        instruction=instruction,
    )


@rule("env.nccl", category=CATEGORY, needs=("env",))
def nccl_variables(evidence: EvidenceBundle) -> Iterator[Finding]:
    """NCCL environment variables that switch off fast transports or cap bandwidth."""
    env = evidence.environment
    system = evidence.system
    if system is not None and not system.gpus:
        return  # no NVIDIA GPU here: NCCL is not what this machine's jobs use
    gpus = len(system.gpus) if system is not None else 0
    topology = system.topology if system is not None else None
    nvlink = bool(topology is not None and topology.has_nvlink)
    ib = _ib_nics(evidence)
    nic_evidence = (
        (Evidence("InfiniBand/RoCE NICs", ", ".join(ib), source=topology.source),)
        if ib and topology is not None
        else ()
    )
    p2p_off = env.get("NCCL_P2P_DISABLE")
    level = (env.get("NCCL_P2P_LEVEL") or "").strip().upper()
    if _is_on(p2p_off) or level in ("LOC", "0"):
        name, value = (
            ("NCCL_P2P_DISABLE", p2p_off or "")
            if _is_on(p2p_off)
            else (
                "NCCL_P2P_LEVEL",
                env.get("NCCL_P2P_LEVEL", ""),
            )
        )
        yield _nccl_finding(
            name,
            value,
            Severity.HIGH if nvlink else Severity.MEDIUM,
            f"{name}={value}: NCCL's peer-to-peer transport is off, so GPUs of one node exchange "
            "through host memory (SHM)"
            + (" instead of NVLink" if nvlink else " instead of PCIe peer access"),
            fix={"NCCL_P2P_DISABLE": "0"}
            if name == "NCCL_P2P_DISABLE"
            else {"NCCL_P2P_LEVEL": "SYS"},
            instruction=f"unset {name} (it is often left from debugging a hang); if P2P really "
            "fails on this machine, see topo.p2p_unsupported and NCCL's troubleshooting guide "
            "(ACS / IOMMU) rather than turning it off",
            extra=(Evidence("NVLink between GPUs", nvlink, source=topology.source),)
            if topology is not None
            else (),
        )
    if _is_on(env.get("NCCL_SHM_DISABLE")) and (_is_on(p2p_off) or level == "LOC"):
        yield _nccl_finding(
            "NCCL_SHM_DISABLE",
            env["NCCL_SHM_DISABLE"],
            Severity.HIGH,
            "both P2P and shared memory are off: GPUs of one node talk through the network "
            "transport (sockets or the NIC)",
            fix={"NCCL_SHM_DISABLE": "0"},
            instruction="unset NCCL_SHM_DISABLE and NCCL_P2P_DISABLE",
        )
    ib_off = env.get("NCCL_IB_DISABLE")
    if _is_on(ib_off) and ib != ():
        yield _nccl_finding(
            "NCCL_IB_DISABLE",
            ib_off or "",
            Severity.HIGH if ib else Severity.LOW,
            f"NCCL_IB_DISABLE={ib_off}: inter-node traffic goes over IP sockets"
            + (
                f" although this machine has InfiniBand/RoCE NICs ({', '.join(ib)})"
                if ib
                else " (matters when the job spans nodes with InfiniBand/RoCE)"
            ),
            fix={"NCCL_IB_DISABLE": "0"},
            instruction="unset NCCL_IB_DISABLE; check the NICs with `ibstat` / `ibv_devinfo`",
            extra=nic_evidence,
        )
    net = env.get("NCCL_NET")
    if net is not None and net.strip().lower() == "socket" and ib != ():
        yield _nccl_finding(
            "NCCL_NET",
            net,
            Severity.HIGH if ib else Severity.LOW,
            "NCCL_NET=Socket forces the IP socket transport for inter-node traffic"
            + (f" on a machine with InfiniBand/RoCE NICs ({', '.join(ib)})" if ib else ""),
            fix={"NCCL_NET": "IB"} if ib else None,
            instruction="unset NCCL_NET to let NCCL pick InfiniBand/RoCE when it is there",
            extra=nic_evidence,
        )
    ifname = env.get("NCCL_SOCKET_IFNAME")
    if ifname is not None and ifname.strip().lstrip("=^").startswith(("lo", "docker", "virbr")):
        yield _nccl_finding(
            "NCCL_SOCKET_IFNAME",
            ifname,
            Severity.MEDIUM,
            f"NCCL_SOCKET_IFNAME={ifname} picks a loopback or container-bridge interface: other "
            "nodes cannot reach it, and socket traffic cannot leave this host",
            fix=None,
            instruction="set it to the interface that joins the nodes (e.g. NCCL_SOCKET_IFNAME="
            "eth0, or ^lo,docker to exclude those), or unset it",
        )
    gdr = (env.get("NCCL_NET_GDR_LEVEL") or "").strip().upper()
    if gdr in ("LOC", "0") and ib:
        yield _nccl_finding(
            "NCCL_NET_GDR_LEVEL",
            env["NCCL_NET_GDR_LEVEL"],
            Severity.MEDIUM,
            "NCCL_NET_GDR_LEVEL=LOC: GPUDirect RDMA is never used, so inter-node traffic is "
            "staged through host memory",
            fix=None,
            instruction="unset NCCL_NET_GDR_LEVEL (NCCL picks the distance for the platform)",
            extra=nic_evidence,
        )
    channels = env.get("NCCL_MAX_NCHANNELS") or env.get("NCCL_MAX_NRINGS")
    if channels is not None and digits(channels.strip()) and int(channels) <= 2 and gpus != 1:
        name = "NCCL_MAX_NCHANNELS" if "NCCL_MAX_NCHANNELS" in env else "NCCL_MAX_NRINGS"
        yield _nccl_finding(
            name,
            channels,
            Severity.MEDIUM,
            f"{name}={channels} caps NCCL at {channels} channel(s): large collectives cannot use "
            "the links' full bandwidth",
            fix=None,
            instruction=f"unset {name} unless compute kernels must keep those SMs; measure with "
            "gd.bench.allreduce before and after",
        )
    for forced in ("NCCL_ALGO", "NCCL_PROTO"):
        chosen = env.get(forced)
        if chosen:
            yield _nccl_finding(
                forced,
                chosen,
                Severity.LOW,
                f"{forced}={chosen} overrides NCCL's per-message-size choice"
                + (
                    ": without LL/LL128, small messages pay the Simple protocol's latency"
                    if forced == "NCCL_PROTO" and chosen.strip().lower() == "simple"
                    else ""
                ),
                fix=None,
                instruction=f"unset {forced} unless a measurement showed it helps this job",
            )
    if (env.get("NCCL_DEBUG") or "").strip().upper() == "TRACE":
        yield _nccl_finding(
            "NCCL_DEBUG",
            env["NCCL_DEBUG"],
            Severity.LOW,
            "NCCL_DEBUG=TRACE logs every call: for debugging, not performance runs",
            fix=None,
            instruction="unset NCCL_DEBUG (or use WARN / INFO)",
        )
