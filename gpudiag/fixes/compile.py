"""compile: ``torch.compile`` the model (or a step function) with one of its modes.

Runs for real on the CPU (Inductor's C++ backend); the GPU path (Triton, CUDA graphs for
reduce-overhead) is untested on a real GPU.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Literal

from gpudiag.errors import UnsupportedFixError
from gpudiag.fixes import _system
from gpudiag.fixes.proof import Observation, Proof, applied, not_applied, unverified
from gpudiag.fixes.spec import (
    FixParams,
    FixSpec,
    Step,
    claim_graph_capture,
    register,
)

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport

# Triton, inductor's GPU code generator, supports compute capability 7.0 and newer
# (Triton README, "Compatibility").
TRITON_MIN_CC = (7, 0)
# The modes whose options set triton.cudagraphs (torch._inductor.list_mode_options()).
CUDA_GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})


class CompileParams(FixParams):
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = (
        "default"
    )
    fullgraph: bool = False


def cxx_compiler() -> str | None:
    """The C++ compiler inductor would use on the CPU (``$CXX``, else g++ / clang++ / c++)."""
    for name in (os.environ.get("CXX"), "g++", "clang++", "c++"):
        if name and shutil.which(name):
            return name
    return None


@register
class Compile(FixSpec):
    id = "compile"
    bypasses_dispatcher = True
    first_steps_note = (
        "compiled arms: the first step (compilation) is excluded from the timings; see first_step_s"
    )
    slow_first_step = True
    summary = (
        "Compile the model with torch.compile (TorchDynamo + Inductor): fused kernels, "
        "fewer launches."
    )
    Params = CompileParams
    main_param = "mode"
    order = 90  # wraps whatever the other fixes set up

    def captures_graphs(self, params: Mapping[str, Any]) -> bool:
        return params.get("mode", "default") in CUDA_GRAPH_MODES

    def describe(self, params: Mapping[str, Any]) -> str:
        mode = params.get("mode", "default")
        extra = {
            "reduce-overhead": " Mode reduce-overhead also records CUDA graphs (fewer launches).",
            "max-autotune": " Mode max-autotune benchmarks kernel configurations (long compile).",
        }.get(mode, "")
        return f"torch.compile(model, mode={mode!r}): fused kernels, fewer launches.{extra}"

    def supported(
        self, params: Mapping[str, Any], system: SystemReport | None, device_type: str
    ) -> tuple[bool, str]:
        try:
            import torch._dynamo as dynamo
        except ImportError as exc:
            return False, f"torch.compile is not available in this torch ({exc})"
        is_supported = getattr(dynamo, "is_dynamo_supported", None)
        if is_supported is not None and not is_supported():
            return (
                False,
                "torch.compile does not support this Python version or platform with this torch",
            )
        if device_type == "cpu":
            if cxx_compiler() is None:
                return (
                    False,
                    "Inductor needs a C++ compiler on the CPU (g++ or clang++); none was found",
                )
            return True, ""
        if not _system.package_installed("triton"):
            return False, "Inductor needs Triton on the GPU: pip install triton"
        cc, name = _system.gpu_cc(system)
        if cc is not None and cc < TRITON_MIN_CC:
            return False, f"Triton needs compute capability 7.0+; {name} is {_system.cc_text(cc)}"
        return True, ""

    def prepare(self, params: Mapping[str, Any], target: Step, stack: ExitStack) -> None:
        import torch

        mode = params.get("mode", "default")
        options: dict[str, Any] = {"mode": mode, "fullgraph": bool(params.get("fullgraph", False))}
        if mode == "reduce-overhead" and target.device_type == "cpu":
            target.notes.append(
                "reduce-overhead adds CUDA graphs, which do nothing on the CPU: same as default"
            )
        if mode in CUDA_GRAPH_MODES and target.device_type == "cuda":
            claim_graph_capture(target, f"compile mode={mode}", stack)
        if target.step_fn is not None and not target.owns_step:
            original_fn = target.step_fn
            target.step_fn = torch.compile(original_fn, **options)

            def restore_fn() -> None:
                target.step_fn = original_fn

            stack.callback(restore_fn)
        elif target.model is not None:
            original = target.model
            target.model = torch.compile(original, **options)

            def restore_model() -> None:
                target.model = original

            stack.callback(restore_model)
            if not target.owns_step:
                target.notes.append(
                    "use the returned model: torch.compile wraps it, the original is unchanged"
                )
        else:
            raise UnsupportedFixError(
                "compile: nothing to compile (no model and no step function given)"
            )
        target.notes.append(
            "the first steps of a compiled model include compilation (reported separately)"
        )

    def proof(
        self, params: Mapping[str, Any], arm: Observation, baseline: Observation | None
    ) -> Proof:
        """Compiled frames ran in the arm's step (the profiler's compiled regions and compiled
        autograd functions), with Dynamo's frames compiled and graph breaks counted."""
        runs = arm.compiled
        if runs is None:
            return unverified(self.id, "the arm's step was not observed under the profiler")
        dynamo = arm.dynamo
        counted = (
            f"; Dynamo: {dynamo.get('frames', 0)} frame(s) compiled, "
            f"{dynamo.get('graphs', 0)} graph(s), {dynamo.get('graph_breaks', 0)} graph break(s)"
            if dynamo
            else ""
        )
        if not runs.ran_compiled:
            return not_applied(
                self.id,
                f"no compiled code ran in the arm's step ({runs}{counted}): Dynamo skipped the "
                "code or fell back to running it eagerly",
                evidence=f"{runs}{counted}",
            )
        return applied(self.id, f"{runs}{counted}")

    def code(self, params: Mapping[str, Any]) -> list[str]:
        mode = params.get("mode", "default")
        full = ", fullgraph=True" if params.get("fullgraph") else ""
        return [f'model = torch.compile(model, mode="{mode}"{full})']
