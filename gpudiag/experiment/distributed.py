"""``gd.compare(workload, fixes=["fsdp.wrap"], nproc=2)``'s hand-off to the multi-rank trial.

The trial itself (``gpudiag.distributed.compare``) sits above experiment: each rank rebuilds a
demo workload or an importable factory and wraps it in DDP or FSDP. experiment does not import
it; ``compare_distributed`` here is the launcher the package facade registered by name
(``gpudiag._handoff``), imported on first use.
"""

from __future__ import annotations

from typing import Any

from gpudiag import _handoff

HANDOFF = "compare_distributed"


def __getattr__(name: str) -> Any:
    if name == "compare_distributed":
        return _handoff.get(HANDOFF)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
