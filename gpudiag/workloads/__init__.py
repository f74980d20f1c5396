"""Built-in demo workloads that run on a CPU in seconds: ``get("gpt", seq_len=2048)``.

``gpt``: a small GPT-style LM in fp32 with hand-written (eager) attention, switchable like a
Hugging Face model's ``config._attn_implementation``; ``mlp``: a plain MLP; ``cnn``: a small CNN
with BatchNorm; ``input_bound``: a DataLoader with ``num_workers=0`` and heavy per-sample work.
Each is written the way a typical user first writes it, so the fixes have something to fix.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from gpudiag._values import finite_number, whole_number
from gpudiag.errors import GpuDiagError, WorkloadError
from gpudiag.probe.cuda import is_oom_error

# name -> (module, one-line description)
WORKLOADS: dict[str, tuple[str, str]] = {
    "gpt": ("gpudiag.workloads.gpt", "small GPT-style LM, fp32, eager attention, AdamW"),
    "mlp": ("gpudiag.workloads.mlp", "fp32 MLP classifier, Adam"),
    "cnn": ("gpudiag.workloads.cnn", "small fp32 CNN with BatchNorm, SGD + momentum"),
    "input_bound": (
        "gpudiag.workloads.input_bound",
        "DataLoader(num_workers=0) with heavy per-sample work",
    ),
}


def names() -> tuple[str, ...]:
    return tuple(WORKLOADS)


def parameters(name: str) -> dict[str, Any]:
    """The overrides ``get(name, ...)`` accepts, with their defaults."""
    build = _builder(name)
    return {p.name: p.default for p in inspect.signature(build).parameters.values()}


def _builder(name: str) -> Any:
    if name not in WORKLOADS:
        raise GpuDiagError(f"unknown demo workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    return importlib.import_module(WORKLOADS[name][0]).build


# Sizes and counts of a demo (layers, widths, sequence length, batch): at least 1, and at
# most this (16 Mi); the memory check below then says whether the model fits this machine.
MAX_SIZE = 1 << 24
_MAY_BE_ZERO = frozenset({"seed", "num_workers", "dropout"})


def checked_overrides(name: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` with each value checked against its parameter's default type: whole
    numbers (ASCII digits) from 1 to MAX_SIZE (0 for a seed or a worker count), finite numbers,
    true/false, text; a WorkloadError naming the parameter and its range otherwise."""
    accepted = parameters(name)
    unknown = sorted(set(overrides) - set(accepted))
    if unknown:
        raise GpuDiagError(
            f"demo workload {name!r} has no parameter {', '.join(unknown)}; it takes: "
            + ", ".join(f"{k}={v!r}" for k, v in accepted.items())
        )
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        default, field = accepted[key], f"{name} {key}"
        low = 0 if key in _MAY_BE_ZERO else 1
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise WorkloadError(f"{field} must be true or false, got {value!r}")
            out[key] = value
        elif isinstance(default, int):
            out[key] = whole_number(value, field, low=low, high=MAX_SIZE, error=WorkloadError)
        elif isinstance(default, float):
            high = 1.0 if key == "dropout" else None
            out[key] = finite_number(
                value, field, low=0, high=high, low_open=key not in _MAY_BE_ZERO,
                error=WorkloadError,
            )  # fmt: skip
        elif isinstance(default, str):
            if not isinstance(value, str):
                raise WorkloadError(f"{field} must be text, got {value!r}")
            out[key] = value
        else:
            out[key] = value
    return out


def _too_big_for_memory(name: str, build: Any, overrides: dict[str, Any]) -> str:
    """Why the demo's model cannot be trained here, from its parameters counted on torch's
    meta device (nothing allocated): weights, gradients and two Adam moments, 16 bytes per
    parameter, against the host memory available now. "" when it fits or cannot be told."""
    import torch

    from gpudiag.probe.host import available_memory_bytes

    try:
        with torch.device("meta"):
            model = build(**{**overrides, "device": "meta"}).model
        params = sum(p.numel() for p in model.parameters())
    except Exception:  # a demo that cannot be built on the meta device: no early answer
        return ""
    need = 16 * params
    available = available_memory_bytes()
    if available is None or need <= available:
        return ""
    shown = ", ".join(f"{k}={v}" for k, v in overrides.items())
    return (
        f"demo workload {name!r} with {shown} has {params:,} parameters: training it needs "
        f"about {need / 2**30:,.1f} GiB for weights, gradients and optimizer state, more than "
        f"the {available / 2**30:,.1f} GiB available here; choose smaller sizes"
    )


def get(name: str, **overrides: Any) -> Any:
    """A fresh demo ``gd.Workload``; ``overrides`` change its size (see ``parameters(name)``).
    Values are checked first, and sizes whose model cannot fit in memory are refused before
    anything is allocated."""
    build = _builder(name)
    overrides = checked_overrides(name, overrides)
    too_big = _too_big_for_memory(name, build, overrides) if overrides else ""
    if too_big:
        raise WorkloadError(too_big)
    try:
        workload = build(**overrides)
    except (RuntimeError, MemoryError) as exc:
        if not is_oom_error(exc):
            raise
        raise WorkloadError(
            f"demo workload {name!r} could not be built: {str(exc).splitlines()[0][:200]}; "
            "choose smaller sizes"
        ) from None
    # What the ranks of a distributed trial rebuild it from (gd.compare(..., nproc=N)).
    workload.rebuild_spec = (name, dict(overrides))
    return workload
