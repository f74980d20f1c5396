"""``gd.Workload``: what a trial runs: a model, an optimizer factory, batches and a loss."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from gpudiag._report import card, html_table, jsonable
from gpudiag.errors import WorkloadError


def move_to(batch: Any, device: Any) -> Any:
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


def default_loss(model: Any, batch: Any) -> Any:
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


def _optimizer_factory(optimizer: Any) -> Callable[[Any], Any] | None:
    if optimizer is None:
        return None
    import torch

    if isinstance(optimizer, torch.optim.Optimizer):
        # A ready optimizer: rebuild one of the same class and settings for each trial.
        cls: Any = type(optimizer)
        defaults = dict(optimizer.defaults)
        return lambda params: cls(params, **defaults)
    if callable(optimizer):  # a factory, or an Optimizer class (default settings)
        factory: Callable[[Any], Any] = optimizer
        return factory
    raise WorkloadError(
        "optimizer= must be a factory (params -> Optimizer), e.g. "
        "lambda params: torch.optim.AdamW(params, lr=1e-3)"
    )


class Workload:
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
        model: Any,
        batch: Any = None,
        loss: Callable[[Any, Any], Any] | None = None,
        optimizer: Any = None,
        batch_size: int = 8,
        dataloader: Any = None,
        tokens_per_sample: int | None = None,
        name: str | None = None,
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
        if int(batch_size) < 1:
            raise WorkloadError(f"batch_size must be at least 1, got {batch_size}")
        if loss is not None and not callable(loss):
            raise WorkloadError("loss= must be a function (model, batch) -> scalar tensor")
        self.model = model
        self.batch = batch
        self.loss = loss
        self.optimizer = optimizer
        self.optimizer_factory = _optimizer_factory(optimizer)
        self.batch_size = int(batch_size)
        self.dataloader = dataloader
        self.tokens_per_sample = tokens_per_sample
        self.name = name or type(model).__name__
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
        model: Any = None,
        optimizer: Any = None,
        batch_size: int | None = None,
        tokens_per_sample: int | None = None,
        name: str | None = None,
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
        self.batch_size = int(batch_size) if batch_size else 0
        self.dataloader = None
        self.tokens_per_sample = tokens_per_sample
        self.name = name or str(getattr(step_fn, "__name__", "step"))
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
    def device(self) -> Any:
        import torch

        if self.model is None:
            return torch.device("cpu")
        for t in itertools.chain(self.model.parameters(), self.model.buffers()):
            return t.device
        return torch.device("cpu")

    @property
    def device_type(self) -> str:
        return str(self.device.type)

    def loss_fn(self) -> Callable[[Any, Any], Any]:
        return self.loss or default_loss

    def make_batch(self) -> Any:
        """The fixed batch of a ``batch=`` workload, on the model's device."""
        if self.batch is None:
            raise WorkloadError("this workload takes its batches from its dataloader")
        value = self.batch(self.batch_size) if callable(self.batch) else self.batch
        return move_to(value, self.device)

    def batches(self) -> Iterator[Any]:
        """Endless batches: the dataloader cycled (its work timed), else one fixed batch."""
        if self.dataloader is not None:
            device = self.device

            def cycle() -> Iterator[Any]:
                while True:
                    empty = True
                    for b in self.dataloader:
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

    def _repr_html_(self) -> str:
        rows = [(k, v) for k, v in self.to_dict().items() if v is not None]
        return card(f"Workload {self.name}", html_table(rows))
