"""Runtime rules: torch switches of this process that cost speed or do nothing here.

The evidence is ``gpudiag.probe.runtime.runtime_state()`` (read by ``gd.diagnose``), so these
rules see what the live process has set, wherever in the code it was set. ``gpudiag.rules.code``
catches some of the same mistakes in source text; the ids differ (``runtime.*`` vs ``code.*``)
and each finding names where its evidence came from.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from gpudiag._values import digits
from gpudiag.rules._facts import gpu_label, trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, FixRef, NotEvaluated, Severity

if TYPE_CHECKING:
    from gpudiag.analysis.trace.report import TraceReport

CATEGORY = "runtime"
SOURCE = "torch switches (this process)"

# Convolution kernels at or above this share of GPU compute time make cuDNN's algorithm
# choice matter; at 30 % it is a large part of the step.
CONV_SHARE = 0.10
CONV_SHARE_HIGH = 0.30
# torch threads at or below this fraction of the cores the process may use is "far below".
THREADS_FRACTION = 0.5
_SDPA_MATH_OP = "aten::_scaled_dot_product_attention_math"
_SDPA_OPS = ("aten::scaled_dot_product_attention", _SDPA_MATH_OP)
# gd.profile names its traces <fn>.<time>.<pid>.pt.trace.json.gz.
_PROFILE_FILE = re.compile(r"\.(\d+)\.pt\.trace\.json(?:\.gz)?$")
_CONV_KERNEL = re.compile(r"conv|wgrad|dgrad|winograd", re.I)


def _switch(name: str, value: Any) -> Evidence:
    return Evidence(name, value, source=SOURCE)


def _gpu(evidence: EvidenceBundle) -> Any:
    system = evidence.system
    return system.primary_gpu if system is not None else None


def _gpu_cc(evidence: EvidenceBundle) -> tuple[int, int] | None:
    gpu = _gpu(evidence)
    cc = gpu.compute_capability if gpu is not None else None
    return (int(cc[0]), int(cc[1])) if cc is not None else None


def _system_source(evidence: EvidenceBundle) -> str:
    return "recorded system" if evidence.system_report.is_recording else "system report"


def matmul_tf32(runtime: Mapping[str, Any]) -> tuple[bool | None, Evidence | None]:
    """Whether fp32 matmuls may use TF32 (or bf16) here, and the switch that says so.

    The newer ``torch.backends.cuda.matmul.fp32_precision`` wins when set ("tf32"/"ieee");
    "none" defers to the older ``get_float32_matmul_precision`` / ``allow_tf32``.
    """
    precision = runtime.get("matmul_fp32_precision")
    if precision in ("tf32", "ieee"):
        return precision == "tf32", _switch("torch.backends.cuda.matmul.fp32_precision", precision)
    level = runtime.get("float32_matmul_precision")
    if level is not None:
        return level in ("high", "medium"), _switch("torch.get_float32_matmul_precision()", level)
    allow = runtime.get("matmul_allow_tf32")
    if allow is not None:
        return bool(allow), _switch("torch.backends.cuda.matmul.allow_tf32", allow)
    return None, None


@rule("runtime.tf32", category=CATEGORY, needs=("runtime", "gpu"))
def tf32_without_tf32(evidence: EvidenceBundle) -> Iterator[Finding]:
    """TF32 matmuls switched on in this process on a GPU without TF32 (cc < 8.0)."""
    cc = _gpu_cc(evidence)
    if cc is None or cc >= (8, 0):
        return
    enabled, switch = matmul_tf32(evidence.runtime or {})
    if not enabled or switch is None:
        return
    label = f"cc {cc[0]}.{cc[1]}"
    yield Finding(
        "runtime.tf32_without_tf32",
        Severity.INFO,
        CATEGORY,
        f"this process has TF32 matmuls switched on, but {gpu_label(_gpu(evidence))} ({label}) "
        "has no TF32: the switch does nothing",
        (switch, Evidence("compute capability", label, source=_system_source(evidence))),
        threshold="TF32 enabled in torch's switches and compute capability < 8.0",
        fix=FixRef("precision.fp16") if cc >= (7, 0) else None,
        instruction="for tensor-core speed on this GPU use fp16 autocast with a GradScaler"
        if cc >= (7, 0)
        else "this GPU has no tensor cores: fp32 is the right precision",
    )


@rule("runtime.anomaly_detection", category=CATEGORY, needs=("runtime",))
def anomaly_detection(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Autograd anomaly detection on: every op records a traceback, every backward op checks
    its output for NaN."""
    runtime = evidence.runtime or {}
    if not runtime.get("anomaly_detection"):
        return
    gpu = evidence.has("gpu")
    items = [_switch("torch.is_anomaly_enabled()", True)]
    if "anomaly_check_nan" in runtime:
        items.append(_switch("torch.is_anomaly_check_nan_enabled()", runtime["anomaly_check_nan"]))
    yield Finding(
        "runtime.anomaly_detection_on",
        Severity.HIGH if gpu else Severity.MEDIUM,
        CATEGORY,
        "autograd anomaly detection is on: each forward op saves a Python traceback and each "
        "backward op is checked for NaN" + (" (a GPU-to-host sync per backward op)" if gpu else ""),
        tuple(items),
        threshold="torch.is_anomaly_enabled() is True (HIGH with a GPU: the NaN checks sync)",
        instruction="torch.autograd.set_detect_anomaly(False) (or drop the detect_anomaly() "
        "context): keep it for hunting a NaN, not for training runs",
    )


@rule("runtime.determinism", category=CATEGORY, needs=("runtime", "gpu"))
def deterministic_algorithms(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Deterministic algorithms or cudnn.deterministic on: slower kernels are chosen."""
    runtime = evidence.runtime or {}
    items = []
    if runtime.get("deterministic_algorithms"):
        items.append(_switch("torch.are_deterministic_algorithms_enabled()", True))
    if runtime.get("cudnn_deterministic"):
        items.append(_switch("torch.backends.cudnn.deterministic", True))
    if not items:
        return
    yield Finding(
        "runtime.deterministic_algorithms",
        Severity.LOW,
        CATEGORY,
        "deterministic algorithms are on in this process: cuDNN and scatter/index kernels use "
        "slower deterministic variants",
        tuple(items),
        threshold="torch.use_deterministic_algorithms(True) or cudnn.deterministic = True",
        instruction="turn them off outside reproducibility runs: "
        "torch.use_deterministic_algorithms(False); torch.backends.cudnn.deterministic = False",
    )


def trace_from_this_process(evidence: EvidenceBundle) -> bool:
    """True when a rank of the trace was captured by this process (gd.profile's file name
    carries the process id), so this process's switches were the ones in force."""
    pid = (evidence.runtime or {}).get("pid")
    if pid is None:
        return False
    for rank in evidence.trace.ranks if evidence.trace is not None else ():
        match = _PROFILE_FILE.search(os.path.basename(str(rank.path)))
        if match is not None and int(match.group(1)) == int(pid):
            return True
    return False


def _is_conv(kernel: Any) -> bool:
    op = kernel.launched_by
    return "conv" in op.lower() if op else bool(_CONV_KERNEL.search(kernel.name))


def conv_time(trace: TraceReport) -> tuple[float, float]:
    """Convolution kernel time and all compute kernel time (microseconds) in the trace."""
    compute = [k for k in trace.kernels() if k.category == "compute"]
    total = sum(k.total_us for k in compute)
    return sum(k.total_us for k in compute if _is_conv(k)), total


@rule("runtime.cudnn", category=CATEGORY, needs=("runtime", "gpu_trace"))
def cudnn_switches(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """cuDNN disabled, or cudnn.benchmark off, while convolutions take GPU time."""
    runtime = evidence.runtime or {}
    conv_us, compute_us = conv_time(evidence.trace_report)
    share = conv_us / compute_us if compute_us > 0 else 0.0
    if share < CONV_SHARE or runtime.get("cudnn_available") is False:
        return
    if not trace_from_this_process(evidence):
        yield NotEvaluated(
            "runtime.cudnn",
            "a trace captured in this process (this one comes from another run, whose cuDNN "
            "switches are not known)",
        )
        return
    src = trace_source(evidence.trace)
    conv = (
        Evidence("convolution kernel time", round(conv_us / 1e3, 2), "ms", src),
        Evidence("share of GPU compute time", round(100 * share, 1), "%", src),
    )
    if runtime.get("cudnn_enabled") is False:
        yield Finding(
            "runtime.cudnn_disabled",
            Severity.HIGH if share >= CONV_SHARE_HIGH else Severity.MEDIUM,
            CATEGORY,
            f"cuDNN is disabled in this process while convolutions take {share:.0%} of GPU "
            "compute time: they run on PyTorch's slower native kernels",
            (_switch("torch.backends.cudnn.enabled", False), *conv),
            threshold=f"cudnn.enabled is False and convolutions >= {CONV_SHARE:.0%} of compute",
            instruction="torch.backends.cudnn.enabled = True",
        )
        return
    if runtime.get("cudnn_benchmark") is not False:
        return
    yield Finding(
        "runtime.cudnn_benchmark_off",
        Severity.MEDIUM if share >= CONV_SHARE_HIGH else Severity.LOW,
        CATEGORY,
        f"cudnn.benchmark is off while convolutions take {share:.0%} of GPU compute time: "
        "cuDNN uses its heuristic algorithm instead of timing the candidates",
        (_switch("torch.backends.cudnn.benchmark", False), *conv),
        threshold=f"cudnn.benchmark is False and convolutions >= {CONV_SHARE:.0%} of compute",
        fix=FixRef("cudnn.benchmark"),
        instruction="torch.backends.cudnn.benchmark = True; it pays off when input shapes "
        "repeat (each new shape is timed once)",
    )


# SDPA backends (attention.backend's names) and the switch that enables each.
_SDPA_SWITCHES = {"flash": "sdp_flash", "efficient": "sdp_mem_efficient", "cudnn": "sdp_cudnn"}


def _fused_backends(evidence: EvidenceBundle, device_type: str) -> list[str]:
    """Fused SDPA backends this hardware runs (the CPU has flash only), best first."""
    from gpudiag.fixes import Fix

    names = ("flash", "efficient", "cudnn") if device_type == "cuda" else ("flash",)
    return [
        name
        for name in names
        if Fix("attention.backend", backend=name).supported(evidence.system, device_type)[0]
    ]


@rule("runtime.sdpa_backends", category=CATEGORY, needs=("runtime", "system"))
def sdpa_math_only(evidence: EvidenceBundle) -> Iterator[Finding]:
    """SDPA's fused backends switched off, leaving only the math path, where they would run."""
    runtime = evidence.runtime or {}
    if runtime.get("sdp_math") is False or "sdp_flash" not in runtime:
        return
    device_type = "cuda" if evidence.has("gpu") else "cpu"
    switches = ("flash", "efficient", "cudnn") if device_type == "cuda" else ("flash",)
    if all(runtime.get(_SDPA_SWITCHES[name], True) for name in switches):
        return
    runnable = _fused_backends(evidence, device_type)
    if not runnable or any(runtime.get(_SDPA_SWITCHES[name], True) for name in runnable):
        return
    trace = evidence.trace
    if trace is not None and trace_from_this_process(evidence):
        calls = {op.name for op in trace.top_cpu_ops(10_000)}
        if not calls.intersection(_SDPA_OPS):
            return  # the workload does not call SDPA: the switches cost nothing
    items = tuple(
        _switch(f"torch.backends.cuda.{key.removeprefix('sdp_')}_sdp_enabled()", runtime[key])
        for key in (*(_SDPA_SWITCHES[name] for name in switches), "sdp_math")
        if key in runtime
    )
    where = gpu_label(_gpu(evidence)) if device_type == "cuda" else "this CPU"
    yield Finding(
        "runtime.sdpa_math_only",
        Severity.LOW,
        CATEGORY,
        "this process has switched off the fused SDPA backends that "
        f"{where} runs ({', '.join(runnable)}): scaled_dot_product_attention falls back to its "
        "math path",
        items,
        threshold="every fused SDPA backend the hardware supports is disabled, math enabled",
        fix=FixRef("attention.backend", {"backend": runnable[0]}),
        instruction="re-enable them (torch.backends.cuda.enable_flash_sdp(True), "
        "enable_mem_efficient_sdp(True)), or pick one per call with "
        "torch.nn.attention.sdpa_kernel(...)",
    )


def _usable_cores(evidence: EvidenceBundle, runtime: Mapping[str, Any]) -> int | None:
    """Cores one process may use: the affinity, capped at the physical cores (torch's default
    thread count), shared among the local ranks torchrun started."""
    cores = runtime.get("cpu_affinity") or runtime.get("cpu_count")
    if not cores:
        return None
    physical = evidence.system_report.host.physical_cores.get()
    if physical:
        cores = min(int(cores), int(physical))
    local_ranks = (evidence.env or {}).get("LOCAL_WORLD_SIZE", "1")
    ranks = int(local_ranks) if digits(local_ranks) and 0 < int(local_ranks) < 1 << 20 else 1
    return max(1, int(cores) // ranks)


@rule("runtime.cpu_threads", category=CATEGORY, needs=("runtime", "system"))
def cpu_threads(evidence: EvidenceBundle) -> Iterator[Finding]:
    """torch uses far fewer threads than the cores it may use, on a machine without a GPU."""
    if evidence.has("gpu"):
        return
    runtime = evidence.runtime or {}
    threads = runtime.get("num_threads")
    cores = _usable_cores(evidence, runtime)
    if not threads or not cores or threads > THREADS_FRACTION * cores or cores - threads < 2:
        return
    job_env = evidence.env or {}
    env = {k: job_env[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in job_env}
    yield Finding(
        "runtime.cpu_threads_low",
        Severity.LOW,
        CATEGORY,
        f"torch runs its CPU ops on {threads} thread(s) while this process may use {cores} "
        "cores: matmuls and convolutions use a fraction of the CPU",
        (
            _switch("torch.get_num_threads()", threads),
            Evidence("usable cores", cores, source="host (affinity, physical cores)"),
            *(Evidence(k, v, source="environment") for k, v in env.items()),
        ),
        threshold=f"torch threads <= {THREADS_FRACTION:.0%} of usable cores, no GPU",
        instruction=f"torch.set_num_threads({cores})"
        + (f", or unset {' / '.join(env)}" if env else "")
        + "; keep it low only when several processes share these cores",
    )
