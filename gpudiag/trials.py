"""``gd.compare``: the one entry of a before/after trial, which picks the trial that runs it.

In one process (``nproc`` None) the protocol of :mod:`gpudiag.experiment.compare` runs it: the
baseline and each fix in isolated, interleaved trials. With ``nproc=N`` the multi-rank trial of
:mod:`gpudiag.distributed.compare` runs it as N ranks through torchrun (DDP baseline vs
``fsdp.wrap``). This module sits above both, so neither imports the other; the multi-rank
trial is imported only when asked for.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

from gpudiag.errors import GpuDiagError
from gpudiag.experiment import compare as protocol
from gpudiag.experiment.arguments import check_compare
from gpudiag.experiment.comparison import ArmSpec, Comparison

# The one-process protocol's options that the multi-rank trial takes as well.
_SHARED = ("seed", "confidence", "tolerance", "progress")


def compare(
    workload: Any,
    fixes: Iterable[ArmSpec] = (),
    *,
    nproc: int | None = None,
    **options: Any,
) -> Comparison:
    """Compare ``workload`` before and after ``fixes``; see gpudiag.experiment.compare.compare.

    ``options`` are that protocol's keyword arguments (``combine``, ``time_budget_s``,
    ``adaptive``, ``min_rounds``, ``confidence``, ``seed``, ``progress``, ...). ``nproc=N``
    runs the trial as N ranks through torchrun instead; then ``options`` may also be the
    keyword arguments of gpudiag.distributed.compare.compare_distributed (``ddp=``,
    ``accumulation=``, ``workload_args=``, ``rounds=``, ...), and of the protocol's own only
    ``seed``, ``confidence``, ``tolerance`` and ``progress`` apply (the others are checked,
    then not used).
    """
    known = inspect.signature(protocol.compare).parameters
    if nproc is None:
        unknown = sorted(set(options) - set(known))
        if unknown and not any(p.kind is p.VAR_KEYWORD for p in known.values()):
            raise GpuDiagError(f"unknown argument(s) {', '.join(unknown)} of compare")
        return protocol.compare(workload, fixes, **options)
    given = {name: value for name, value in options.items() if name in known}
    defaults = {n: p.default for n, p in known.items() if p.default is not p.empty}
    check_compare({**defaults, **given})  # the protocol's numbers, before anything runs
    from gpudiag.distributed.compare import compare_distributed

    rank_options = {n: v for n, v in options.items() if n not in known or n in _SHARED}
    ranks = inspect.signature(compare_distributed).parameters
    unknown = sorted(set(rank_options) - set(ranks))
    if unknown:
        raise GpuDiagError(f"unknown argument(s) {', '.join(unknown)} of compare(nproc=...)")
    for name in _SHARED:
        rank_options.setdefault(name, defaults[name])
    return compare_distributed(workload, fixes, nproc=nproc, **rank_options)


__all__ = ["compare"]
