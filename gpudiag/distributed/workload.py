"""The workload a rank rebuilds for itself: a demo name or an importable factory.

A distributed trial cannot ship a notebook's model to other processes (closures, open files and
GPU tensors do not pickle, and copying the weights would be the user's state leaving the
notebook). Each rank therefore *builds* the workload from a description that can travel:

- a demo name (``"gpt"``, ``"mlp"``, ...; ``gpudiag.workloads.names()``) with its overrides, or
- ``"package.module:function"``: a function importable in a fresh Python process (a module on
  ``sys.path`` or next to the notebook, not a cell) that returns a ``gd.Workload``; the
  keyword overrides are passed to it and must be picklable (numbers, strings, lists, dicts).

The function is called with ``seed`` and ``device`` when it accepts them, so every rank starts
from the same weights on its own device.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
from collections.abc import Mapping
from typing import Any

from gpudiag.errors import WorkloadSpecError
from gpudiag.step import Workload


def spec_of(workload: Any) -> str:
    """The text a rank rebuilds ``workload`` from: a string is kept; a demo workload gives its
    name; a ``gd.Workload`` built in a notebook cannot travel and is refused with how to fix it."""
    if isinstance(workload, str):
        return workload
    if isinstance(workload, Workload):
        raise WorkloadSpecError(
            f"a distributed trial rebuilds the workload inside every rank, and the notebook's "
            f"{workload.name!r} object cannot travel there: pass a demo name (e.g. 'gpt') or "
            "'package.module:function' naming an importable function that returns the "
            "gd.Workload (see gpudiag.distributed.workload)"
        )
    raise WorkloadSpecError(
        f"a workload for a distributed trial is a demo name or 'module:function', not "
        f"{type(workload).__name__}"
    )


def check_picklable(overrides: Mapping[str, Any]) -> None:
    try:
        pickle.dumps(dict(overrides))
    except Exception as exc:  # pickling raises many kinds (PicklingError, TypeError, ...)
        raise WorkloadSpecError(
            f"workload overrides must be picklable to reach the ranks: {exc}"
        ) from None


def _accepts(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def build(
    spec: str, overrides: Mapping[str, Any] | None = None, *, device: str = "cpu", seed: int = 0
) -> Workload:
    """Rebuild the workload named by ``spec`` on ``device`` (called inside every rank)."""
    from gpudiag import workloads

    overrides = dict(overrides or {})
    if ":" not in spec:
        if spec not in workloads.names():
            raise WorkloadSpecError(
                f"unknown workload {spec!r}: a demo name ({', '.join(workloads.names())}) or "
                "'package.module:function'"
            )
        accepted = workloads.parameters(spec)
        extra = {k: v for k, v in (("device", device), ("seed", seed)) if k in accepted}
        return workloads.get(spec, **{**extra, **overrides})
    module_name, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise WorkloadSpecError(
            f"cannot import {spec!r} in the rank process ({exc}); the module must be importable "
            "from a fresh Python (on sys.path or in the working directory)"
        ) from None
    kwargs = dict(overrides)
    for name, value in (("device", device), ("seed", seed)):
        if name not in kwargs and _accepts(fn, name):
            kwargs[name] = value
    workload = fn(**kwargs)
    if not isinstance(workload, Workload):
        raise WorkloadSpecError(f"{spec} returned {type(workload).__name__}, not a gd.Workload")
    if workload.model is None or not workload.owns_step:
        raise WorkloadSpecError(
            f"{spec} must return a model workload (gd.Workload(model, batch=...)): a step "
            "function cannot be wrapped in DDP or FSDP"
        )
    if str(workload.device) != device:
        workload.model.to(device)
    return workload
