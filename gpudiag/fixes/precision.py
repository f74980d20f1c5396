"""Precision fixes: TF32 switches, bf16 / fp16 autocast (fp16 with a GradScaler), FP8 (planned).

bf16 autocast runs for real on the CPU. The CUDA effects (TF32 tensor cores, fp16 with a CUDA
GradScaler) are checked through torch's flags and types on a CPU build: untested on a real GPU.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any, Literal

from pydantic import Field

from gpudiag.fixes import _system
from gpudiag.fixes.base import FixConflictError, FixKind, FixParams, FixSpec, FixTarget, register

# Tensor cores for fp16 arrived with Volta (compute capability 7.0); below it fp16 autocast
# runs but rarely pays off. Source: NVIDIA CUDA C++ Programming Guide, "Compute Capabilities".
FP16_TENSOR_CORES_CC = (7, 0)


@contextmanager
def tf32_enabled() -> Iterator[None]:
    import torch

    matmul = torch.backends.cuda.matmul
    before = (
        matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[0], before[1]
        torch.set_float32_matmul_precision(before[2])


@register
class TF32(FixSpec):
    id = "precision.tf32"
    kind = FixKind.AMBIENT
    summary = (
        "Let float32 matmuls and convolutions use TF32 tensor cores "
        "(torch.backends.cuda.matmul.allow_tf32, cudnn.allow_tf32, matmul precision 'high')."
    )
    order = 10

    def supported(
        self, params: Mapping[str, Any], system: Any, device_type: str
    ) -> tuple[bool, str]:
        if device_type != "cuda":
            return (
                False,
                "TF32 is a tensor-core format of NVIDIA GPUs (compute capability 8.0+); "
                "this run is on the CPU",
            )
        return _system.gpu_has(system, "tf32", "TF32", "8.0+", ": the flags would change nothing")

    def scope(self, params: Mapping[str, Any], target: FixTarget) -> Any:
        return tf32_enabled()

    def code(self, params: Mapping[str, Any]) -> list[str]:
        return [
            "torch.backends.cuda.matmul.allow_tf32 = True",
            "torch.backends.cudnn.allow_tf32 = True",
            'torch.set_float32_matmul_precision("high")',
        ]


def _cpu_low_precision(system: Any, dtype: str) -> tuple[bool, str]:
    flags = _system.cpu_flags(system)
    host = _system.host(system)
    if dtype == "bf16":
        fast = bool(getattr(host, "cpu_bf16_fast", False)) or any(
            f in flags for f in ("avx512_bf16", "amx_bf16", "bf16")
        )
        if fast:
            which = "AMX" if any(f.startswith("amx") for f in flags) else "AVX512-BF16"
            return True, f"this CPU has {which}"
        return False, (
            "this CPU has neither AVX512-BF16 nor AMX: bf16 matmuls would be emulated, "
            "usually slower than float32"
        )
    if any(f in flags for f in ("avx512_fp16", "amx_fp16")):
        return True, "this CPU has AVX512-FP16/AMX-FP16"
    return (
        False,
        "this CPU has no fp16 arithmetic (AVX512-FP16 or AMX-FP16): fp16 would be emulated",
    )


@register
class BF16(FixSpec):
    id = "precision.bf16"
    kind = FixKind.AMBIENT
    summary = (
        "Run the forward pass and the loss under bf16 autocast "
        "(torch.autocast(dtype=torch.bfloat16)); "
        "bf16 keeps float32's exponent range, so no GradScaler is needed."
    )
    group = "precision"
    order = 10

    def supported(
        self, params: Mapping[str, Any], system: Any, device_type: str
    ) -> tuple[bool, str]:
        if device_type == "cpu":
            ok, why = _cpu_low_precision(system, "bf16")
            return ok, "" if ok else why
        return _system.gpu_has(system, "bf16", "bf16", "8.0+", "; try precision.fp16 instead")

    def prepare(self, params: Mapping[str, Any], target: FixTarget, stack: ExitStack) -> None:
        import torch

        if target.autocast_dtype is not None or target.scaler is not None:
            raise FixConflictError("precision.bf16 cannot be combined with another precision fix")
        target.autocast_dtype = torch.bfloat16
        # Deliberately no GradScaler: bf16 has float32's exponent range, gradients do not
        # underflow, and a scaler would only add work.

        def clear() -> None:
            target.autocast_dtype = None

        stack.callback(clear)

    def code(self, params: Mapping[str, Any]) -> list[str]:
        return [
            "with torch.autocast(device_type, dtype=torch.bfloat16):  # forward and loss only",
            "    loss = loss_fn(model(batch), target)",
            "loss.backward()  # no GradScaler with bf16",
            "optimizer.step()",
        ]


@register
class FP16(FixSpec):
    id = "precision.fp16"
    kind = FixKind.AMBIENT
    summary = (
        "Run the forward pass and the loss under fp16 autocast, with a GradScaler that scales the "
        "loss so small gradients do not underflow."
    )
    group = "precision"
    order = 10

    def supported(
        self, params: Mapping[str, Any], system: Any, device_type: str
    ) -> tuple[bool, str]:
        if device_type == "cpu":
            ok, why = _cpu_low_precision(system, "fp16")
            return ok, "" if ok else why
        cc, name = _system.gpu_cc(system)
        if cc is None:
            return (
                False,
                f"the compute capability of {name} is unknown, so fp16 support cannot be checked",
            )
        if cc < FP16_TENSOR_CORES_CC:
            return False, (
                f"{name} (compute capability {_system.cc_text(cc)}) has no fp16 tensor cores "
                "(7.0+): "
                "autocast would rarely be faster"
            )
        return True, ""

    def prepare(self, params: Mapping[str, Any], target: FixTarget, stack: ExitStack) -> None:
        import torch

        if target.autocast_dtype is not None or target.scaler is not None:
            raise FixConflictError("precision.fp16 cannot be combined with another precision fix")
        target.autocast_dtype = torch.float16
        target.scaler = torch.amp.GradScaler(target.device_type)
        if not target.owns_step:
            target.notes.append(
                "fp16 needs the returned GradScaler in your step: scaler.scale(loss).backward(); "
                "scaler.step(optimizer); scaler.update()"
            )

        def clear() -> None:
            target.autocast_dtype = None
            target.scaler = None

        stack.callback(clear)

    def code(self, params: Mapping[str, Any]) -> list[str]:
        return [
            "scaler = torch.amp.GradScaler(device_type)",
            "with torch.autocast(device_type, dtype=torch.float16):  # forward and loss only",
            "    loss = loss_fn(model(batch), target)",
            "scaler.scale(loss).backward()",
            "scaler.step(optimizer)",
            "scaler.update()",
        ]


class FP8Params(FixParams):
    fp8_format: Literal["E4M3", "HYBRID"] = "HYBRID"
    amax_history_len: int = Field(16, ge=1, le=1024)
    amax_compute_algo: Literal["max", "most_recent"] = "max"


@register
class FP8(FixSpec):
    id = "precision.fp8"
    kind = FixKind.STRUCTURAL
    summary = (
        "Swap linear layers for Transformer Engine modules and run them under fp8_autocast with a "
        "delayed-scaling recipe (format, amax history)."
    )
    Params = FP8Params
    group = "precision"
    implemented = False
    order = 10

    def supported(
        self, params: Mapping[str, Any], system: Any, device_type: str
    ) -> tuple[bool, str]:
        if device_type != "cuda":
            return (
                False,
                "FP8 tensor cores exist only on NVIDIA GPUs of compute capability 8.9+ "
                "(Ada, Hopper)",
            )
        has_fp8 = _system.gpu_has(system, "fp8", "FP8", "8.9+")
        if not has_fp8[0]:
            return has_fp8
        if not _system.package_installed("transformer_engine"):
            return (
                False,
                "Transformer Engine is not installed: pip install 'transformer-engine[pytorch]'",
            )
        return True, ""

    def describe(self, params: Mapping[str, Any]) -> str:
        return (
            f"{self.summary} Recipe: DelayedScaling("
            f"fp8_format=Format.{params.get('fp8_format', 'HYBRID')}, "
            f"amax_history_len={params.get('amax_history_len', 16)}, "
            f"amax_compute_algo='{params.get('amax_compute_algo', 'max')}')."
        )

    def prepare(self, params: Mapping[str, Any], target: FixTarget, stack: ExitStack) -> None:
        raise self.not_implemented(params)
