"""``gd.estimate_memory``: a training step's peak memory before running it, per GPU.

Two routes. A transformer described by its config (a dict, a Hugging Face config, a
``TransformerConfig``) goes through the closed-form formulas of
gpudiag.analysis.memory_estimate. A ``gd.Workload`` (any ``nn.Module`` with its batch, loss and
optimizer) is traced: its step runs on fake tensors under torch's memory tracker, so nothing is
allocated, with the asked-for precision and checkpointing applied through the same fixes a
trial uses; two batch sizes give the bytes each sample adds. ``parallelism`` then gives the
per-GPU figure (ZeRO/FSDP shards the model states, tensor parallelism the activations).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from gpudiag._deadline import user_code_failures
from gpudiag._progress import ProgressFn, Stages, closed_on_error, resolve
from gpudiag._values import whole_number
from gpudiag.analysis.memory_estimate import (
    MemoryEstimate,
    MemoryEstimateError,
    TransformerConfig,
    _checkpointing_name,
    estimate_transformer,
    normalize_optimizer,
    normalize_precision,
    with_parallelism,
)
from gpudiag.experiment.runner import Arm
from gpudiag.experiment.step_limit import shared_limits
from gpudiag.experiment.trial import isolated
from gpudiag.fixes import Fix
from gpudiag.profiling.memory import fake_copy, fake_tensors, traced_step_memory
from gpudiag.step import Workload

__all__ = ["MemoryEstimate", "MemoryEstimateError", "estimate_memory", "memory_fixes"]


def memory_fixes(precision: str | None, checkpointing: Any) -> tuple[Fix, ...]:
    """The trial fixes that give a step the asked-for precision and checkpointing."""
    fixes: list[Fix] = []
    if precision is not None:
        prec = normalize_precision(precision)
        if prec in ("bf16", "fp16"):
            fixes.append(Fix(f"precision.{prec}"))
        elif prec == "fp8":
            raise MemoryEstimateError(
                "the traced route applies bf16 or fp16 autocast; fp8 needs Transformer Engine "
                "on a GPU (use a config for the formula route)"
            )
    if checkpointing not in (None, False, "none", "off", 0):
        every = checkpointing if isinstance(checkpointing, int) and checkpointing > 1 else 1
        if isinstance(checkpointing, str) and checkpointing not in ("full", "on"):
            raise MemoryEstimateError(
                "checkpointing must be None, True/'full' or a block interval, got "
                f"{checkpointing!r}"
            )
        fixes.append(Fix("activation.checkpointing", every_n_layers=every))
    return tuple(fixes)


def optimizer_factory(name: str) -> Callable[[Any], Any] | None:
    """A factory for a named optimizer (None for 'none'); adam8bit needs bitsandbytes."""
    import torch

    opt = normalize_optimizer(name)
    if opt == "none":
        return None
    if opt == "adam8bit":
        try:
            import bitsandbytes  # type: ignore[import-not-found]
        except ImportError:
            raise MemoryEstimateError(
                "adam8bit needs bitsandbytes (pip install bitsandbytes), not installed here"
            ) from None
        cls: Any = bitsandbytes.optim.AdamW8bit
        return lambda params: cls(params)
    table: dict[str, Callable[[Any], Any]] = {
        "adam": lambda p: torch.optim.Adam(p),
        "adamw": lambda p: torch.optim.AdamW(p),
        "sgd": lambda p: torch.optim.SGD(p, lr=0.01),
        "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9),
    }
    if opt not in table:
        raise MemoryEstimateError(f"the traced route cannot build a {opt} optimizer")
    return table[opt]


def _is_config(obj: Any) -> bool:
    if isinstance(obj, (TransformerConfig, Mapping)):
        return True
    return hasattr(obj, "num_hidden_layers") or hasattr(obj, "n_layer")


def _optimizer_name(workload: Workload) -> str:
    opt = workload.optimizer
    if workload.optimizer_factory is None:
        return "none"
    if isinstance(opt, type):
        return opt.__name__.lower()
    if hasattr(opt, "param_groups"):
        return type(opt).__name__.lower()
    return "workload's"


def traced_peak(
    workload: Workload,
    batch_size: int,
    fixes: tuple[Fix, ...] = (),
    optimizer: Callable[[Any], Any] | str | None = "workload",
) -> tuple[int, dict[str, int]]:
    """Peak bytes and categories at the peak of one steady-state step, traced on fake tensors.

    One step runs first (its optimizer creates its state), then the second is traced: the
    peak is that of a step with the optimizer state already live, as in training.
    """
    if not workload.owns_step:
        raise MemoryEstimateError(
            "a step function holds real tensors gpudiag cannot trace; gd.memory(workload) "
            "measures it instead, or describe the model with gd.Workload(model, batch=...)"
        )
    import torch

    # The user's loss and batch code runs here too: whatever it does to the process (the
    # working directory, sys.argv, the environment, torch's switches) is put back.
    with isolated(), fake_tensors() as mode:
        model = fake_copy(mode, workload.model)
        wl = copy.copy(workload)
        wl.model, wl.batch_size, wl.protected = model, int(batch_size), (model,)
        if optimizer != "workload":
            wl.optimizer_factory = optimizer if callable(optimizer) else None
        arm = Arm("estimate", fixes, wl, model, False, workload.device_type, fake=True)
        arm.open()
        try:
            arm.new_optimizer()
            batch = arm.target.next_micro_batches()
            inputs = [
                t for t in torch.utils._pytree.tree_leaves(batch) if isinstance(t, torch.Tensor)
            ]
            with arm.active():
                arm.step()
                traced = traced_step_memory(
                    arm.step,
                    track=[m for m in (model, arm.target.optimizer) if m is not None] + inputs,
                    device=workload.device_type,
                )
        finally:
            arm.close()
    return traced.peak_bytes, traced.at_peak


def _traced_estimate(
    workload: Workload,
    *,
    batch_size: int | None,
    precision: str | None,
    optimizer: str | None,
    checkpointing: Any,
    scale_by_batch: bool = True,
    on_progress: ProgressFn | None = None,
) -> MemoryEstimate:
    if not workload.owns_step:
        traced_peak(workload, 1)  # raises the step-function error
    size = (
        workload.batch_size
        if batch_size is None
        else whole_number(batch_size, "batch_size", low=1, high=1 << 30, error=MemoryEstimateError)
    )
    fixes = memory_fixes(precision, checkpointing)
    factory: Any = "workload" if optimizer is None else optimizer_factory(optimizer)
    other = size // 2 if size > 1 else 2
    second = scale_by_batch and callable(workload.batch)  # a fixed batch has one size
    stages = Stages(on_progress, "traced step", 1 + second)
    with closed_on_error(on_progress):
        stages.next(f"two steps on fake tensors at batch {size}")
        peak, at_peak = traced_peak(workload, size, fixes, factory)
        per_sample: int | None = None
        if second:
            stages.next(f"two steps on fake tensors at batch {other}")
            other_peak, _ = traced_peak(workload, other, fixes, factory)
            per_sample = max(0, round((peak - other_peak) / (size - other)))
    stages.finish()
    assert workload.model is not None  # owns_step: a Workload(model, ...)
    n_params = sum(p.numel() for p in workload.model.parameters())
    return MemoryEstimate(
        peak_bytes=int(peak),
        breakdown=at_peak,
        route="traced",
        model=workload.name,
        batch_size=size,
        precision=normalize_precision(precision) if precision else "fp32",
        optimizer=normalize_optimizer(optimizer) if optimizer else _optimizer_name(workload),
        checkpointing=_checkpointing_name(True if checkpointing else None),
        per_sample_bytes=per_sample,
        parameters=n_params,
        assumptions=(
            f"one steady-state step traced on fake tensors at batch {size} (and {other} for "
            "the bytes per sample): nothing allocated",
            "bf16/fp16 is torch autocast: fp32 weights, 16-bit activation copies"
            if precision in ("bf16", "fp16")
            else "precision as the workload runs",
            "what operators declare; a CPU kernel's private scratch (oneDNN conv/batch-norm "
            "backward) and allocator rounding on a GPU are not seen",
        ),
    )


def estimate_memory(
    workload_or_model: Any,
    *,
    batch_size: int | None = None,
    seq_len: int | None = None,
    precision: str | None = None,
    optimizer: str | None = None,
    checkpointing: Any = None,
    parallelism: Any = None,
    inputs: Any = None,
    training: bool = True,
    scale_by_batch: bool = True,
    progress: bool | ProgressFn = True,
) -> MemoryEstimate:
    """Peak memory of one training step per GPU, before running it.

    ``workload_or_model``: a ``gd.Workload`` or an ``nn.Module`` with ``inputs`` (a batch, or
    ``batch_size -> batch``; the module must return a scalar loss or ``.loss``) -> traced
    route; a transformer config (dict, Hugging Face config, TransformerConfig) -> formula
    route (``seq_len``, ``training=False`` for generation with its KV cache). ``precision``:
    fp32 / bf16 / fp16; ``optimizer``: adamw, adam, sgd, sgd_momentum, adam8bit, none (default:
    the workload's, AdamW for a config); ``checkpointing``: True/'full' or every n blocks;
    ``parallelism``: ``"fsdp:8"``, ``"ddp:4,tp:2"``, a dict or ``Parallelism``.
    ``scale_by_batch``: trace a second, smaller batch for the bytes per sample (``at_batch``,
    ``largest_batch``); off, one trace only. ``progress``: a bar over the traced steps
    (``True``; the formula route is instant), none (``False``), or a callback.
    """
    if workload_or_model is None:
        raise MemoryEstimateError("give a gd.Workload, an nn.Module with inputs=, or a config")
    if isinstance(workload_or_model, Workload):
        if seq_len is not None:
            raise MemoryEstimateError(
                "seq_len applies to a config; a workload's batch fixes its sequence length "
                "(build the workload at that length)"
            )
        with user_code_failures("gd.estimate_memory"), shared_limits(workload_or_model):
            est = _traced_estimate(
                workload_or_model,
                batch_size=batch_size,
                precision=precision,
                optimizer=optimizer,
                checkpointing=checkpointing,
                scale_by_batch=scale_by_batch,
                on_progress=resolve(progress, "estimate"),
            )
        return with_parallelism(est, parallelism)

    def formulas(config: Any, name: str = "") -> MemoryEstimate:
        return estimate_transformer(
            config,
            batch_size=batch_size or 1,
            seq_len=seq_len,
            precision=precision or "bf16",
            optimizer=optimizer or "adamw",
            checkpointing=checkpointing,
            parallelism=parallelism,
            training=training,
            name=name,
        )

    if _is_config(workload_or_model) and not _is_module(workload_or_model):
        return formulas(workload_or_model)
    if _is_module(workload_or_model):
        if inputs is None:
            config = getattr(workload_or_model, "config", None)
            if config is not None and _is_config(config):
                return formulas(config, name=type(workload_or_model).__name__)
            raise MemoryEstimateError(
                "to trace a module gpudiag needs its inputs: pass inputs= (a batch or a function "
                "batch_size -> batch) or a gd.Workload(model, batch=..., loss=..., optimizer=...)"
            )
        workload = Workload(
            workload_or_model,
            batch=inputs,
            optimizer=optimizer_factory(optimizer or "adamw"),
            batch_size=batch_size or 1,
        )
        return estimate_memory(
            workload,
            batch_size=batch_size,
            precision=precision,
            checkpointing=checkpointing,
            parallelism=parallelism,
            progress=progress,
        )
    raise MemoryEstimateError(
        f"cannot estimate the memory of a {type(workload_or_model).__name__}: give a gd.Workload, "
        "an nn.Module with inputs=, or a transformer config"
    )


def _is_module(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.nn.Module)
