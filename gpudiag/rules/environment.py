"""Environment rules: CUDA / PyTorch variables that slow every kernel, and allocator settings."""

from __future__ import annotations

from collections.abc import Iterator

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


@rule("env.cuda_limiting", category=CATEGORY, needs=())
def cuda_limiting_variables(evidence: EvidenceBundle) -> Iterator[Finding]:
    """CUDA / PyTorch environment variables that limit performance are set."""
    for name, (severity, why) in _LIMITING.items():
        value = evidence.env.get(name)
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


@rule("env.allocator_config", category=CATEGORY, needs=("gpu",))
def allocator_config(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Memory nearly full without expandable segments: fragmentation can cause OOM."""
    conf = evidence.env.get("PYTORCH_CUDA_ALLOC_CONF", "") or evidence.env.get(
        "PYTORCH_ALLOC_CONF", ""
    )
    if "expandable_segments:true" in conf.replace(" ", "").lower():
        return
    fullest = max(
        (f for g in evidence.system.gpus if (f := memory_used_fraction(g)) is not None),
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
