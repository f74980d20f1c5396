"""One training step, and the workload it runs: the only code that runs forward, loss,
backward and the optimizer.

``Workload`` says what to run (a model, batches or a DataLoader, a loss, an optimizer factory,
or a user's own step function). ``Step`` runs it once per call: the micro-batches of a step
(accumulation), autocast, the gradient scaler, the optimizer. Fixes transform a Step
(``gpudiag.fixes``): a structural fix changes its model, optimizer, batch or dataloader; an
ambient fix is a context entered around its calls; an environment fix is only exported.
Trials, ``Recipe.apply``, diagnose's profiling step, batch scaling and the demo all run a Step.

This module sits below ``gpudiag.fixes`` and imports nothing above the measurement layer.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudiag._report import jsonable
from gpudiag._values import finite_number, whole_number
from gpudiag._views import Card, Carded, Facts
from gpudiag.errors import WorkloadError

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader

    from gpudiag.probe.system import SystemReport

# ``(model, batch) -> scalar tensor`` (or an object with ``.loss``): a workload's loss.
LossFn = Callable[["torch.nn.Module", Any], Any]
# ``params -> Optimizer``: builds a fresh optimizer for each trial.
OptimizerFactory = Callable[[Any], "torch.optim.Optimizer"]


def move_to(batch: Any, device: torch.device | str) -> Any:
    """Tensors in a (nested) batch moved to ``device``; other values untouched."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch if batch.device == device else batch.to(device, non_blocking=True)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move_to(b, device) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to(b, device) for b in batch)
    if isinstance(batch, Mapping):
        return {k: move_to(v, device) for k, v in batch.items()}
    return batch


def split_batch(batch: Any, parts: int) -> list[Any] | None:
    """A (nested) batch cut into ``parts`` equal micro-batches along dim 0; None when its
    tensors do not share one leading size divisible by ``parts``."""
    import torch

    sizes: set[int] = set()

    def leading(b: Any) -> None:
        if isinstance(b, torch.Tensor):
            sizes.add(int(b.shape[0]) if b.dim() else -1)
        elif isinstance(b, (list, tuple)):
            for x in b:
                leading(x)
        elif isinstance(b, Mapping):
            for x in b.values():
                leading(x)

    leading(batch)
    if len(sizes) != 1 or (size := sizes.pop()) < parts or size % parts:
        return None

    def cut(b: Any, i: int) -> Any:
        if isinstance(b, torch.Tensor):
            return b.tensor_split(parts)[i]
        if isinstance(b, tuple) and hasattr(b, "_fields"):
            return type(b)(*(cut(x, i) for x in b))
        if isinstance(b, (list, tuple)):
            return type(b)(cut(x, i) for x in b)
        if isinstance(b, Mapping):
            return {k: cut(v, i) for k, v in b.items()}
        return b

    return [cut(batch, i) for i in range(parts)]


def leading_size(batch: Any) -> int | None:
    """The leading dimension of the first tensor in a (nested) batch: its samples."""
    import torch

    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(values, (list, tuple)) or isinstance(batch, Mapping):
        for item in values:
            size = leading_size(item)
            if size is not None:
                return size
    return None


@dataclass(frozen=True)
class StepRecord:
    """What the last step ran: its micro-batches' sizes (samples each) and whether an
    optimizer step followed."""

    micro_batches: tuple[int | None, ...]
    optimizer_step: bool

    @property
    def samples(self) -> int | None:
        if any(size is None for size in self.micro_batches):
            return None
        return sum(size for size in self.micro_batches if size is not None)

    def __str__(self) -> str:
        sizes = sorted({s for s in self.micro_batches if s is not None})
        each = "/".join(map(str, sizes)) if sizes else "?"
        return f"{len(self.micro_batches)} micro-batch(es) of {each} sample(s) per " + (
            "optimizer step" if self.optimizer_step else "step (no optimizer)"
        )


def default_loss(model: torch.nn.Module, batch: Any) -> Any:
    """``model(batch)`` (dicts as keyword arguments, tuples as positional ones), then its loss.

    The model must return a scalar tensor or an object with a ``.loss`` (Hugging Face style);
    anything else needs an explicit ``loss=``.
    """
    import torch

    if isinstance(batch, Mapping):
        out = model(**batch)
    elif isinstance(batch, (list, tuple)):
        out = model(*batch)
    else:
        out = model(batch)
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, Mapping):
        loss = out.get("loss")
    if loss is None:
        loss = out
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise WorkloadError(
            "the model does not return a scalar loss (or an output with .loss): pass "
            "loss=lambda model, batch: ... to gd.Workload"
        )
    return loss


def constructor_settings(cls: type, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of an optimizer's ``defaults`` that its constructor takes as keywords.

    ``defaults`` may hold more than the constructor accepts (torch 2.13's AdamW keeps
    ``decoupled_weight_decay``, which ``AdamW.__init__`` does not take); a constructor with
    ``**kwargs`` gets them all."""
    import inspect

    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):  # a constructor without a signature: trust the defaults
        return dict(defaults)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return dict(defaults)
    accepted = {
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    return {k: v for k, v in defaults.items() if k in accepted and k != "params"}


def _step_timeout(value: object) -> float | None:
    """``step_timeout_s``: None (the trial's default), a positive number of seconds, or inf."""
    if value is None or (isinstance(value, float) and math.isinf(value) and value > 0):
        return value
    return finite_number(value, "step_timeout_s", low=0, low_open=True, error=WorkloadError)


def needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    """The optimizer's ``step`` requires a closure that re-evaluates the loss (LBFGS)."""
    import inspect

    try:
        closure = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return closure is not None and closure.default is inspect.Parameter.empty


def _optimizer_factory(optimizer: object) -> OptimizerFactory | None:
    if optimizer is None:
        return None
    import torch

    if isinstance(optimizer, torch.optim.Optimizer):
        # A ready optimizer: rebuild one of the same class and settings for each trial.
        cls: Any = type(optimizer)
        settings = constructor_settings(cls, optimizer.defaults)
        return lambda params: cls(params, **settings)
    if callable(optimizer):  # a factory, or an Optimizer class (default settings)
        factory: OptimizerFactory = optimizer
        return factory
    raise WorkloadError(
        "optimizer= must be a factory (params -> Optimizer), e.g. "
        "lambda params: torch.optim.AdamW(params, lr=1e-3)"
    )


class Workload(Carded):
    """One training step gpudiag can run again and again, on copies, with fixes applied.

    ``batch``: ``batch_size -> batch`` (called once per arm, outside the timed steps; a ready
    batch is accepted too). ``loss``: ``(model, batch) -> scalar tensor`` (default: the model's
    own loss). ``optimizer``: a factory ``params -> Optimizer`` so each trial gets a fresh one
    (an optimizer instance is accepted and rebuilt with its settings; None means forward and
    backward only). ``dataloader``: when the input pipeline is part of what is measured, each
    step takes its batch from it. ``tokens_per_sample``: for tokens/s.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        batch: Any = None,
        loss: LossFn | None = None,
        optimizer: torch.optim.Optimizer | OptimizerFactory | None = None,
        batch_size: int = 8,
        dataloader: Iterable[Any] | None = None,
        tokens_per_sample: int | None = None,
        name: str | None = None,
        step_timeout_s: float | None = None,
    ) -> None:
        import torch

        if not isinstance(model, torch.nn.Module):
            raise WorkloadError(
                f"model must be a torch.nn.Module, got {type(model).__name__}; for any other "
                "callable use gd.Workload.from_step(step_fn)"
            )
        if batch is None and dataloader is None:
            raise WorkloadError(
                "give batch= (a function batch_size -> batch, or a batch) or dataloader= so the "
                "workload has inputs"
            )
        batch_size = whole_number(batch_size, "batch_size", low=1, error=WorkloadError)
        if loss is not None and not callable(loss):
            raise WorkloadError("loss= must be a function (model, batch) -> scalar tensor")
        self.model: torch.nn.Module | None = model
        self.batch = batch
        self.loss = loss
        self.optimizer = optimizer
        self.optimizer_factory = _optimizer_factory(optimizer)
        self.batch_size = int(batch_size)
        self.dataloader: Iterable[Any] | None = dataloader
        self.tokens_per_sample = tokens_per_sample
        self.name = name or type(model).__name__
        self.step_timeout_s = _step_timeout(step_timeout_s)
        self.step_fn: Callable[[], Any] | None = None
        self.protected: tuple[Any, ...] = (model,)
        # (demo name or "module:function", keyword arguments) that rebuild this workload in
        # another process: set by gpudiag.workloads.get, needed by gd.compare(..., nproc=N).
        self.rebuild_spec: tuple[str, dict[str, Any]] | None = None

    @classmethod
    def from_step(
        cls,
        step_fn: Callable[[], Any],
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        batch_size: int | None = None,
        tokens_per_sample: int | None = None,
        name: str | None = None,
        step_timeout_s: float | None = None,
    ) -> Workload:
        """Wrap any callable that runs one step (only ambient fixes and compile then apply).

        Give the ``model`` / ``optimizer`` the step changes: they are restored after the
        comparison, reset between arms for the drift check, and the model's gradients give
        the gradient norm. The step may return its loss (a tensor, a number, or an object
        with ``.loss``) for the drift check.
        """
        if not callable(step_fn):
            raise WorkloadError("from_step needs a callable that runs one training step")
        self = cls.__new__(cls)
        self.model = model
        self.batch = None
        self.loss = None
        self.optimizer = optimizer
        self.optimizer_factory = None
        self.batch_size = (
            whole_number(batch_size, "batch_size", low=1, error=WorkloadError) if batch_size else 0
        )
        self.dataloader = None
        self.tokens_per_sample = tokens_per_sample
        self.name = name or str(getattr(step_fn, "__name__", "step"))
        self.step_timeout_s = _step_timeout(step_timeout_s)
        self.step_fn = step_fn
        self.protected = tuple(o for o in (model, optimizer) if o is not None)
        self.rebuild_spec = None
        return self

    # -- facts --------------------------------------------------------------------------
    @property
    def owns_step(self) -> bool:
        """gpudiag runs forward, loss, backward and the optimizer itself (not a step function)."""
        return self.step_fn is None

    @property
    def device(self) -> torch.device:
        import torch

        if self.model is None:
            return torch.device("cpu")
        for t in itertools.chain(self.model.parameters(), self.model.buffers()):
            return t.device
        return torch.device("cpu")

    @property
    def device_type(self) -> str:
        return str(self.device.type)

    def loss_fn(self) -> LossFn:
        return self.loss or default_loss

    def make_batch(self) -> Any:
        """The fixed batch of a ``batch=`` workload, on the model's device."""
        if self.batch is None:
            raise WorkloadError("this workload takes its batches from its dataloader")
        value = self.batch(self.batch_size) if callable(self.batch) else self.batch
        return move_to(value, self.device)

    def batches(self) -> Iterator[Any]:
        """Endless batches: the dataloader cycled (its work timed), else one fixed batch."""
        loader = self.dataloader
        if loader is not None:
            device = self.device

            def cycle() -> Iterator[Any]:
                while True:
                    empty = True
                    for b in loader:
                        empty = False
                        yield move_to(b, device)
                    if empty:
                        raise WorkloadError("the dataloader yielded no batches")

            return cycle()
        return itertools.repeat(self.make_batch())

    def samples_per_step(self) -> int:
        if self.dataloader is not None:
            size = getattr(self.dataloader, "batch_size", None)
            if size:
                return int(size)
        return self.batch_size

    def describe(self) -> str:
        if self.step_fn is not None:
            return f"step function {self.name!r}" + (
                f" on {type(self.model).__name__}" if self.model is not None else ""
            )
        assert self.model is not None  # a Workload(model, ...) owns its step
        parts = [f"{self.name}: {type(self.model).__name__}"]
        n_params = sum(p.numel() for p in self.model.parameters())
        parts.append(f"{n_params / 1e6:.2f} M parameters")
        parts.append(f"batch {self.samples_per_step()}")
        if self.dataloader is not None:
            workers = getattr(self.dataloader, "num_workers", None)
            parts.append(f"from a DataLoader (num_workers={workers})")
        parts.append(
            "optimizer "
            + ("none (forward + backward)" if self.optimizer_factory is None else self._opt_name())
        )
        parts.append(f"on {self.device}")
        return ", ".join(parts)

    def _opt_name(self) -> str:
        opt = self.optimizer
        if isinstance(opt, type):
            return opt.__name__
        if hasattr(opt, "param_groups"):
            return type(opt).__name__
        name = getattr(opt, "__name__", "")
        return "factory" if not name or name == "<lambda>" else str(name)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "name": self.name,
                "kind": "model" if self.owns_step else "step function",
                "model": type(self.model).__name__ if self.model is not None else None,
                "batch_size": self.samples_per_step(),
                "tokens_per_sample": self.tokens_per_sample,
                "dataloader": self.dataloader is not None,
                "device": str(self.device),
                "description": self.describe(),
            }
        )

    def __repr__(self) -> str:
        return f"Workload({self.describe()})"

    def as_card(self) -> Card:
        rows = [(k, v) for k, v in self.to_dict().items() if v is not None]
        return Card(f"Workload {self.name}", [Facts(rows)])


def grad_norm(model: torch.nn.Module) -> float | None:
    """L2 norm of all gradients of ``model`` (None when it has none)."""
    import torch

    grads = [p.grad.detach().float() for p in model.parameters() if p.grad is not None]
    if not grads:
        return None
    norms = torch.stack([torch.linalg.vector_norm(g) for g in grads])
    return float(torch.linalg.vector_norm(norms))


def loss_value(out: Any) -> float | None:
    """A step's loss as a float, from a tensor, a number or an object with ``.loss``."""
    import torch

    loss = getattr(out, "loss", out)
    if isinstance(out, Mapping):
        loss = out.get("loss")
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return float(loss.detach().float())
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return float(loss)
    return None


def rebuild_loader(loader: DataLoader[Any], **overrides: Any) -> DataLoader[Any]:
    """A new DataLoader over ``loader``'s dataset, sampler and collate function, with
    ``overrides`` (``batch_size``, ``num_workers``, ``pin_memory``, ...) replacing its settings.
    Settings that only exist with workers are dropped when ``num_workers`` is 0."""
    from torch.utils.data import DataLoader, IterableDataset

    settings: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "persistent_workers": loader.persistent_workers,
        "prefetch_factor": loader.prefetch_factor,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
    }
    new_batch_size = overrides.pop("batch_size", None)
    settings.update(overrides)
    if not settings["num_workers"]:
        settings["num_workers"] = 0
        settings["persistent_workers"] = False
        settings["prefetch_factor"] = None
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset):
        batching: dict[str, Any] = {
            "batch_size": new_batch_size or loader.batch_size,
            "drop_last": loader.drop_last,
        }
    elif loader.batch_size is None and new_batch_size is None:
        batching = {"batch_sampler": loader.batch_sampler}  # the user's own batch sampler
    else:
        batching = {
            "batch_size": new_batch_size or loader.batch_size,
            "sampler": loader.sampler,
            "drop_last": loader.drop_last,
        }
    return DataLoader(dataset, **batching, **settings)


@dataclass
class Step:
    """One training step and everything the fixes may change about it.

    ``model`` is the step's own copy (or the user's model when fixes are applied to a
    training script); a structural fix may replace it with a wrapper (``torch.compile``).
    ``base_model`` stays the unwrapped module (its gradients give the gradient norm).
    ``autocast_dtype`` and ``scaler`` are set by the precision fixes: ``run`` puts the forward
    and loss under autocast and scales the loss; a user's step function runs entirely under
    autocast; fixes applied to a user's model wrap ``model.forward``. The batch fixes set
    ``micro_batch`` and ``accumulation``; ``dataloader.tuning`` replaces ``dataloader``.

    ``Step.of(workload)`` builds the step of a workload; ``open()`` starts its batches,
    ``new_optimizer()`` gives it a fresh optimizer, ``run()`` (or calling it) runs one step.
    """

    model: Any = None
    optimizer: Any = None
    step_fn: Callable[[], Any] | None = None
    owns_step: bool = False  # gpudiag runs forward / loss / backward / optimizer itself
    device_type: str = "cpu"
    autocast_dtype: Any = None
    scaler: Any = None
    system: SystemReport | None = None
    notes: list[str] = field(default_factory=list)
    # The batch of the step (from the workload; the batch fixes change them).
    batch_size: int | None = None  # samples per step of the workload as given
    dataloader: Any = None  # the workload's DataLoader, or a rebuilt one
    micro_batch: int | None = None  # batch.size: samples per forward/backward
    accumulation: int = 1  # batch.size: micro-batches per optimizer step
    # Arms that share one model prepare their fixes again around every measured sample.
    per_sample: bool = False
    # The fix that captures CUDA graphs of the step ("" for none): see claim_graph_capture.
    graph_capture: str = ""
    workload: Workload | None = None
    base_model: Any = None
    # A context around each micro-batch's forward and backward, told whether it is the last
    # one (a distributed rank: DDP's no_sync, FSDP's gradient sync, on all but the last).
    grad_sync: Callable[[bool], AbstractContextManager[Any]] | None = None
    # Keep the step's loss (a detached tensor, summed over micro-batches) in ``last_loss``.
    keep_loss: bool = False
    last_loss: Any = field(default=None, repr=False)
    # What the last step of gpudiag's own step ran (None for a step function).
    last_run: StepRecord | None = field(default=None, repr=False)
    # What the fixes keep between calls of their hooks on this step (a GradScaler, the
    # wrappers they installed, whose counters prove the fix ran): fix id -> value.
    state: dict[str, Any] = field(default_factory=dict, repr=False)
    _batches: Iterator[list[Any]] | None = field(default=None, repr=False)
    _micro_loader: Any = field(default=None, repr=False)

    @classmethod
    def of(
        cls,
        workload: Workload,
        model: torch.nn.Module | None = None,
        *,
        device_type: str | None = None,
        system: SystemReport | None = None,
        per_sample: bool = False,
    ) -> Step:
        """The step of ``workload`` on ``model`` (default: the workload's own model)."""
        model = workload.model if model is None else model
        return cls(
            model=model,
            step_fn=workload.step_fn,
            owns_step=workload.owns_step,
            device_type=device_type or workload.device_type,
            system=system,
            batch_size=workload.samples_per_step() if workload.owns_step else None,
            dataloader=workload.dataloader,
            per_sample=per_sample,
            workload=workload,
            base_model=model,
        )

    # -- batches and optimizer ----------------------------------------------------------
    def samples_per_step(self) -> int:
        """Samples in one optimizer step (a batch fix changes it)."""
        wl = self._workload()
        if not wl.owns_step or not self.batch_size:
            return wl.samples_per_step()
        return (self.micro_batch or self.batch_size) * self.accumulation

    def open(self) -> None:
        """Start the batches (again: a dataloader re-shuffles from the current RNG state)."""
        if self._workload().owns_step:
            self._batches = self._step_batches()

    def _step_batches(self) -> Iterator[list[Any]]:
        """The micro-batches of each step: one batch, unless a batch fix splits or resizes it."""
        wl = copy.copy(self._workload())
        micro = self.micro_batch or self.batch_size or wl.batch_size
        parts = self.accumulation
        if self.dataloader is not None:
            loader = self.dataloader
            if loader.batch_size is not None and micro != loader.batch_size:
                if self._micro_loader is None:
                    self._micro_loader = rebuild_loader(loader, batch_size=micro)
                loader = self._micro_loader
            wl.dataloader = loader
            source = wl.batches()
            return iter(lambda: [next(source) for _ in range(parts)], None)
        if micro * parts == wl.batch_size and parts > 1:
            chunks = split_batch(wl.make_batch(), parts)
            if chunks is not None:
                return itertools.repeat(chunks)
        wl.batch_size = micro
        return itertools.repeat([wl.make_batch()] * parts)

    def next_micro_batches(self) -> list[Any]:
        """The micro-batches of the next step, taken from the step's batches (the step run
        after this call gets the ones that follow); empty when there are none (a step
        function, or a step never opened)."""
        if self._batches is None and self.workload is not None and self.workload.owns_step:
            self.open()
        if self._batches is None:
            return []
        return list(next(self._batches))

    def feed(self, micro_batches: list[Any]) -> None:
        """Run every step on these micro-batches (instead of the workload's batches)."""
        self._batches = itertools.repeat(list(micro_batches))

    @property
    def loader_in_use(self) -> Any:
        """The DataLoader the step iterates: the micro-batch loader a batch fix rebuilt from
        ``dataloader``, else ``dataloader`` itself (None without one)."""
        return self._micro_loader if self._micro_loader is not None else self.dataloader

    def close(self) -> None:
        """Drop the batches (lets DataLoader workers shut down)."""
        self._batches = self._micro_loader = None

    def new_optimizer(self) -> None:
        """A fresh optimizer from the workload's factory (a step function keeps its own)."""
        wl = self._workload()
        factory = wl.optimizer_factory
        self.optimizer = factory(self.base_model.parameters()) if factory is not None else None
        if wl.step_fn is not None:
            self.optimizer = wl.optimizer

    def _workload(self) -> Workload:
        if self.workload is None:
            raise WorkloadError("this step has no workload to run (build it with Step.of)")
        return self.workload

    # -- running ------------------------------------------------------------------------
    def autocast(self) -> AbstractContextManager[Any]:
        """The autocast context the precision fixes asked for (none without one)."""
        if self.autocast_dtype is None:
            return nullcontext()
        import torch

        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def run(self, record: bool = False) -> tuple[float | None, float | None]:
        """One training step; with ``record``, its loss and gradient norm (costs a sync)."""
        if self._workload().owns_step:
            return self._model_step(record)
        return self._function_step(record)

    def __call__(self) -> None:
        self.run()

    def _model_step(self, record: bool) -> tuple[float | None, float | None]:
        if self._batches is None:
            self.open()
        assert self._batches is not None
        micro_batches = next(self._batches)
        scaler, opt = self.scaler, self.optimizer
        loss_fn = self._workload().loss_fn()
        losses = self._forward_backward(micro_batches, loss_fn)
        if self.keep_loss:
            self.last_loss = sum(losses[1:], losses[0])
        self.last_run = StepRecord(
            tuple(leading_size(b) for b in micro_batches), optimizer_step=opt is not None
        )
        norm = None
        if record:
            if scaler is not None and opt is not None:
                scaler.unscale_(opt)
            norm = grad_norm(self.base_model)
            if norm is not None and scaler is not None and opt is None:
                norm /= float(scaler.get_scale())
        if opt is not None:
            if needs_closure(opt):
                if scaler is not None:
                    raise WorkloadError(
                        f"{type(opt).__name__} re-evaluates the loss (step(closure)), which "
                        "torch's GradScaler does not support: use bf16 rather than fp16"
                    )
                opt.step(self._closure(micro_batches, loss_fn, losses))
            elif scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            self.base_model.zero_grad(set_to_none=True)
        return (sum(float(x.float()) for x in losses) if record else None), norm

    def _forward_backward(self, micro_batches: list[Any], loss_fn: LossFn) -> list[Any]:
        """Forward, loss and backward of each micro-batch; their detached losses."""
        scaler = self.scaler
        losses = []
        n = len(micro_batches)
        for i, batch in enumerate(micro_batches):
            with self._sync(i == n - 1):
                with self.autocast():
                    loss = loss_fn(self.model, batch)
                if n > 1:
                    loss = loss / n
                (scaler.scale(loss) if scaler is not None else loss).backward()
            losses.append(loss.detach())
        return losses

    def _closure(
        self, micro_batches: list[Any], loss_fn: LossFn, first: list[Any]
    ) -> Callable[[], Any]:
        """``optimizer.step(closure)`` for optimizers that re-evaluate the loss (LBFGS): the
        first call returns this step's loss (its gradients are in place), later calls run the
        forward and backward again on the same micro-batches."""
        calls = [0]

        def closure() -> Any:
            calls[0] += 1
            losses = first
            if calls[0] > 1:
                self.optimizer.zero_grad(set_to_none=False)
                losses = self._forward_backward(micro_batches, loss_fn)
            return sum(losses[1:], losses[0])

        return closure

    def _sync(self, last: bool) -> AbstractContextManager[Any]:
        return nullcontext() if self.grad_sync is None else self.grad_sync(last)

    def _function_step(self, record: bool) -> tuple[float | None, float | None]:
        assert self.step_fn is not None
        with self.autocast():
            out = self.step_fn()
        if not record:
            return None, None
        norm = grad_norm(self.base_model) if self.base_model is not None else None
        return loss_value(out), norm
