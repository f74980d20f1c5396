"""Precision fixes: TF32 switches, bf16 / fp16 autocast (fp16 with a GradScaler), FP8 training.

bf16 autocast runs for real on the CPU. The CUDA effects (TF32 tensor cores, fp16 with a CUDA
GradScaler) are checked through torch's flags and types on a CPU build: untested on a real GPU.
FP8 swaps ``nn.Linear`` layers for NVIDIA Transformer Engine's ``te.Linear`` and runs each
forward under TE's autocast with a delayed-scaling recipe. It is written against TE's documented
PyTorch API and tested with an import-level fake of the package: untested with the real
Transformer Engine in this project's CI.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from gpudiag.errors import FixConflictError, UnsupportedFixError
from gpudiag.fixes import _system
from gpudiag.fixes.proof import Observation, Proof, applied, not_applied, unverified
from gpudiag.fixes.spec import (
    FixParams,
    FixSpec,
    Step,
    register,
    replace_forward,
)

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport

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
    summary = (
        "Let float32 matmuls and convolutions use TF32 tensor cores "
        "(torch.backends.cuda.matmul.allow_tf32, cudnn.allow_tf32, matmul precision 'high')."
    )
    order = 10

    def supported(
        self, params: Mapping[str, Any], system: SystemReport | None, device_type: str
    ) -> tuple[bool, str]:
        if device_type != "cuda":
            return (
                False,
                "TF32 is a tensor-core format of NVIDIA GPUs (compute capability 8.0+); "
                "this run is on the CPU",
            )
        return _system.gpu_has(system, "tf32", "TF32", "8.0+", ": the flags would change nothing")

    def scope(self, params: Mapping[str, Any], target: Step) -> Any:
        return tf32_enabled()

    def code(self, params: Mapping[str, Any]) -> list[str]:
        return [
            "torch.backends.cuda.matmul.allow_tf32 = True",
            "torch.backends.cudnn.allow_tf32 = True",
            'torch.set_float32_matmul_precision("high")',
        ]

    def proof(
        self, params: Mapping[str, Any], arm: Observation, baseline: Observation | None
    ) -> Proof:
        """The switch read back inside the arm, and float32 matrix products that it governs."""
        switch = arm.switches.get("cuda.matmul.allow_tf32")
        if switch is not True:
            return not_applied(
                self.id, f"torch.backends.cuda.matmul.allow_tf32 read back {switch!r} in the arm"
            )
        if arm.ops is None:
            return unverified(
                self.id,
                f"the switch is on, but the arm's operators were not counted ({arm.ops_missing})",
            )
        fp32 = arm.ops.gemm_dtypes.get("float32", 0)
        if not fp32:
            return not_applied(
                self.id,
                "no float32 matrix product or convolution ran "
                f"({arm.ops.gemm_text()}): TF32 governs nothing in this step",
            )
        return applied(
            self.id,
            f"allow_tf32 read back True inside the arm; {fp32} float32 matrix products ran "
            "under it (which kernels cuBLAS chose is not visible here)",
        )


def autocast_proof(
    fix_id: str, dtype: str, arm: Observation, baseline: Observation | None
) -> Proof:
    """The arm's matrix products must run in ``dtype`` (``"bfloat16"``), where the baseline's
    did not."""
    ops = arm.ops
    if ops is None:
        return unverified(fix_id, f"the arm's operators were not counted ({arm.ops_missing})")
    n, total = ops.gemm_dtypes.get(dtype, 0), ops.gemms
    base = baseline.ops if baseline is not None else None
    evidence = f"{n} of {total} matrix products in {dtype} (baseline: " + (
        f"{base.gemm_text()})" if base is not None else "not observed)"
    )
    if not total:
        return not_applied(fix_id, "the step ran no matrix product: autocast has nothing to change")
    if not n:
        return not_applied(
            fix_id,
            f"none of the step's {total} matrix products ran in {dtype} ({ops.gemm_text()}): "
            "autocast did not reach them",
            manual=f"run the forward pass and the loss under torch.autocast(device_type, "
            f"dtype=torch.{dtype})",
            evidence=evidence,
        )
    if base is not None and base.gemm_dtypes.get(dtype, 0) >= n:
        return not_applied(
            fix_id,
            f"the baseline's matrix products already run in {dtype} ({base.gemm_text()}): "
            "nothing to change",
            evidence=evidence,
        )
    return applied(fix_id, evidence)


@contextmanager
def autocast_scope(target: Step, fix_id: str, dtype: Any, with_scaler: bool) -> Iterator[None]:
    """The Step's autocast dtype (and for fp16 its GradScaler, one per Step, kept between
    entries so its scale carries over) while entered."""
    import torch

    if target.autocast_dtype not in (None, dtype) or (
        target.scaler is not None and not with_scaler
    ):
        raise FixConflictError(f"{fix_id} cannot be combined with another precision fix")
    before = (target.autocast_dtype, target.scaler)
    target.autocast_dtype = dtype
    if with_scaler:
        scaler = target.state.get(fix_id)
        if scaler is None:
            scaler = target.state[fix_id] = torch.amp.GradScaler(target.device_type)
        target.scaler = scaler
    try:
        yield
    finally:
        target.autocast_dtype, target.scaler = before


def _cpu_low_precision(system: SystemReport | None, dtype: str) -> tuple[bool, str]:
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
    summary = (
        "Run the forward pass and the loss under bf16 autocast "
        "(torch.autocast(dtype=torch.bfloat16)); "
        "bf16 keeps float32's exponent range, so no GradScaler is needed."
    )
    group = "precision"
    order = 10

    def supported(
        self, params: Mapping[str, Any], system: SystemReport | None, device_type: str
    ) -> tuple[bool, str]:
        if device_type == "cpu":
            ok, why = _cpu_low_precision(system, "bf16")
            return ok, "" if ok else why
        return _system.gpu_has(system, "bf16", "bf16", "8.0+", "; try precision.fp16 instead")

    def scope(self, params: Mapping[str, Any], target: Step) -> Any:
        import torch

        # Deliberately no GradScaler: bf16 has float32's exponent range, gradients do not
        # underflow, and a scaler would only add work.
        return autocast_scope(target, self.id, torch.bfloat16, with_scaler=False)

    def proof(
        self, params: Mapping[str, Any], arm: Observation, baseline: Observation | None
    ) -> Proof:
        return autocast_proof(self.id, "bfloat16", arm, baseline)

    def memory_args(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {"precision": "bf16"}

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
    after_apply = (
        "scaler = applied.scaler  # fp16 in your step:",
        "#   scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()",
    )
    summary = (
        "Run the forward pass and the loss under fp16 autocast, with a GradScaler that scales the "
        "loss so small gradients do not underflow."
    )
    group = "precision"
    order = 10

    def supported(
        self, params: Mapping[str, Any], system: SystemReport | None, device_type: str
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

    def scope(self, params: Mapping[str, Any], target: Step) -> Any:
        import torch

        note = (
            "fp16 needs the returned GradScaler in your step: scaler.scale(loss).backward(); "
            "scaler.step(optimizer); scaler.update()"
        )
        if not target.owns_step and note not in target.notes:
            target.notes.append(note)
        return autocast_scope(target, self.id, torch.float16, with_scaler=True)

    def proof(
        self, params: Mapping[str, Any], arm: Observation, baseline: Observation | None
    ) -> Proof:
        result = autocast_proof(self.id, "float16", arm, baseline)
        if result.applied and arm.step.scaler is None:
            return not_applied(self.id, "fp16 ran without its GradScaler", evidence=result.evidence)
        if result.applied:
            return applied(self.id, result.evidence + "; loss scaled by a GradScaler")
        return result

    def memory_args(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {"precision": "fp16"}

    def code(self, params: Mapping[str, Any]) -> list[str]:
        return [
            "scaler = torch.amp.GradScaler(device_type)",
            "with torch.autocast(device_type, dtype=torch.float16):  # forward and loss only",
            "    loss = loss_fn(model(batch), target)",
            "scaler.scale(loss).backward()",
            "scaler.step(optimizer)",
            "scaler.update()",
        ]


# -- FP8 through Transformer Engine -------------------------------------------------------------

# TE's FP8 GEMMs take only tensors whose two dimensions are multiples of 16 (TE PyTorch API,
# ``transformer_engine.pytorch.autocast``, first note:
# https://docs.nvidia.com/deeplearning/transformer-engine/user-guide/api/pytorch.html).
FP8_DIM_MULTIPLE = 16
TE_INSTALL = "pip install 'transformer-engine[pytorch]'"


class FP8Params(FixParams):
    # DelayedScaling fields (TE Common API, transformer_engine.common.recipe.DelayedScaling:
    # https://docs.nvidia.com/deeplearning/transformer-engine/user-guide/api/common.html);
    # 16 steps of amax history as in TE's getting-started FP8 example (TE's own default: 1024).
    fp8_format: Literal["E4M3", "HYBRID"] = "HYBRID"
    amax_history_len: int = Field(16, ge=1, le=1024)
    amax_compute_algo: Literal["max", "most_recent"] = "max"
    # Layers kept in their precision: fnmatch patterns on the dotted module name or its last part.
    skip: tuple[str, ...] = ()
    # The last Linear layer is usually the output head whose logits feed the loss: keeping it in
    # its precision is the conservative default; false converts it too when its shape allows.
    keep_last: bool = True

    @field_validator("skip", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        # The command-line spelling (and a label) joins several patterns with "+".
        return tuple(p for p in value.split("+") if p) if isinstance(value, str) else value


def import_transformer_engine() -> tuple[Any, Any]:
    """``transformer_engine.pytorch`` and ``transformer_engine.common.recipe``, or why not."""
    try:
        te = importlib.import_module("transformer_engine.pytorch")
        recipe = importlib.import_module("transformer_engine.common.recipe")
    except (ImportError, OSError, RuntimeError) as exc:  # OSError, RuntimeError: its CUDA libraries
        raise UnsupportedFixError(
            f"precision.fp8 needs Transformer Engine, which cannot be imported ({exc}): "
            f"{TE_INSTALL}, on a GPU with FP8 tensor cores (compute capability 8.9+)"
        ) from None
    return te, recipe


def fp8_recipe(recipe: Any, params: Mapping[str, Any]) -> Any:
    """The ``DelayedScaling`` recipe the parameters describe."""
    return recipe.DelayedScaling(
        fp8_format=getattr(recipe.Format, params.get("fp8_format", "HYBRID")),
        amax_history_len=int(params.get("amax_history_len", 16)),
        amax_compute_algo=params.get("amax_compute_algo", "max"),
    )


def fp8_region(te: Any, recipe: Any) -> Callable[[], AbstractContextManager[Any]]:
    """A new TE autocast region per call: ``te.autocast(recipe=)`` where TE has it (2.x, whose
    ``fp8_autocast`` is deprecated), else ``te.fp8_autocast(fp8_recipe=)`` of older releases."""
    autocast = getattr(te, "autocast", None)
    if autocast is not None:
        return functools.partial(autocast, enabled=True, recipe=recipe)
    return functools.partial(te.fp8_autocast, enabled=True, fp8_recipe=recipe)


def fp8_linear_plan(
    model: Any, params: Mapping[str, Any]
) -> tuple[list[tuple[str, Any]], list[tuple[str, str]]]:
    """(name, layer) of the ``nn.Linear`` layers to convert, and (name, why) of those kept."""
    import torch

    linears = [(n, m) for n, m in model.named_modules() if type(m) is torch.nn.Linear]
    module_uses = Counter(id(m) for _, m in model.named_modules(remove_duplicate=False))
    param_uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    shared = {
        id(m)
        for _, m in linears
        if module_uses[id(m)] > 1 or any(param_uses[id(p)] > 1 for p in m.parameters())
    }
    last = linears[-1][0] if linears and params.get("keep_last", True) else None
    convert: list[tuple[str, Any]] = []
    kept: list[tuple[str, str]] = []
    for name, layer in linears:
        why = _why_kept(name, layer, params.get("skip", ()), last, id(layer) in shared)
        if why:
            kept.append((name or "the model", why))
        else:
            convert.append((name, layer))
    return convert, kept


def _why_kept(name: str, layer: Any, skip: Any, last: str | None, shared: bool) -> str:
    from torch.nn.utils import parametrize

    if not name:
        return "the model itself is the layer: nothing to put a replacement in"
    short = name.rpartition(".")[2]
    pattern = next(
        (p for p in skip if fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(short, p)), None
    )
    if pattern is not None:
        return f"skipped by name ({pattern!r})"
    if name == last:
        return "the last Linear layer, usually the output head (keep_last)"
    if layer.in_features % FP8_DIM_MULTIPLE or layer.out_features % FP8_DIM_MULTIPLE:
        return (
            f"{layer.in_features}x{layer.out_features}: FP8 needs both dimensions divisible by "
            f"{FP8_DIM_MULTIPLE}"
        )
    if shared:
        return "shared with another module (tied weights)"
    hooks = layer._forward_hooks or layer._forward_pre_hooks or layer._backward_hooks
    if hooks or parametrize.is_parametrized(layer):
        return "has hooks or parametrizations that would not carry over"
    return ""


def te_linear(te: Any, layer: Any) -> Any:
    """A ``te.Linear`` with ``layer``'s shape, dtype, device, values and training mode."""
    import torch

    weight, bias = layer.weight, layer.bias
    new = te.Linear(
        layer.in_features,
        layer.out_features,
        bias=bias is not None,
        params_dtype=weight.dtype,
        device=weight.device,
    )
    with torch.no_grad():
        new.weight.copy_(weight)
        new.weight.requires_grad_(weight.requires_grad)
        if bias is not None:
            new.bias.copy_(bias)
            new.bias.requires_grad_(bias.requires_grad)
    new.train(layer.training)
    return new


def _put(model: Any, name: str, module: Any) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, module)


def _restore(model: Any, swapped: list[tuple[str, Any, Any]]) -> None:
    """Put the original layers back, holding the values trained while they were swapped out."""
    import torch

    with torch.no_grad():
        for name, original, replacement in reversed(swapped):
            original.weight.copy_(replacement.weight)
            if original.bias is not None:
                original.bias.copy_(replacement.bias)
            _put(model, name, original)
    swapped.clear()


def _wrap_forward(
    model: Any, region: Callable[[], AbstractContextManager[Any]], stack: ExitStack
) -> None:
    original = model.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with region():
            return original(*args, **kwargs)

    replace_forward(model, forward, stack)


def _kept_text(kept: list[tuple[str, str]], shown: int = 4) -> str:
    text = "; ".join(f"{name} ({why})" for name, why in kept[:shown])
    return text + (f"; and {len(kept) - shown} more" if len(kept) > shown else "")


@register
class FP8(FixSpec):
    """FP8 training with Transformer Engine.

    ``prepare`` swaps the eligible ``nn.Linear`` layers of the model in place for ``te.Linear``
    (same values; undone by putting the original modules back) and wraps ``model.forward`` in
    TE's autocast. The region is entered per forward call, not in ``scope`` around a run of
    steps: TE updates the delayed-scaling factors when the region exits, and a module must not
    run twice inside one region (TE autocast notes); the backward runs outside it, as in TE's
    examples. The converted layers have new parameters, so the optimizer must be built after
    ``prepare``: a trial does that on its own copy of the model; an optimizer given beforehand
    is refused rather than silently left holding the old parameters.
    """

    id = "precision.fp8"
    slow_first_step = True
    summary = (
        "Swap linear layers for Transformer Engine modules and run them under TE's FP8 autocast "
        "with a delayed-scaling recipe (format, amax history)."
    )
    Params = FP8Params
    group = "precision"
    order = 10

    def supported(
        self, params: Mapping[str, Any], system: SystemReport | None, device_type: str
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
            return False, f"Transformer Engine is not installed: {TE_INSTALL}"
        return True, ""

    def describe(self, params: Mapping[str, Any]) -> str:
        return (
            f"{self.summary} Recipe: DelayedScaling("
            f"fp8_format=Format.{params.get('fp8_format', 'HYBRID')}, "
            f"amax_history_len={params.get('amax_history_len', 16)}, "
            f"amax_compute_algo='{params.get('amax_compute_algo', 'max')}'). Layers whose "
            f"dimensions are not multiples of {FP8_DIM_MULTIPLE}"
            + (", and the last one," if params.get("keep_last", True) else "")
            + " keep their precision."
        )

    def prepare(self, params: Mapping[str, Any], target: Step, stack: ExitStack) -> None:
        import torch

        te, recipe = import_transformer_engine()
        model = target.model
        if not isinstance(model, torch.nn.Module):
            raise UnsupportedFixError(
                "precision.fp8 swaps the model's torch.nn.Linear layers: it needs the model "
                f"(a torch.nn.Module), got {type(model).__name__}"
            )
        if target.device_type != "cuda":
            raise UnsupportedFixError(
                "precision.fp8 runs only on NVIDIA GPUs with FP8 tensor cores; this run is on "
                "the CPU"
            )
        if target.optimizer is not None:
            raise UnsupportedFixError(_optimizer_refusal(target.owns_step))
        convert, kept = fp8_linear_plan(model, params)
        if not convert:
            raise UnsupportedFixError(
                "precision.fp8 found no Linear layer it can convert: "
                + (_kept_text(kept) if kept else "the model has no torch.nn.Linear")
            )
        swapped: list[tuple[str, Any, Any]] = []
        stack.callback(_restore, model, swapped)  # registered first: a half-done swap is undone
        target.state[self.id] = swapped
        for name, layer in convert:
            replacement = te_linear(te, layer)
            _put(model, name, replacement)
            swapped.append((name, layer, replacement))
        _wrap_forward(model, fp8_region(te, fp8_recipe(recipe, params)), stack)
        note = f"precision.fp8: {len(convert)} Linear layer(s) now te.Linear under FP8 autocast"
        if kept:
            note += f"; {len(kept)} kept in their precision: {_kept_text(kept)}"
        target.notes.append(note)
        if not target.owns_step:
            target.notes.append(
                "precision.fp8 gave the converted layers new parameters: build the optimizer "
                "from the model's parameters after applying it"
            )

    def proof(
        self, params: Mapping[str, Any], arm: Observation, baseline: Observation | None
    ) -> Proof:
        """Module inspection: the arm's model holds te.Linear layers under TE's FP8 autocast
        (TE's FP8 GEMMs are its own kernels, not operators the step's census can count)."""
        swapped = arm.step.state.get(self.id) or []
        if not swapped:
            return not_applied(self.id, "no Linear layer of the arm's model was converted")
        return applied(
            self.id,
            f"{len(swapped)} Linear layer(s) are te.Linear under TE's FP8 autocast (module "
            "inspection; the FP8 GEMMs themselves are untested on a real GPU here)",
        )

    def code(self, params: Mapping[str, Any]) -> list[str]:
        fmt = params.get("fp8_format", "HYBRID")
        history = params.get("amax_history_len", 16)
        algo = params.get("amax_compute_algo", "max")
        return [
            "import transformer_engine.pytorch as te",
            "from transformer_engine.common.recipe import DelayedScaling, Format",
            f"# every nn.Linear `lin` with both dimensions multiples of {FP8_DIM_MULTIPLE} "
            "(not the output head):",
            "#   new = te.Linear(lin.in_features, lin.out_features, bias=lin.bias is not None,",
            "#                   params_dtype=lin.weight.dtype)  # then copy weight and bias",
            "optimizer = torch.optim.AdamW(model.parameters())  # after the swap",
            f"fp8_recipe = DelayedScaling(fp8_format=Format.{fmt}, amax_history_len={history}, "
            f'amax_compute_algo="{algo}")',
            "with te.autocast(enabled=True, recipe=fp8_recipe):  # older TE: te.fp8_autocast("
            "enabled=True, fp8_recipe=fp8_recipe)",
            "    out = model(batch)  # the forward only; backward outside",
            "loss = loss_fn(out, target)",
            "loss.backward()",
            "optimizer.step()",
        ]


def _optimizer_refusal(owns_step: bool) -> str:
    if owns_step:
        return (
            "precision.fp8 gives the converted layers new parameters, which this arm's "
            "optimizer (built on a model shared between arms) does not hold: compare with "
            "copies=True so each arm converts its own copy before its optimizer is built"
        )
    return (
        "precision.fp8 gives the converted layers new parameters, which the optimizer you "
        "passed does not hold (it would keep updating the old ones): apply the fix without the "
        "optimizer, then build it from the model's parameters (handle.model.parameters())"
    )
