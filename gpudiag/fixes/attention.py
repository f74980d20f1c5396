"""attention.backend: pick the SDPA kernel, and switch a model's attention implementation.

SDPA's flash and math kernels run for real on the CPU; the CUDA kernels (flash, efficient,
cuDNN) and the flash-attn package path (tested with an import-level fake) are untested on a
real GPU.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from contextlib import ExitStack, nullcontext
from typing import TYPE_CHECKING, Any, Literal

from pydantic import field_validator

from gpudiag.errors import UnsupportedFixError
from gpudiag.fixes import _system
from gpudiag.fixes.proof import Observation, Proof, applied, not_applied, unverified
from gpudiag.fixes.spec import FixParams, FixSpec, Step, register

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport

Backend = Literal["sdpa", "flash", "efficient", "cudnn", "math", "flash_attn", "te", "eager"]

# Hugging Face's spellings (config._attn_implementation) and other common names.
ALIASES = {
    "flash_attention_2": "flash_attn",
    "flash-attn": "flash_attn",
    "mem_efficient": "efficient",
    "memory_efficient": "efficient",
    "transformer_engine": "te",
}
# backend -> the attention implementation a Hugging Face-style model is switched to.
HF_IMPLEMENTATION = {"eager": "eager", "flash_attn": "flash_attention_2", "te": "sdpa"}
SDPA_BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}
# The fused kernels (gpudiag.profiling.census) each backend asks for; sdpa takes any of them.
FUSED_KERNELS = {
    "flash": ("flash",),
    "efficient": ("efficient",),
    "cudnn": ("cudnn",),
    "flash_attn": ("flash_attn",),
    "sdpa": ("flash", "efficient", "cudnn", "fused", "flash_attn"),
}
HAND_WRITTEN = "softmax(q @ k.transpose(-2, -1) * scale) @ v"
# torch.nn.MultiheadAttention computes softmax between matmuls while it returns the attention
# weights (need_weights=True, its default) or while dropout / masks rule the fused path out.
BY_HAND_MHA = (
    "call torch.nn.MultiheadAttention with need_weights=False (it then calls "
    "scaled_dot_product_attention), or replace it with torch.nn.functional."
    "scaled_dot_product_attention(q, k, v, ...) in the model's code"
)
# The change to make by hand when attention is written out (no switch reaches it).
BY_HAND = (
    f"replace {HAND_WRITTEN} in the model's attention with "
    "torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=..., is_causal=...); "
    'for a Hugging Face model, load it with attn_implementation="sdpa" '
    '(from_pretrained(..., attn_implementation="sdpa"))'
)


class AttentionParams(FixParams):
    backend: Backend = "sdpa"

    @field_validator("backend", mode="before")
    @classmethod
    def _alias(cls, value: Any) -> Any:
        return ALIASES.get(value, value) if isinstance(value, str) else value


@functools.cache
def cpu_sdpa_backend_works(backend: str) -> tuple[bool, str]:
    """Run a tiny causal attention forward and backward on the CPU with only ``backend`` enabled."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 2, 16, 8, requires_grad=True)
    try:
        with sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[backend])]):
            torch.nn.functional.scaled_dot_product_attention(
                q, q, q, is_causal=True
            ).sum().backward()
    except (RuntimeError, AttributeError) as exc:
        return False, str(exc).splitlines()[0]
    return True, ""


def _has_multihead_attention(model: Any) -> bool:
    import torch

    modules = model.modules() if hasattr(model, "modules") else ()
    return any(isinstance(m, torch.nn.MultiheadAttention) for m in modules)


def attention_configs(model: Any) -> list[Any]:
    """Distinct config objects with an ``_attn_implementation`` switch (Hugging Face style)."""
    if model is None:
        return []
    seen: dict[int, Any] = {}
    modules = model.modules() if hasattr(model, "modules") else [model]
    for module in modules:
        config = getattr(module, "config", None)
        if (
            config is not None
            and hasattr(config, "_attn_implementation")
            and id(config) not in seen
        ):
            seen[id(config)] = config
    return list(seen.values())


@register
class AttentionBackend(FixSpec):
    id = "attention.backend"
    summary = (
        "Use a fused attention kernel instead of hand-written softmax(QK^T)V or SDPA's math path."
    )
    Params = AttentionParams
    main_param = "backend"
    group = "attention"
    order = 20

    def is_implemented(self, params: Mapping[str, Any]) -> bool:
        return params.get("backend") != "te"  # Transformer Engine attention swaps modules

    def describe(self, params: Mapping[str, Any]) -> str:
        backend = params.get("backend", "sdpa")
        if backend == "sdpa":
            return (
                "Switch the model's attention to torch's scaled_dot_product_attention "
                "(config._attn_implementation = 'sdpa') and let PyTorch pick the fastest kernel."
            )
        if backend in SDPA_BACKENDS:
            return (
                f"Use scaled_dot_product_attention restricted to the {backend} kernel "
                f"(torch.nn.attention.sdpa_kernel(SDPBackend.{SDPA_BACKENDS[backend]})); a model "
                "with config._attn_implementation = 'eager' is switched to 'sdpa'."
            )
        if backend == "flash_attn":
            return (
                "Use the flash-attn package's kernels "
                "(config._attn_implementation = 'flash_attention_2')."
            )
        if backend == "te":
            return "Replace attention with Transformer Engine's DotProductAttention (structural)."
        return "Use the model's hand-written (eager) attention: softmax(QK^T)V."

    def supported(
        self, params: Mapping[str, Any], system: SystemReport | None, device_type: str
    ) -> tuple[bool, str]:
        backend = params.get("backend", "sdpa")
        if backend in ("sdpa", "math", "eager"):
            return True, ""
        if device_type == "cpu":
            if backend == "flash":
                ok, why = cpu_sdpa_backend_works("flash")
                return (
                    ok,
                    "" if ok else f"this torch build has no CPU flash-attention kernel ({why})",
                )
            if backend in ("efficient", "cudnn"):
                return False, (
                    f"PyTorch has no {backend} attention kernel for the CPU (only flash and math); "
                    "use attention.backend=flash"
                )
            return False, f"{backend} attention runs only on NVIDIA GPUs"
        cc, name = _system.gpu_cc(system)
        if cc is None:
            return (
                False,
                f"the compute capability of {name} is unknown, so {backend} attention "
                "cannot be checked",
            )
        where = f"{name} (compute capability {_system.cc_text(cc)})"
        if backend == "efficient":
            # The memory-efficient kernel comes from xFormers' CUTLASS kernels: sm50 and newer.
            return (
                (True, "")
                if cc >= (5, 0)
                else (False, f"{where} is too old for the memory-efficient kernel (5.0+)")
            )
        if (
            backend in ("flash", "flash_attn", "cudnn")
            and not _system.features(cc).flash_attention_2
        ):
            return (
                False,
                f"{where} cannot run FlashAttention-class kernels (8.0+ needed); "
                "try attention.backend=efficient",
            )
        if backend == "cudnn":
            cudnn = getattr(getattr(_system.host(system), "torch", None), "cudnn_version", None)
            version = cudnn.get() if cudnn is not None else None
            if version is not None and int(version) < 90000:
                return (
                    False,
                    f"cuDNN attention needs cuDNN 9 or newer; torch was built with {version}",
                )
        if backend == "flash_attn" and not _system.package_installed("flash_attn"):
            return (
                False,
                "the flash-attn package is not installed: "
                "pip install flash-attn --no-build-isolation",
            )
        if backend == "te" and not _system.package_installed("transformer_engine"):
            return (
                False,
                "Transformer Engine is not installed: pip install 'transformer-engine[pytorch]'",
            )
        return True, ""

    def prepare(self, params: Mapping[str, Any], target: Step, stack: ExitStack) -> None:
        backend = params.get("backend", "sdpa")
        if backend == "te":
            raise self.not_implemented(params)
        if backend == "flash_attn":
            try:
                importlib.import_module("flash_attn")
            except ImportError as exc:
                raise UnsupportedFixError(
                    f"the flash-attn package cannot be imported ({exc}): pip install flash-attn "
                    "--no-build-isolation (needs a CUDA build of torch)"
                ) from None
        configs = attention_configs(target.model)
        if not configs:
            if backend == "flash_attn":
                raise UnsupportedFixError(
                    "attention.backend=flash_attn needs a model with an attention-implementation "
                    "switch (config._attn_implementation, as Hugging Face models have)"
                )
            if target.model is not None:
                target.notes.append(
                    "the model has no attention-implementation switch "
                    "(config._attn_implementation): "
                    "the kernel choice applies only where it calls scaled_dot_product_attention"
                )
            return
        wanted = HF_IMPLEMENTATION.get(backend, "sdpa")
        for config in configs:
            before = config._attn_implementation
            config._attn_implementation = wanted
            stack.callback(setattr, config, "_attn_implementation", before)
            if before != wanted:
                target.notes.append(
                    f"attention implementation switched from {before!r} to {wanted!r}"
                )

    def scope(self, params: Mapping[str, Any], target: Step) -> Any:
        backend = params.get("backend", "sdpa")
        if backend not in SDPA_BACKENDS:
            return nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[backend])])

    def code(self, params: Mapping[str, Any]) -> list[str]:
        backend = params.get("backend", "sdpa")
        lines = []
        if backend != "eager":
            impl = HF_IMPLEMENTATION.get(backend, "sdpa")
            lines += [
                "# These lines reach only torch.nn.functional.scaled_dot_product_attention calls",
                "# and a Hugging Face model's attention switch. Attention written by hand,",
                f"# {HAND_WRITTEN}, stays as it is: replace it in the model's code with",
                "# torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=...).",
                f'model = AutoModel.from_pretrained(name, attn_implementation="{impl}")  # HF',
            ]
        if backend in SDPA_BACKENDS:
            lines += [
                "from torch.nn.attention import SDPBackend, sdpa_kernel",
                f"with sdpa_kernel(SDPBackend.{SDPA_BACKENDS[backend]}):",
                "    ...  # the training step",
            ]
        return lines

    def proof(
        self, params: Mapping[str, Any], arm: Observation, baseline: Observation | None
    ) -> Proof:
        """The arm's step must run the fused kernel asked for where the baseline ran softmax
        between matmuls (hand-written attention or SDPA's math path), or the reverse for
        ``math`` / ``eager``."""
        backend = str(params.get("backend", "sdpa"))
        ops = arm.ops
        if ops is None:
            return unverified(self.id, f"the arm's operators were not counted ({arm.ops_missing})")
        base = baseline.ops if baseline is not None else None
        evidence = f"arm: {ops.attention_text()}; baseline: " + (
            base.attention_text() if base is not None else "not observed"
        )
        same = (
            base is not None
            and base.fused_attention == ops.fused_attention
            and base.softmax_attention == ops.softmax_attention
        )
        if backend in ("math", "eager"):
            if ops.fused_attention_calls or not ops.softmax_attention:
                return not_applied(
                    self.id,
                    "fused attention kernels still ran"
                    if ops.fused_attention_calls
                    else "no attention ran in the step",
                    evidence=evidence,
                )
            if same:
                return not_applied(
                    self.id,
                    "the baseline already computes attention as softmax between matmuls: "
                    f"{backend} changes nothing",
                    evidence=evidence,
                )
            return applied(self.id, evidence)
        wanted = FUSED_KERNELS.get(backend, FUSED_KERNELS["sdpa"])
        fused = sum(ops.fused_attention[k] for k in wanted)
        if fused:
            if same:
                return not_applied(
                    self.id,
                    f"the baseline already runs the same fused attention ({ops.attention_text()})"
                    f": {backend} changes nothing",
                    evidence=evidence,
                )
            if ops.softmax_attention:
                evidence += f"; {ops.softmax_attention} attention call(s) still by hand"
            return applied(self.id, evidence)
        if ops.fused_attention_calls:
            return not_applied(
                self.id,
                f"asked for {backend}, but the step ran {ops.attention_text()}",
                evidence=evidence,
            )
        if ops.softmax_attention:
            model = arm.step.base_model
            mha = _has_multihead_attention(model)
            switch = (
                "its attention-implementation switch did not lead to scaled_dot_product_attention"
                if attention_configs(model)
                else "it has no attention-implementation switch (config._attn_implementation)"
            )
            what = (
                "torch.nn.MultiheadAttention computes it as"
                if mha
                else "the model computes attention by hand"
            )
            return not_applied(
                self.id,
                f"{what} (softmax between matmuls, {ops.softmax_attention} per step): "
                "attention.backend reaches only scaled_dot_product_attention calls and a "
                f"Hugging Face-style switch, and {switch}",
                manual=BY_HAND_MHA if mha else BY_HAND,
                evidence=evidence,
            )
        return not_applied(self.id, "no attention ran in the step", evidence=evidence)
