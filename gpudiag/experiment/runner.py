"""One arm of a comparison: a workload with its fixes applied, run step by step and timed."""

from __future__ import annotations

import copy
import itertools
import random
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from gpudiag.experiment.drift import StepTrace
from gpudiag.experiment.workload import Workload, split_batch
from gpudiag.fixes import Fix, FixTarget
from gpudiag.fixes.base import ordered
from gpudiag.fixes.dataloader import rebuild_loader
from gpudiag.probe import cuda


def seed_everything(seed: int) -> None:
    """Same seed for torch (every device), Python and NumPy, so arms see the same randomness."""
    import numpy as np
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def grad_norm(model: Any) -> float | None:
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


def load_values(model: Any, values: Mapping[str, Any]) -> None:
    """Copy snapshot values into a model's parameters and buffers by name (same architecture)."""
    import torch

    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if name in values:
                t.copy_(values[name])
        model.zero_grad(set_to_none=True)


@dataclass
class Arm:
    """A label, its fixes, and the private objects they were applied to."""

    label: str
    fixes: tuple[Fix, ...]
    workload: Workload
    base_model: Any  # the arm's model before any wrapper (a deep copy, or the user's model)
    shared: bool  # the model is shared with other arms: model-level fixes apply per sample
    device_type: str
    system: Any = None
    target: FixTarget = field(default_factory=FixTarget)
    samples_s: list[float] = field(default_factory=list)
    warmup_s: list[float] = field(default_factory=list)
    first_step_s: float | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    _stack: ExitStack = field(default_factory=ExitStack)
    _batches: Iterator[list[Any]] | None = None
    _micro_loader: Any = None
    # Samples in one optimizer step of this arm (a batch fix changes it), fixed at open().
    samples_per_step: int = 0

    @property
    def is_baseline(self) -> bool:
        return not self.fixes

    # -- lifetime -----------------------------------------------------------------------
    def open(self) -> None:
        wl = self.workload
        self.target = FixTarget(
            model=self.base_model,
            step_fn=wl.step_fn,
            owns_step=wl.owns_step,
            device_type=self.device_type,
            system=self.system,
            batch_size=wl.samples_per_step() if wl.owns_step else None,
            dataloader=wl.dataloader,
            per_sample=self.shared,
        )
        if not self.shared:
            self._prepare(self._stack)
            self._collect_notes()
        self.samples_per_step = self._samples_per_step()
        self.reset_batches()

    def _samples_per_step(self) -> int:
        t = self.target
        if not self.workload.owns_step or not t.batch_size:
            return self.workload.samples_per_step()
        return (t.micro_batch or t.batch_size) * t.accumulation

    def reset_batches(self) -> None:
        """Start the batches again (a dataloader re-shuffles from the current RNG state)."""
        if self.workload.owns_step:
            self._batches = self._step_batches()

    def _step_batches(self) -> Iterator[list[Any]]:
        """The micro-batches of each step: one batch, unless a batch fix splits or resizes it."""
        t, wl = self.target, copy.copy(self.workload)
        micro = t.micro_batch or t.batch_size or wl.batch_size
        parts = t.accumulation
        if t.dataloader is not None:
            loader = t.dataloader
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

    def close(self) -> None:
        self._collect_notes()  # fixes may note what happened while stepping
        self._stack.close()
        self._batches = self._micro_loader = None  # lets DataLoader workers shut down

    def _prepare(self, stack: ExitStack) -> None:
        for fix in ordered(self.fixes):  # FixSpec.order: compile wraps, cuda.graphs captures that
            fix.spec.prepare(fix.params, self.target, stack)

    def _collect_notes(self) -> None:
        for note in self.target.notes:
            if note not in self.notes:
                self.notes.append(note)

    def new_optimizer(self) -> None:
        factory = self.workload.optimizer_factory
        self.target.optimizer = (
            factory(self.base_model.parameters()) if factory is not None else None
        )
        if self.workload.step_fn is not None:
            self.target.optimizer = self.workload.optimizer

    @contextmanager
    def active(self) -> Iterator[None]:
        """The arm's switches (and, on a shared model, its model-level changes) for a while."""
        with ExitStack() as stack:
            if self.shared:
                self._prepare(stack)
                self._collect_notes()
            for fix in self.fixes:
                stack.enter_context(fix.spec.scope(fix.params, self.target))
            yield

    # -- stepping -----------------------------------------------------------------------
    def step(self, record: bool = False) -> tuple[float | None, float | None]:
        """One training step; with ``record``, its loss and gradient norm (costs a sync)."""
        if self.workload.owns_step:
            return self._model_step(record)
        return self._function_step(record)

    def _autocast(self) -> Any:
        if self.target.autocast_dtype is None:
            return nullcontext()
        import torch

        return torch.autocast(self.device_type, dtype=self.target.autocast_dtype)

    def _model_step(self, record: bool) -> tuple[float | None, float | None]:
        t = self.target
        assert self._batches is not None
        micro_batches = next(self._batches)
        scaler, opt = t.scaler, t.optimizer
        loss_fn = self.workload.loss_fn()
        losses = []
        for batch in micro_batches:
            with self._autocast():
                loss = loss_fn(t.model, batch)
            if len(micro_batches) > 1:
                loss = loss / len(micro_batches)
            (scaler.scale(loss) if scaler is not None else loss).backward()
            losses.append(loss.detach())
        norm = None
        if record:
            if scaler is not None and opt is not None:
                scaler.unscale_(opt)
            norm = grad_norm(self.base_model)
            if norm is not None and scaler is not None and opt is None:
                norm /= float(scaler.get_scale())
        if opt is not None:
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            self.base_model.zero_grad(set_to_none=True)
        return (sum(float(x.float()) for x in losses) if record else None), norm

    def _function_step(self, record: bool) -> tuple[float | None, float | None]:
        assert self.target.step_fn is not None
        with self._autocast():
            out = self.target.step_fn()
        if not record:
            return None, None
        norm = grad_norm(self.base_model) if self.base_model is not None else None
        return loss_value(out), norm

    def trace(self, steps: int, clock: Callable[[], float]) -> StepTrace:
        """Seeded steps recording loss and gradient norm; the first step's time is kept."""
        losses: list[float | None] = []
        norms: list[float | None] = []
        with self.active():
            for i in range(steps):
                t0 = clock()
                loss, norm = self.step(record=True)
                if i == 0 and self.first_step_s is None:
                    cuda.synchronize()
                    self.first_step_s = clock() - t0
                losses.append(loss)
                norms.append(norm)
        return StepTrace(tuple(losses), tuple(norms))

    def timed(self, steps: int, clock: Callable[[], float] | None) -> float:
        """Seconds per step over ``steps`` consecutive steps (device time on CUDA)."""
        with self.active():
            if clock is None:
                with cuda.device_timer() as elapsed:
                    for _ in range(steps):
                        self.step()
                seconds = elapsed[0]
            else:
                t0 = clock()
                for _ in range(steps):
                    self.step()
                cuda.synchronize()
                seconds = clock() - t0
        return seconds / steps
