"""This process's runtime state: torch's global switches and GPU profiling-counter permission.

The rules read these as plain JSON-able dicts. A switch that this torch lacks is absent; a
switch that exists but cannot be read now is absent too, with the reason under
``"unreadable"``. Nothing here touches ``torch.cuda`` (``gpudiag.probe.cuda`` is its door) or
initialises CUDA.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudiag._values import digits
from gpudiag.probe.host import affinity_cpus

# The NVIDIA driver's module parameters as it runs (Linux). ``RmProfilingAdminOnly: 1`` means
# only admin users may read GPU performance counters (NVIDIA's ERR_NVGPUCTRPERM page; set by
# the module option NVreg_RestrictProfilingToAdminUsers).
NVIDIA_PARAMS_PATH = "/proc/driver/nvidia/params"
PROFILING_PARAM = "RmProfilingAdminOnly"


def _read_switch(out: dict[str, Any], key: str, read: Callable[[], Any]) -> None:
    """Store ``read()`` under ``key``; a missing API leaves the key absent, any other error
    leaves it absent with its reason under ``out["unreadable"]``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = read()
    except AttributeError:
        return
    except Exception as exc:  # torch raises RuntimeError when legacy and new TF32 APIs are mixed
        first_line = (str(exc).splitlines() or [""])[0]
        out.setdefault("unreadable", {})[key] = f"{type(exc).__name__}: {first_line}"[:200]
        return
    out[key] = value if isinstance(value, (bool, int, float, str)) else str(value)


def torch_switches() -> dict[str, Any]:
    """torch's process-wide switches that change speed: TF32 and matmul precision, cuDNN,
    determinism, autograd anomaly detection, SDPA backends, and CPU threads.

    ``{}`` when torch cannot be imported. Keys (each only where this torch has the API):
    ``matmul_allow_tf32`` / ``cudnn_allow_tf32`` (legacy TF32 flags), ``float32_matmul_precision``
    ("highest", "high", "medium"), ``fp32_precision`` / ``matmul_fp32_precision`` /
    ``cudnn_conv_fp32_precision`` / ``cudnn_rnn_fp32_precision`` (the newer "ieee" / "tf32" /
    "none" settings, "none" meaning inherited), ``cudnn_available`` / ``cudnn_enabled`` /
    ``cudnn_benchmark`` / ``cudnn_deterministic``, ``deterministic_algorithms`` /
    ``deterministic_warn_only``, ``anomaly_detection`` / ``anomaly_check_nan``, ``sdp_flash`` /
    ``sdp_mem_efficient`` / ``sdp_math`` / ``sdp_cudnn``, ``num_threads`` /
    ``num_interop_threads``, plus ``cpu_count`` and ``cpu_affinity`` (cores this process may use),
    ``torch_version`` and ``pid``.
    """
    try:
        import torch
    except ImportError:
        return {}
    out: dict[str, Any] = {"torch_version": str(torch.__version__), "pid": os.getpid()}
    backends = torch.backends
    reads: dict[str, Callable[[], Any]] = {
        "matmul_allow_tf32": lambda: bool(backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": lambda: bool(backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "fp32_precision": lambda: str(backends.fp32_precision),  # type: ignore[attr-defined]
        "matmul_fp32_precision": lambda: str(backends.cuda.matmul.fp32_precision),
        "cudnn_conv_fp32_precision": lambda: str(
            backends.cudnn.conv.fp32_precision  # type: ignore[attr-defined]
        ),
        "cudnn_rnn_fp32_precision": lambda: str(
            backends.cudnn.rnn.fp32_precision  # type: ignore[attr-defined]
        ),
        "cudnn_available": lambda: bool(backends.cudnn.is_available()),
        "cudnn_enabled": lambda: bool(backends.cudnn.enabled),
        "cudnn_benchmark": lambda: bool(backends.cudnn.benchmark),
        "cudnn_deterministic": lambda: bool(backends.cudnn.deterministic),
        "deterministic_algorithms": lambda: bool(torch.are_deterministic_algorithms_enabled()),
        "deterministic_warn_only": lambda: bool(
            torch.is_deterministic_algorithms_warn_only_enabled()
        ),
        "anomaly_detection": lambda: bool(torch.is_anomaly_enabled()),
        "anomaly_check_nan": lambda: bool(torch.is_anomaly_check_nan_enabled()),
        "sdp_flash": lambda: bool(backends.cuda.flash_sdp_enabled()),
        "sdp_mem_efficient": lambda: bool(backends.cuda.mem_efficient_sdp_enabled()),
        "sdp_math": lambda: bool(backends.cuda.math_sdp_enabled()),
        "sdp_cudnn": lambda: bool(backends.cuda.cudnn_sdp_enabled()),
        "num_threads": lambda: int(torch.get_num_threads()),
        "num_interop_threads": lambda: int(torch.get_num_interop_threads()),
    }
    for key, read in reads.items():
        _read_switch(out, key, read)
    _read_switch(out, "cpu_count", lambda: int(os.cpu_count() or 0) or None)
    out["cpu_affinity"] = affinity_cpus()
    return {k: v for k, v in out.items() if v is not None}


def _params_value(text: str, name: str) -> str | None:
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            return value.strip()
    return None


def profiling_permission(
    params_path: str | os.PathLike[str] = NVIDIA_PARAMS_PATH,
) -> dict[str, Any]:
    """Who may read GPU performance counters here (what Nsight Compute, DCGM profiling fields
    and CUPTI metrics need). Same as ``grep RmProfilingAdminOnly /proc/driver/nvidia/params``.

    ``profiling_admin_only``: True when the driver limits counters to admin users (and
    ``euid``, this process's effective user id, says whether we are root). When the file cannot
    be read or lacks the parameter, the key is absent and ``profiling_unknown`` says why.
    """
    out: dict[str, Any] = {"profiling_params_path": str(params_path)}
    if hasattr(os, "geteuid"):
        out["euid"] = os.geteuid()
    try:
        text = Path(params_path).read_text(errors="replace")
    except FileNotFoundError:
        out["profiling_unknown"] = (
            f"{params_path} does not exist (no NVIDIA driver loaded, or not Linux)"
        )
        return out
    except OSError as exc:
        out["profiling_unknown"] = f"cannot read {params_path}: {exc.strerror or exc}"
        return out
    value = _params_value(text, PROFILING_PARAM)
    if value is None or not digits(value):
        out["profiling_unknown"] = f"{params_path} has no {PROFILING_PARAM} entry"
        return out
    out["profiling_admin_only"] = int(value) != 0
    return out


def runtime_state(params_path: str | os.PathLike[str] = NVIDIA_PARAMS_PATH) -> dict[str, Any]:
    """``torch_switches()`` and ``profiling_permission()`` in one dict: what ``gd.diagnose``
    records as its ``runtime`` evidence."""
    return {**torch_switches(), **profiling_permission(params_path)}
