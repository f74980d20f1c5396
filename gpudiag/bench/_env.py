"""Where a benchmark runs and what it is measured against: device, timer, cache size, peaks."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudiag._values import digits, whole_number
from gpudiag.bench.timing import Timer, host_timer
from gpudiag.errors import ArgumentError, GpuDiagError
from gpudiag.probe.readings import Reading, Status, na, ok

if TYPE_CHECKING:
    from gpudiag.probe.model import HostInfo
    from gpudiag.probe.system import SystemReport

DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")

_DTYPE_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "f32": "fp32",
    "tensorfloat32": "tf32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    "float8": "fp8",
    "fp8_e4m3": "fp8",
    "e4m3": "fp8",
}

# Assumed when the last-level cache size cannot be read: large enough for current server CPUs'
# L3 per socket and every NVIDIA L2 up to Blackwell (126 MiB on B200 is larger: read it instead).
_FALLBACK_CACHE_BYTES = 64 << 20


def normalize_dtype(name: str) -> str:
    """'bfloat16' -> 'bf16'; an unknown name is a GpuDiagError listing the known ones."""
    key = str(name).strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise GpuDiagError(f"Unknown dtype {name!r}: use one of {', '.join(DTYPES)}.")
    return key


@dataclass(frozen=True, slots=True)
class Target:
    """The device a benchmark runs on."""

    kind: str  # "cuda" or "cpu"
    index: int | None = None
    name: str = ""

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def torch_device(self) -> str:
        return f"cuda:{self.index}" if self.is_cuda else "cpu"

    @property
    def label(self) -> str:
        return f"{self.torch_device} ({self.name})" if self.name else self.torch_device


def whole_numbers(
    values: Iterable[Any], field: str, low: int = 1, high: int = 1 << 50
) -> list[int]:
    """``values`` (sizes, lengths) as ints: ASCII digits or whole numbers within [low, high],
    else an ArgumentError naming ``field``; a single number or text is refused as a list."""
    if isinstance(values, (str, bytes, int, float)):
        raise ArgumentError(f"{field} is a list of numbers, got {values!r}")
    return [whole_number(v, field, low=low, high=high) for v in values]


def too_big(target: Target, nbytes: int) -> str:
    """Why buffers of ``nbytes`` cannot be allocated on ``target`` now ("" when they fit or
    the free memory is unknown): asked-for sizes beyond the free memory are refused before
    allocating, so a benchmark never pushes the machine into swap or the OOM killer."""
    from gpudiag.probe import cuda
    from gpudiag.probe.host import available_memory_bytes

    if target.is_cuda:
        info = cuda.mem_get_info(target.index)
        free = None if info is None else info[0]
    else:
        free = available_memory_bytes()
    if free is None or nbytes <= free:
        return ""
    where = "GPU" if target.is_cuda else "host"
    return (
        f"needs {nbytes / 2**30:,.1f} GiB of buffers, more than the {free / 2**30:,.1f} GiB of "
        f"{where} memory free: not run"
    )


def resolve_device(device: str | int | None) -> Target:
    """``None`` picks the current CUDA device when there is one, else the CPU."""
    from gpudiag.probe import cuda

    if device is None:
        device = "cuda" if cuda.available() else "cpu"
    if isinstance(device, int):
        device = f"cuda:{device}"
    text = str(device).strip().lower()
    if text == "cpu":
        return Target("cpu", None, cpu_model())
    if text.startswith("cuda"):
        if not cuda.available():
            raise GpuDiagError(
                f"Device {device!r} asked for, but no CUDA device is usable here (CPU-only torch "
                "build or no NVIDIA driver). Pass device='cpu' to measure the CPU."
            )
        _, _, idx = text.partition(":")
        import torch

        # "cuda" means torch's current device (set_device / LOCAL_RANK), which a tensor reveals.
        index = int(idx) if digits(idx) else int(torch.empty(0, device="cuda").device.index or 0)
        return Target("cuda", index, cuda.device_properties(index).name)
    raise GpuDiagError(f"Unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N'.")


def timer_for(target: Target) -> Timer:
    """CUDA events on a GPU (they time the kernels, not the launches); the host clock on a CPU."""
    if target.is_cuda:
        from gpudiag.probe import cuda

        index = target.index

        def device_timer() -> Any:
            return cuda.device_timer(index)

        return device_timer
    return host_timer()


def sync_for(target: Target) -> Any:
    if not target.is_cuda:
        return lambda: None
    from gpudiag.probe import cuda

    index = target.index
    return lambda: cuda.synchronize(index)


# --- host facts ------------------------------------------------------------------------------
# The probe layer owns hardware facts: a SystemReport's HostInfo, else a probe of this host.


def host_info(system: SystemReport | None = None) -> HostInfo | None:
    """The HostInfo of ``system``, else a fresh probe of this host (None if that fails)."""
    host = system.host if system is not None else None
    return host if host is not None else _probed_host()


@functools.cache
def _probed_host() -> HostInfo | None:
    try:
        from gpudiag.probe.host import probe_host

        return probe_host(with_torch=False)
    except Exception:  # the host probe is a convenience for labels and estimates
        return None


def cpu_model(system: SystemReport | None = None) -> str:
    host = host_info(system)
    reading = host.cpu_model if host is not None else None
    return str(reading.value) if reading is not None and reading.ok else "CPU"


def cpu_clock_mhz(system: SystemReport | None = None) -> Reading[float]:
    host = host_info(system)
    if host is not None and host.cpu_max_mhz.ok:
        return ok(float(host.cpu_max_mhz.get(0.0)), host.cpu_max_mhz.source or "host")
    from gpudiag.probe.host import cpu_max_mhz

    return cpu_max_mhz()  # a recorded report without the clock: this host's


def cpu_flags(system: SystemReport | None = None) -> tuple[str, ...]:
    host = host_info(system)
    return tuple(host.cpu_flags) if host is not None else ()


def cpu_compute_cores() -> int:
    """Cores a CPU benchmark actually uses: torch's intra-op threads, bounded by the affinity."""
    import torch

    from gpudiag.probe.host import usable_cpus

    return max(1, min(int(torch.get_num_threads()), usable_cpus()))


def last_level_cache_bytes(target: Target, system: SystemReport | None = None) -> tuple[int, str]:
    """(bytes, where the number came from) of the cache a rotating input must outgrow."""
    if target.is_cuda:
        from gpudiag.probe import cuda

        l2 = cuda.device_properties(target.index or 0).l2_cache_bytes
        if l2:
            return int(l2), "torch device properties (L2)"
        return _FALLBACK_CACHE_BYTES, "assumed (L2 size not reported)"
    host = host_info(system)
    reading = host.l3_cache_bytes if host is not None else None
    if reading is None or not reading.ok:
        from gpudiag.probe.host import last_level_cache_bytes as probed

        reading = probed()  # a recorded report without the size: this host's
    if reading.ok:
        return int(reading.get(0)), reading.source or "host"
    return _FALLBACK_CACHE_BYTES, "assumed (cache size unknown)"


# --- peaks -----------------------------------------------------------------------------------


def gpu_spec(target: Target) -> tuple[Any | None, str]:
    """(GpuSpec or None, reason when None) for a CUDA target."""
    try:
        from gpudiag import specs
    except ImportError:
        return None, "the spec table (gpudiag.specs) is not installed"
    try:
        spec = specs.lookup_gpu(target.name)
    except Exception as exc:  # an unknown board is a missing peak, not a failed benchmark
        return None, f"{target.name!r} not in the spec table ({exc})"
    if spec is None:
        return None, f"{target.name!r} is not in the spec table"
    return spec, ""


def gpu_supports(target: Target, dtype: str) -> tuple[bool, str]:
    """Whether the GPU has a fast path for ``dtype``; (False, reason) when not."""
    from gpudiag.probe import cuda

    cc = cuda.device_properties(target.index or 0).compute_capability
    feats: Any = None
    try:
        from gpudiag import specs

        feats = specs.features(cc)
    except Exception:  # fall back on the compute-capability thresholds below
        feats = None
    need = {"tf32": (8, 0), "bf16": (8, 0), "fp16": (7, 0), "fp8": (8, 9)}
    if dtype == "fp32":
        return True, ""
    flag = getattr(feats, dtype, None) if feats is not None else None
    supported = bool(flag) if flag is not None else cc >= need.get(dtype, (0, 0))
    if supported:
        return True, ""
    major, minor = need[dtype]
    return False, (
        f"{dtype} needs tensor cores of compute capability {major}.{minor}+; "
        f"this GPU is {cc[0]}.{cc[1]}"
    )


# FLOPs per cycle per core of a fused multiply-add vector unit: lanes x 2 (multiply + add) x
# units. The number of FMA units is the weakest assumption (two on most server cores).
_FMA_UNITS = 2


def cpu_peak_tflops(dtype: str, system: SystemReport | None = None) -> Reading[float]:
    """An ESTIMATED peak for a CPU: cores x clock x FLOPs/cycle from the vector extensions.

    The source text of the reading says it is an estimate and spells out the product. It is
    rough both ways: the clock is the one the OS reports (a virtual machine often reports the
    base clock while the core boosts above it; AVX-512 load can also pull the clock down), and
    the FMA unit count per core is assumed, not read.
    """
    flags = set(cpu_flags(system))
    if not flags:
        return na(Status.NOT_AVAILABLE, "CPU flags unknown: no estimate", "estimate")
    clock = cpu_clock_mhz(system)
    if not clock.ok:
        return na(Status.NOT_AVAILABLE, clock.reason, "estimate")
    if "avx512f" in flags:
        fp32_lanes, isa = 16, "AVX-512"
    elif "avx2" in flags and "fma" in flags:
        fp32_lanes, isa = 8, "AVX2+FMA"
    elif "asimd" in flags:
        fp32_lanes, isa = 4, "NEON"
    else:
        return na(Status.NOT_SUPPORTED, "no vector FMA extension recognised", "estimate")
    per_cycle: float
    if dtype == "fp32":
        per_cycle, what = fp32_lanes * 2 * _FMA_UNITS, f"{isa} fp32 FMA"
    elif dtype == "bf16":
        if "amx_bf16" in flags:
            per_cycle, what = 1024, "AMX bf16 tile multiply"
        elif "avx512_bf16" in flags:
            per_cycle, what = 2 * 16 * 2 * _FMA_UNITS, "AVX512-BF16 dot products"
        else:
            return na(Status.NOT_SUPPORTED, "no bf16 instructions: bf16 runs via fp32", "estimate")
    elif dtype == "fp16":
        if "amx_fp16" in flags:
            per_cycle, what = 1024, "AMX fp16 tile multiply"
        elif "avx512_fp16" in flags:
            per_cycle, what = 32 * 2 * _FMA_UNITS, "AVX512-FP16 FMA"
        else:
            return na(
                Status.NOT_SUPPORTED, "no fp16 arithmetic instructions on this CPU", "estimate"
            )
    elif dtype == "tf32":
        return na(Status.NOT_SUPPORTED, "TF32 is an NVIDIA tensor-core format", "estimate")
    else:
        return na(Status.NOT_SUPPORTED, "no fp8 matrix instructions on this CPU", "estimate")
    cores = cpu_compute_cores()
    mhz = float(clock.get(0.0))
    value = cores * mhz * 1e6 * per_cycle / 1e12
    source = (
        f"estimate: {cores} cores x {mhz:.0f} MHz ({clock.source}) x {per_cycle:g} FLOP/cycle "
        f"({what}, assuming {_FMA_UNITS} FMA units per core; boost clocks can exceed it)"
    )
    return ok(value, source)


def peak_tflops(target: Target, dtype: str, system: SystemReport | None = None) -> Reading[float]:
    """The dense peak for ``dtype``: the spec table on a GPU, an estimate on a CPU."""
    if not target.is_cuda:
        return cpu_peak_tflops(dtype, system)
    spec, reason = gpu_spec(target)
    if spec is None:
        return na(Status.NOT_FOUND, reason, "specs")
    value = spec.peak_tflops_for(dtype)
    if value is None or not math.isfinite(float(value)):
        return na(
            Status.NOT_SUPPORTED, f"no {dtype} peak for {target.name} in the spec table", "specs"
        )
    return ok(float(value), f"specs: {target.name}")


def peak_memory_gbps(target: Target) -> Reading[float]:
    if not target.is_cuda:
        return na(Status.NOT_AVAILABLE, "no spec table for host memory", "specs")
    spec, reason = gpu_spec(target)
    if spec is None:
        return na(Status.NOT_FOUND, reason, "specs")
    value = getattr(spec, "memory_bandwidth_gbps", None)
    if not value:
        return na(Status.NOT_AVAILABLE, f"no memory bandwidth for {target.name}", "specs")
    return ok(float(value), f"specs: {target.name}")
