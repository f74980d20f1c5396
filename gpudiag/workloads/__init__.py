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

from gpudiag.errors import GpuDiagError

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


def get(name: str, **overrides: Any) -> Any:
    """A fresh demo ``gd.Workload``; ``overrides`` change its size (see ``parameters(name)``)."""
    build = _builder(name)
    accepted = parameters(name)
    unknown = sorted(set(overrides) - set(accepted))
    if unknown:
        raise GpuDiagError(
            f"demo workload {name!r} has no parameter {', '.join(unknown)}; it takes: "
            + ", ".join(f"{k}={v!r}" for k, v in accepted.items())
        )
    workload = build(**overrides)
    # What the ranks of a distributed trial rebuild it from (gd.compare(..., nproc=N)).
    workload.rebuild_spec = (name, dict(overrides))
    return workload
