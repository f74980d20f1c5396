"""Environment fixes (allocator, NCCL) exported as variables, and advice-only fixes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from gpudiag.fixes.proof import Observation, Proof, applied, not_applied
from gpudiag.fixes.spec import FixParams, FixSpec, register

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport

# Values stay plain tokens so an exported line can never smuggle shell syntax. Matched with
# fullmatch: "$" alone also matches before a trailing newline ("NCCL_ALGO\n" would pass).
_SAFE_VALUE = re.compile(r"[A-Za-z0-9_.,:=/+\-]*")
_NCCL_NAME = re.compile(r"NCCL_[A-Z0-9_]+")


class _Environment(FixSpec):
    """Variables read when the process starts: exported (Recipe.to_env(), torchrun_command()),
    never applied live; the proof reads them back in the process that runs."""

    def proof(
        self, params: Mapping[str, Any], arm: Observation, baseline: Observation | None
    ) -> Proof:
        wanted = self.env(params)
        wrong = {k: v for k, v in wanted.items() if arm.environ.get(k) != v}
        if not wrong:
            return applied(
                self.id,
                ", ".join(f"{k}={v}" for k, v in wanted.items()) + " read back in the process",
            )
        seen = "; ".join(
            f"{k} is {arm.environ[k]!r}" if k in arm.environ else f"{k} is not set" for k in wrong
        )
        return not_applied(
            self.id,
            f"{seen} in the process: environment variables are read when it starts",
            manual="export "
            + " ".join(f"{k}={v}" for k, v in wrong.items())
            + " before starting (Recipe.to_env())",
        )


class AllocatorParams(FixParams):
    expandable_segments: bool | None = True
    max_split_size_mb: int | None = Field(None, ge=21)  # the allocator rejects <= 20


@register
class AllocatorConfig(_Environment):
    id = "allocator.config"
    summary = (
        "Configure PyTorch's CUDA caching allocator (PYTORCH_CUDA_ALLOC_CONF): expandable segments "
        "or a split-size cap reduce fragmentation out-of-memory errors."
    )
    Params = AllocatorParams

    def supported(
        self, params: Mapping[str, Any], system: SystemReport | None, device_type: str
    ) -> tuple[bool, str]:
        if device_type != "cuda":
            return False, "the CUDA caching allocator is not used on the CPU"
        return True, ""

    def env(self, params: Mapping[str, Any]) -> dict[str, str]:
        parts = []
        if params.get("expandable_segments") is not None:
            parts.append(f"expandable_segments:{bool(params['expandable_segments'])}")
        if params.get("max_split_size_mb") is not None:
            parts.append(f"max_split_size_mb:{int(params['max_split_size_mb'])}")
        return {"PYTORCH_CUDA_ALLOC_CONF": ",".join(parts)} if parts else {}


# NCCL's tuning and system-configuration variables (NCCL's "Environment Variables" page): what
# an NCCL recipe is for. A recipe is data, exported and sourced without a second look, so any
# other NCCL variable is refused on export unless the user allows it by name.
NCCL_TUNING = frozenset(
    "NCCL_" + name
    for name in (
        "ALGO", "PROTO", "MIN_NCHANNELS", "MAX_NCHANNELS", "MIN_NRINGS", "MAX_NRINGS",
        "MIN_CTAS", "MAX_CTAS", "CGA_CLUSTER_SIZE", "NTHREADS", "BUFFSIZE", "LL128_BUFFSIZE",
        "NCHANNELS_PER_NET_PEER", "P2P_DISABLE", "P2P_LEVEL", "P2P_DIRECT_DISABLE",
        "P2P_PXN_LEVEL", "PXN_DISABLE", "P2P_NET_CHUNKSIZE", "P2P_NVL_CHUNKSIZE",
        "P2P_PCI_CHUNKSIZE", "P2P_LL_THRESHOLD", "P2P_USE_CUDA_MEMCPY", "SHM_DISABLE",
        "SHM_USE_CUDA_MEMCPY", "SHM_MEMCPY_MODE", "SHM_LOCALITY", "NVB_DISABLE", "NVLS_ENABLE",
        "NVLS_NCHANNELS", "CUMEM_ENABLE", "CUMEM_HOST_ENABLE", "DMABUF_ENABLE",
        "GRAPH_REGISTER", "GRAPH_MIXING_SUPPORT", "LOCAL_REGISTER", "LAUNCH_MODE",
        "WORK_FIFO_DEPTH", "RUNTIME_CONNECT", "COMM_BLOCKING", "SINGLE_RING_THRESHOLD",
        "LL_THRESHOLD", "TREE_THRESHOLD", "COLLNET_ENABLE", "COLLNET_NODE_THRESHOLD",
        "ALLOC_P2P_NET_LL_BUFFERS", "IGNORE_CPU_AFFINITY", "SET_STACK_SIZE", "SET_THREAD_NAME",
        "CROSS_NIC", "NET", "NET_GDR_LEVEL", "IB_GDR_LEVEL", "NET_GDR_READ",
        "NET_SHARED_BUFFERS", "NET_SHARED_COMMS", "NET_FORCE_FLUSH", "SOCKET_IFNAME",
        "SOCKET_FAMILY", "SOCKET_NTHREADS", "NSOCKS_PERTHREAD", "IB_DISABLE", "IB_HCA",
        "IB_TIMEOUT", "IB_RETRY_CNT", "IB_GID_INDEX", "IB_ROCE_VERSION_NUM", "IB_SL", "IB_TC",
        "IB_FIFO_TC", "IB_AR_THRESHOLD", "IB_CUDA_SUPPORT", "IB_QPS_PER_CONNECTION",
        "IB_SPLIT_DATA_ON_QPS", "IB_PCI_RELAXED_ORDERING", "IB_ADAPTIVE_ROUTING",
        "IB_MERGE_NICS", "IB_ECE_ENABLE", "IB_RETURN_ASYNC_EVENTS", "DEBUG", "DEBUG_SUBSYS",
        "DEBUG_TIMESTAMP_FORMAT", "DEBUG_TIMESTAMP_LEVELS",
    )
)  # fmt: skip


def nccl_refusal(name: str) -> str:
    """Why a recipe may not set the NCCL variable ``name`` unless the user allows it by name;
    "" for a tuning variable it may set."""
    if name.endswith("_PLUGIN"):
        return (
            f"{name} makes every process that starts NCCL load the shared library it names "
            "(code, not a setting)"
        )
    if any(word in name for word in ("FILE", "PATH", "_DIR")):
        return (
            f"{name} names a file NCCL reads or writes: a recipe could make training overwrite "
            "one (NCCL_DEBUG_FILE=~/.bashrc) or read one it should not"
        )
    if name not in NCCL_TUNING:
        return f"{name} is not an NCCL tuning variable gpudiag knows"
    return ""


class NcclParams(FixParams):
    variables: dict[str, str] = Field(default_factory=dict)

    @field_validator("variables")
    @classmethod
    def _names_and_values(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not isinstance(name, str) or not _NCCL_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an NCCL variable (NCCL_ followed by capitals)")
            if not _SAFE_VALUE.fullmatch(text):
                raise ValueError(f"value of {name} may hold only letters, digits and _.,:=/+-")
        return value


@register
class NcclEnv(_Environment):
    id = "nccl.env"
    summary = "Set NCCL environment variables (algorithm, protocol, channels, network interface)."
    Params = NcclParams

    def normalize(self, params: Mapping[str, Any]) -> dict[str, Any]:
        # gd.Fix("nccl.env", NCCL_ALGO="Ring") and "nccl.env:NCCL_ALGO=Ring" both work.
        out = dict(params)
        loose = {k: out.pop(k) for k in list(out) if k.startswith("NCCL_")}
        if loose:
            out["variables"] = {
                **dict(out.get("variables") or {}),
                **{k: str(v) for k, v in loose.items()},
            }
        return out

    def supported(
        self, params: Mapping[str, Any], system: SystemReport | None, device_type: str
    ) -> tuple[bool, str]:
        if device_type != "cuda":
            return False, "NCCL runs only between NVIDIA GPUs (CPU jobs use gloo)"
        return True, ""

    def describe(self, params: Mapping[str, Any]) -> str:
        variables = params.get("variables") or {}
        listed = ", ".join(f"{k}={v}" for k, v in variables.items()) or "none given"
        return f"{self.summary} Variables: {listed}."

    def env(self, params: Mapping[str, Any]) -> dict[str, str]:
        return dict(params.get("variables") or {})


class SyncParams(FixParams):
    call_site: str = ""


@register
class SyncRemove(FixSpec):
    id = "sync.remove"
    summary = (
        "Remove host synchronisation from the training step (.item(), printing a tensor, .cpu(), "
        "torch.cuda.synchronize): keep values on the device and log every N steps."
    )
    Params = SyncParams
    main_param = "call_site"

    def describe(self, params: Mapping[str, Any]) -> str:
        site = params.get("call_site")
        return f"{self.summary} Found at: {site}." if site else self.summary
