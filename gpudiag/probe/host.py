"""The host around the GPUs: CPU model and ML-relevant flags, cores, NUMA, memory, torch build."""

from __future__ import annotations

import os
import platform
import socket
import sys
from pathlib import Path

from gpudiag._values import digits
from gpudiag.probe import cuda
from gpudiag.probe.model import HostInfo, TorchInfo
from gpudiag.probe.readings import Reading, Status, na, ok

# CPU flags that change what precision and kernels are fast on the CPU.
ML_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_bf16",
    "amx_int8",
    "amx_tile",
    "amx_fp16",
    "asimd",  # Arm NEON
    "sve",
    "bf16",  # Arm BF16 extension
)


def affinity_cpus() -> int | None:
    """How many CPUs this process may run on (its affinity mask); None where the OS has none."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def usable_cpus() -> int:
    """CPUs this process may run on: the affinity mask, else the CPU count (at least 1)."""
    return affinity_cpus() or os.cpu_count() or 1


def available_memory_bytes() -> int | None:
    """Host memory available to a new allocation now (psutil's ``available``), None unknown."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except (ImportError, OSError):
        return None


def load_average() -> float | None:
    """The host's 1-minute load average (None where the OS does not report one)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def parse_cpuinfo(text: str) -> tuple[str | None, tuple[str, ...]]:
    """CPU model name and the ML-relevant flags from ``/proc/cpuinfo`` text (x86 or Arm)."""
    model = None
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if model is None and key in {"model name", "hardware", "cpu model"}:
            model = value.strip() or None
        elif not flags and key in {"flags", "features"}:
            flags = set(value.split())
    return model, tuple(f for f in ML_FLAGS if f in flags)


def numa_node_count(sys_root: str | Path = "/sys/devices/system/node") -> Reading[int]:
    root = Path(sys_root)
    try:
        nodes = [p for p in root.iterdir() if p.name.startswith("node") and digits(p.name[4:])]
    except OSError:
        return na(Status.NOT_SUPPORTED, "no NUMA information (/sys/devices/system/node)", "host")
    return ok(max(len(nodes), 1), "host")


def cpu_max_mhz(
    sys_root: str | Path = "/sys/devices/system/cpu", cpuinfo: str | Path = "/proc/cpuinfo"
) -> Reading[float]:
    """The CPU clock: cpufreq's maximum, else the current clock ``/proc/cpuinfo`` reports."""
    text = _read(Path(sys_root) / "cpu0" / "cpufreq" / "cpuinfo_max_freq")
    if text and digits(text.strip()):
        return ok(int(text.strip()) / 1000.0, "cpufreq max")
    for line in (_read(cpuinfo) or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "cpu mhz":
            try:
                return ok(float(value), "/proc/cpuinfo (current clock)")
            except ValueError:
                break
    return na(Status.NOT_SUPPORTED, "CPU clock unknown (no cpufreq or /proc/cpuinfo)", "host")


def last_level_cache_bytes(sys_root: str | Path = "/sys/devices/system/cpu") -> Reading[int]:
    """The size of CPU 0's largest cache level (``/sys/.../cpu0/cache/index*/size``)."""
    best = 0
    try:
        entries = sorted((Path(sys_root) / "cpu0" / "cache").glob("index*"))
    except OSError:
        entries = []
    for entry in entries:
        size = (_read(entry / "size") or "").strip()
        if digits(size[:-1]):
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1].upper(), 1)
            best = max(best, int(size[:-1]) * scale)
    if best:
        return ok(best, "/sys cache index (largest level)")
    return na(Status.NOT_SUPPORTED, "cache size unknown (no /sys cache index)", "host")


def probe_torch() -> TorchInfo:
    """What the installed torch is and can do. Imports torch; never initialises CUDA itself."""
    try:
        import torch
    except ImportError as exc:
        missing = na(Status.NOT_FOUND, f"torch is not installed ({exc})", "torch")
        return TorchInfo(missing, missing, missing, missing, missing, missing)
    cuda_build = cuda.built_with_cuda()
    cudnn = torch.backends.cudnn.version() if cuda_build else None
    available = cuda.available()
    return TorchInfo(
        version=ok(str(torch.__version__), "torch"),
        cuda_build=ok(cuda_build, "torch")
        if cuda_build
        else na(Status.NOT_SUPPORTED, "CPU-only torch build (torch.version.cuda is None)", "torch"),
        cudnn_version=ok(int(cudnn), "torch")
        if cudnn
        else na(Status.NOT_SUPPORTED, "no cuDNN", "torch"),
        cuda_available=ok(available, "torch"),
        device_count=ok(cuda.device_count(), "torch"),
        num_threads=ok(int(torch.get_num_threads()), "torch"),
    )


def probe_host(*, with_torch: bool = True) -> HostInfo:
    """Read the host. Works everywhere; what it cannot read is N/A with the reason."""
    text = _read("/proc/cpuinfo")
    model, flags = parse_cpuinfo(text) if text else (None, ())
    if model is None:
        model = platform.processor() or None
    try:
        import psutil

        vm = psutil.virtual_memory()
        memory_total = ok(int(vm.total), "host")
        memory_available = ok(int(vm.available), "host")
        physical = psutil.cpu_count(logical=False)
    except ImportError:
        missing = na(Status.NOT_FOUND, "psutil is not installed", "host")
        memory_total = memory_available = missing
        physical = None
    allowed = affinity_cpus()
    affinity = (
        ok(allowed, "host")
        if allowed is not None
        else na(Status.NOT_SUPPORTED, "no CPU affinity on this OS", "host")
    )
    return HostInfo(
        hostname=socket.gethostname(),
        os=f"{platform.system()} {platform.release()}",
        python=sys.version.split()[0],
        cpu_model=ok(model, "host")
        if model
        else na(Status.NOT_SUPPORTED, "CPU model unknown", "host"),
        cpu_flags=flags,
        logical_cores=ok(os.cpu_count() or 0, "host"),
        physical_cores=ok(int(physical), "host")
        if physical
        else na(Status.NOT_SUPPORTED, "physical core count unknown", "host"),
        numa_nodes=numa_node_count(),
        memory_total_bytes=memory_total,
        memory_available_bytes=memory_available,
        cpu_affinity=affinity,
        torch=probe_torch() if with_torch else TorchInfo(),
        cpu_max_mhz=cpu_max_mhz(),
        l3_cache_bytes=last_level_cache_bytes(),
    )
