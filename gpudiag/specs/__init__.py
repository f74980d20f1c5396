"""What NVIDIA GPUs (and AMD Instinct accelerators) can do on paper: the spec table and
per-compute-capability SM limits (NVIDIA only).

Data lives in ``gpus.json`` and ``compute_capabilities.json`` next to this module (each row
names its source), loaded on first use. Stdlib only, so every layer may import it.
"""

from __future__ import annotations

from gpudiag.specs._cc import (
    FEATURE_SINCE,
    CcFeatures,
    ComputeCapability,
    SmLimits,
    SpecsError,
    UnknownComputeCapabilityError,
    architecture_name,
    cc_limits,
    features,
    has_feature,
    known_compute_capabilities,
    parse_compute_capability,
)
from gpudiag.specs._gpus import (
    DTYPES,
    GpuSpec,
    all_gpus,
    bandwidth_from_clock,
    derive_gpu_spec,
    lookup_device,
    lookup_gpu,
)

__all__ = [
    "DTYPES",
    "FEATURE_SINCE",
    "CcFeatures",
    "ComputeCapability",
    "GpuSpec",
    "SmLimits",
    "SpecsError",
    "UnknownComputeCapabilityError",
    "all_gpus",
    "architecture_name",
    "bandwidth_from_clock",
    "cc_limits",
    "derive_gpu_spec",
    "features",
    "has_feature",
    "known_compute_capabilities",
    "lookup_device",
    "lookup_gpu",
    "parse_compute_capability",
]
