"""Environment fixes (allocator, NCCL) exported as variables, and advice-only fixes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from gpudiag.fixes.proof import Observation, Proof, applied, not_applied
from gpudiag.fixes.spec import FixParams, FixSpec, register

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport

# Values stay plain tokens so an exported line can never smuggle shell syntax. Matched with
# fullmatch: "$" alone also matches before a trailing newline ("NCCL_ALGO\n" would pass).
_SAFE_VALUE = re.compile(r"[A-Za-z0-9_.,:=/+\-]*")
_NCCL_NAME = re.compile(r"NCCL_[A-Z0-9_]+")


class _Environment(FixSpec):
    """Variables read when the process starts: exported (Recipe.to_env(), torchrun_command()),
    never applied live; the proof reads them back in the process that runs."""

    def proof(
        self, params: Mapping[str, Any], arm: Observation, baseline: Observation | None
    ) -> Proof:
        wanted = self.env(params)
        wrong = {k: v for k, v in wanted.items() if arm.environ.get(k) != v}
        if not wrong:
            return applied(
                self.id,
                ", ".join(f"{k}={v}" for k, v in wanted.items()) + " read back in the process",
            )
        seen = "; ".join(
            f"{k} is {arm.environ[k]!r}" if k in arm.environ else f"{k} is not set" for k in wrong
        )
        return not_applied(
            self.id,
            f"{seen} in the process: environment variables are read when it starts",
            manual="export "
            + " ".join(f"{k}={v}" for k, v in wrong.items())
            + " before starting (Recipe.to_env())",
        )


class AllocatorParams(FixParams):
    expandable_segments: bool | None = True
    max_split_size_mb: int | None = Field(None, ge=21)  # the allocator rejects <= 20


@register
class AllocatorConfig(_Environment):
    id = "allocator.config"
    summary = (
        "Configure PyTorch's CUDA caching allocator (PYTORCH_CUDA_ALLOC_CONF): expandable segments "
        "or a split-size cap reduce fragmentation out-of-memory errors."
    )
    Params = AllocatorParams

    def supported(
        self, params: Mapping[str, Any], system: SystemReport | None, device_type: str
    ) -> tuple[bool, str]:
        if device_type != "cuda":
            return False, "the CUDA caching allocator is not used on the CPU"
        return True, ""

    def env(self, params: Mapping[str, Any]) -> dict[str, str]:
        parts = []
        if params.get("expandable_segments") is not None:
            parts.append(f"expandable_segments:{bool(params['expandable_segments'])}")
        if params.get("max_split_size_mb") is not None:
            parts.append(f"max_split_size_mb:{int(params['max_split_size_mb'])}")
        return {"PYTORCH_CUDA_ALLOC_CONF": ",".join(parts)} if parts else {}


class NcclParams(FixParams):
    variables: dict[str, str] = Field(default_factory=dict)

    @field_validator("variables")
    @classmethod
    def _names_and_values(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not isinstance(name, str) or not _NCCL_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an NCCL variable (NCCL_ followed by capitals)")
            if not _SAFE_VALUE.fullmatch(text):
                raise ValueError(f"value of {name} may hold only letters, digits and _.,:=/+-")
        return value


@register
class NcclEnv(_Environment):
    id = "nccl.env"
    summary = "Set NCCL environment variables (algorithm, protocol, channels, network interface)."
    Params = NcclParams

    def normalize(self, params: Mapping[str, Any]) -> dict[str, Any]:
        # gd.Fix("nccl.env", NCCL_ALGO="Ring") and "nccl.env:NCCL_ALGO=Ring" both work.
        out = dict(params)
        loose = {k: out.pop(k) for k in list(out) if k.startswith("NCCL_")}
        if loose:
            out["variables"] = {
                **dict(out.get("variables") or {}),
                **{k: str(v) for k, v in loose.items()},
            }
        return out

    def supported(
        self, params: Mapping[str, Any], system: SystemReport | None, device_type: str
    ) -> tuple[bool, str]:
        if device_type != "cuda":
            return False, "NCCL runs only between NVIDIA GPUs (CPU jobs use gloo)"
        return True, ""

    def describe(self, params: Mapping[str, Any]) -> str:
        variables = params.get("variables") or {}
        listed = ", ".join(f"{k}={v}" for k, v in variables.items()) or "none given"
        return f"{self.summary} Variables: {listed}."

    def env(self, params: Mapping[str, Any]) -> dict[str, str]:
        return dict(params.get("variables") or {})


class SyncParams(FixParams):
    call_site: str = ""


@register
class SyncRemove(FixSpec):
    id = "sync.remove"
    summary = (
        "Remove host synchronisation from the training step (.item(), printing a tensor, .cpu(), "
        "torch.cuda.synchronize): keep values on the device and log every N steps."
    )
    Params = SyncParams
    main_param = "call_site"

    def describe(self, params: Mapping[str, Any]) -> str:
        site = params.get("call_site")
        return f"{self.summary} Found at: {site}." if site else self.summary
