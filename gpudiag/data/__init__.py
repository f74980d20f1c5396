"""Data shipped with gpudiag: recorded machines for demos and notebooks (recordings/NOTICE.md)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def recording(name: str) -> Path:
    """Path of a shipped recording, e.g. ``recording("a100-sxm4-80gb-mig.nvidia-smi.xml")``."""
    path = Path(str(resources.files("gpudiag.data") / "recordings" / name))
    if not path.is_file():
        from gpudiag.errors import ReplayError

        known = sorted(p.name for p in path.parent.glob("*") if p.name != "NOTICE.md")
        raise ReplayError(f"no shipped recording {name!r}; known: {', '.join(known)}")
    return path


A100_MIG = "a100-sxm4-80gb-mig.nvidia-smi.xml"
H100_NODE_TOPOLOGY = "h100-sxm5-8x.topo-m.txt"  # `nvidia-smi topo -m` of an 8x H100 SXM5 node
