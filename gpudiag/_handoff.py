"""Hand-offs from a lower layer to code above it, registered by name from above.

``gd.compare(..., nproc=N)`` (``gpudiag.experiment``) hands the trial to the multi-rank
launcher in ``gpudiag.distributed``, which sits above experiment (its ranks rebuild the demo
workloads). experiment never imports it: the package facade registers the launcher here as
``"module:attribute"``, as it names the view providers, and the first use imports it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from gpudiag.errors import GpuDiagError

# hand-off name -> the callable, or "module:attribute" naming it
_handoffs: dict[str, Callable[..., Any] | str] = {}


def register(name: str, target: Callable[..., Any] | str) -> None:
    """``get(name)`` returns ``target`` (a ``"module:attribute"`` string is imported then)."""
    _handoffs[name] = target


def get(name: str) -> Callable[..., Any]:
    """The callable registered as ``name``; GpuDiagError when nothing registered it."""
    try:
        target = _handoffs[name]
    except KeyError:
        raise GpuDiagError(
            f"nothing is registered to handle {name!r}: import gpudiag (the package registers it)"
        ) from None
    if isinstance(target, str):
        module, _, attribute = target.partition(":")
        target = getattr(importlib.import_module(module), attribute)
        _handoffs[name] = target
    return target
