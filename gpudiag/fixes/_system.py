"""What a fix needs to know about the machine: the device a run uses, its capabilities, packages."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from gpudiag.specs import FEATURE_SINCE, has_feature

if TYPE_CHECKING:
    from gpudiag.probe.model import HostInfo, TorchInfo
    from gpudiag.probe.system import Gpu, SystemReport


def current_system() -> SystemReport:
    """This machine's SystemReport (``gd.inspect()``)."""
    from gpudiag.probe.system import inspect

    return inspect()


def cuda_gpus(system: SystemReport | None) -> tuple[Gpu, ...]:
    """GPUs torch can use (none without a report)."""
    return system.cuda_gpus if system is not None else ()


def device_type_for(system: SystemReport | None, device_type: str | None = None) -> str:
    """'cuda' when the run uses a GPU, else 'cpu'. Without a hint: 'cuda' when one is visible."""
    if device_type is not None:
        return "cuda" if str(device_type).startswith("cuda") else "cpu"
    return "cuda" if cuda_gpus(system) else "cpu"


def active_gpu(system: SystemReport | None) -> Gpu | None:
    gpus = cuda_gpus(system)
    return gpus[0] if gpus else None


def gpu_cc(system: SystemReport | None) -> tuple[tuple[int, int] | None, str]:
    """(compute capability, GPU name) of the GPU a run would use; cc None when unknown."""
    gpu = active_gpu(system)
    if gpu is None:
        return None, "no GPU"
    cc = gpu.compute_capability
    return ((int(cc[0]), int(cc[1])) if cc is not None else None), str(gpu.name)


def host(system: SystemReport | None) -> HostInfo | None:
    return system.host if system is not None else None


def torch_info(system: SystemReport | None) -> TorchInfo | None:
    """What the report read of torch (version, CUDA build, cuDNN); None without a report."""
    return system.host.torch if system is not None else None


def cpu_flags(system: SystemReport | None) -> tuple[str, ...]:
    return tuple(system.host.cpu_flags) if system is not None else ()


def package_installed(name: str) -> bool:
    """True when ``name`` can be imported, without importing it (some fail without a driver)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def cc_text(cc: tuple[int, int] | None) -> str:
    return "unknown" if cc is None else f"{cc[0]}.{cc[1]}"


def since_text(feature: str) -> str:
    """``"8.0+"``: the first compute capability with ``feature`` (gpudiag.specs)."""
    return f"{cc_text(FEATURE_SINCE[feature])}+"


def gpu_has(
    system: SystemReport | None, feature: str, what: str, hint: str = ""
) -> tuple[bool, str]:
    """Whether the run's GPU has the tensor-core ``feature`` (a ``specs.FEATURE_SINCE`` key
    such as ``"tf32"``), and the reason when it has not or cannot be told."""
    cc, name = gpu_cc(system)
    if cc is None:
        return (
            False,
            f"the compute capability of {name} is unknown, so {what} support cannot be checked",
        )
    if not has_feature(cc, feature):
        return False, (
            f"{name} (compute capability {cc_text(cc)}) has no {what} tensor cores "
            f"({since_text(feature)} needed){hint}"
        )
    return True, ""
