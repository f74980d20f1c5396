"""What one step ran, cheaply: aten operators and their dtypes, attention paths, compiled regions.

The evidence that a fix took effect comes from the arm's own step, not from a second full
profile. ``op_census(fn)`` runs ``fn`` once under a ``TorchDispatchMode`` that counts every
aten operator (forward and backward), the dtype of each matrix product (GEMM), the fused
scaled-dot-product-attention kernels, and attention computed as softmax between batched
matmuls (written by hand, or SDPA's math path), found by following which tensor each
operator produced. ``compiled_regions(fn)`` runs ``fn`` under the CPU profiler and counts
``torch.compile``'s regions and compiled autograd functions: compiled code does not pass
through the dispatcher (Dynamo runs the eager code while a dispatch mode is active), so a
compiled step is observed this way instead. ``dynamo_counts()`` reads Dynamo's own counters
(frames compiled, graph breaks) without importing Dynamo.

Runs for real on the CPU; the CUDA kernel names (flash, efficient, cuDNN attention) are those of
PyTorch's native functions and untested on a real GPU here.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpudiag._native_stderr import quiet_profiler_stderr

# Matrix products whose input dtype says which precision the step's math ran in.
GEMM_OPS = frozenset(
    {
        "aten::mm",
        "aten::bmm",
        "aten::addmm",
        "aten::baddbmm",
        "aten::addbmm",
        "aten::mv",
        "aten::addmv",
        "aten::dot",
        "aten::_scaled_mm",
        "aten::convolution",
        "aten::_convolution",
        "aten::cudnn_convolution",
        "aten::mkldnn_convolution",
        "aten::convolution_backward",
    }
)
CONVOLUTION_OPS = frozenset(o for o in GEMM_OPS if "convolution" in o)
BATCHED_GEMM_OPS = frozenset({"aten::bmm", "aten::baddbmm"})
SOFTMAX_OPS = frozenset({"aten::_softmax", "aten::_safe_softmax", "aten::softmax"})
# PyTorch's fused attention kernels (native_functions.yaml) -> the SDPA backend they belong to.
FUSED_ATTENTION = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash",
    "aten::_flash_attention_forward": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_efficient_attention_forward": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_fused_attention_overrideable": "fused",
}
# The flash-attn package registers its kernels as custom operators in this namespace.
FLASH_ATTN_NAMESPACE = "flash_attn::"

_BMM = "bmm"


@dataclass
class OpCensus:
    """Operators one step ran, forward and backward.

    ``ops``: calls per aten operator. ``gemm_dtypes``: matrix products by the dtype of their
    first floating input. ``fused_attention``: forward calls of fused attention kernels by
    backend (``flash``, ``efficient``, ``cudnn``, ``flash_attn``). ``softmax_attention``:
    softmaxes computed from a batched matmul whose result feeds another batched matmul:
    attention written by hand, or SDPA's math path.
    """

    ops: Counter[str] = field(default_factory=Counter)
    gemm_dtypes: Counter[str] = field(default_factory=Counter)
    fused_attention: Counter[str] = field(default_factory=Counter)
    softmax_attention: int = 0

    @property
    def gemms(self) -> int:
        return sum(self.gemm_dtypes.values())

    @property
    def convolutions(self) -> int:
        return sum(n for name, n in self.ops.items() if name in CONVOLUTION_OPS)

    @property
    def fused_attention_calls(self) -> int:
        return sum(self.fused_attention.values())

    def gemm_text(self) -> str:
        """``"12 bfloat16, 2 float32"``: the GEMMs by dtype, most first."""
        if not self.gemm_dtypes:
            return "no matrix products"
        return ", ".join(f"{n} {dtype}" for dtype, n in self.gemm_dtypes.most_common())

    def attention_text(self) -> str:
        parts = [f"{n} fused ({backend})" for backend, n in self.fused_attention.most_common()]
        if self.softmax_attention:
            parts.append(f"{self.softmax_attention} softmax between matmuls")
        return ", ".join(parts) or "no attention"


def _census_mode(census: OpCensus) -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from torch.utils.weak import WeakIdKeyDictionary

    class Census(TorchDispatchMode):
        """Counts operators; tags tensors to follow bmm -> softmax -> bmm."""

        def __init__(self) -> None:
            super().__init__()
            self.tags: Any = WeakIdKeyDictionary()
            self.softmaxes = 0
            self.consumed: set[int] = set()

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = str(func._schema.name)
            census.ops[name] += 1
            inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if name in GEMM_OPS:
                floating = next((t for t in inputs if t.is_floating_point()), None)
                if floating is not None:
                    census.gemm_dtypes[str(floating.dtype).removeprefix("torch.")] += 1
            backend = FUSED_ATTENTION.get(name)
            if backend is None and name.startswith(FLASH_ATTN_NAMESPACE) and "fwd" in name:
                backend = "flash_attn"
            if backend is not None:
                census.fused_attention[backend] += 1
            self._follow(name, inputs, [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)])
            return out

        def _follow(self, name: str, inputs: list[Any], outputs: list[Any]) -> None:
            tags = [self.tags.get(t) for t in inputs]
            if name in BATCHED_GEMM_OPS:
                for tag in tags:
                    if isinstance(tag, int):
                        self.consumed.add(tag)
                new: Any = _BMM
            elif name in SOFTMAX_OPS:
                new = None
                if _BMM in tags:
                    self.softmaxes += 1
                    new = self.softmaxes
            else:
                new = next((t for t in tags if isinstance(t, int)), None)
                if new is None and _BMM in tags:
                    new = _BMM
            if new is None:
                return
            for t in outputs:
                self.tags[t] = new

    return Census()


def op_census(fn: Callable[[], Any]) -> tuple[OpCensus, Any]:
    """Run ``fn()`` once, counting what it dispatched; returns (census, fn's result)."""
    census = OpCensus()
    mode = _census_mode(census)
    with mode:
        result = fn()
    census.softmax_attention = len(mode.consumed)
    return census, result


@dataclass(frozen=True)
class CompiledRuns:
    """What ``torch.compile`` did in one observed step: compiled regions entered (Dynamo's
    frames, entered even when it then runs the code eagerly), compiled graphs called
    (Inductor's), and compiled autograd functions (forward and backward) that ran."""

    regions: int
    graphs: int
    forward: int
    backward: int

    @property
    def ran_compiled(self) -> bool:
        return bool(self.graphs or self.forward or self.backward)

    def __str__(self) -> str:
        return (
            f"{self.regions} compiled region(s) entered, {self.graphs} compiled graph call(s), "
            f"{self.forward} compiled forward and {self.backward} compiled backward "
            "function(s)"
        )


def compiled_regions(fn: Callable[[], Any]) -> tuple[CompiledRuns, Any]:
    """Run ``fn()`` once under the CPU profiler; count torch.compile's regions that ran."""
    from torch.profiler import ProfilerActivity, profile

    with quiet_profiler_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
        result = fn()
    names = Counter(str(e.name) for e in prof.events())
    regions = sum(n for name, n in names.items() if name.startswith("Torch-Compiled Region"))
    graphs = sum(n for name, n in names.items() if name.startswith("## Call CompiledFxGraph"))
    return (
        CompiledRuns(
            regions, graphs, names.get("CompiledFunction", 0), names["CompiledFunctionBackward"]
        ),
        result,
    )


def dynamo_counts() -> Mapping[str, int]:
    """Dynamo's counters (frames compiled, graph breaks, graphs); empty when Dynamo was never
    imported (nothing was compiled)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return {}
    frames = counters.get("frames", {})
    return {
        "frames": int(frames.get("total", 0)),
        "frames_ok": int(frames.get("ok", 0)),
        "graphs": int(counters.get("stats", {}).get("unique_graphs", 0)),
        "graph_breaks": int(sum(counters.get("graph_break", {}).values())),
    }


__all__ = [
    "FUSED_ATTENTION",
    "GEMM_OPS",
    "CompiledRuns",
    "OpCensus",
    "compiled_regions",
    "dynamo_counts",
    "op_census",
]
