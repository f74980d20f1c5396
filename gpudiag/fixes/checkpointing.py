"""activation.checkpointing: recompute the activations of repeated blocks in the backward pass.

Each chosen block's own ``forward`` (an instance attribute; its class is untouched) goes
through ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` while the block is
training with gradients on, and runs plainly otherwise (eval, ``torch.no_grad``). The blocks
are the submodules of the classes named in ``classes``, or else the repeated blocks found in
the model: the children of ``nn.ModuleList`` / ``nn.Sequential`` containers that hold two or
more modules of one class (transformer layers, ResNet stages' blocks). Reverting removes the
instance attributes. Runs for real on the CPU.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any

from pydantic import Field

from gpudiag.errors import UnsupportedFixError
from gpudiag.fixes.proof import Observation, Proof, applied, not_applied, unverified
from gpudiag.fixes.spec import (
    FixParams,
    FixSpec,
    Need,
    Step,
    register,
    replace_forward,
)


class CheckpointingParams(FixParams):
    every_n_layers: int = Field(1, ge=1)
    classes: tuple[str, ...] = ()


def class_names(module: Any) -> tuple[str, str]:
    """A module's class name and its qualified name (``pkg.mod.Block``): ``classes`` takes both."""
    cls = type(module)
    return cls.__name__, f"{cls.__module__}.{cls.__qualname__}"


def repeated_blocks(model: Any) -> list[Any]:
    """The blocks of the model's repeated class, in model order (empty when there is none).

    Candidates are the children of every ``nn.ModuleList`` / ``nn.Sequential`` whose children
    are two or more modules of one class. The class whose blocks hold the most parameters wins
    (then the most blocks), so an outer list of layers beats the lists nested inside each layer
    (a mixture of experts' experts, a stack of linears).
    """
    from torch import nn

    by_class: dict[type, list[Any]] = {}
    for container in model.modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(container.children())
        kinds = {type(child) for child in children}
        if len(children) >= 2 and len(kinds) == 1:
            by_class.setdefault(kinds.pop(), []).extend(children)
    if not by_class:
        return []

    def weight(blocks: list[Any]) -> tuple[int, int]:
        params = {id(p): p.numel() for block in blocks for p in block.parameters()}
        return sum(params.values()), len(blocks)

    chosen = {id(m) for m in max(by_class.values(), key=weight)}
    return outermost(model, lambda m: id(m) in chosen)


def named_blocks(model: Any, classes: tuple[str, ...]) -> list[Any]:
    """Submodules of the named classes (by name or qualified name), in model order."""
    wanted = set(classes)
    return outermost(model, lambda m: bool(wanted.intersection(class_names(m))))


def outermost(model: Any, selected: Callable[[Any], bool]) -> list[Any]:
    """The selected submodules that are not inside another selected one (already covered)."""
    found: list[Any] = []
    covered: list[str] = []
    for name, module in model.named_modules():
        if any(name == c or not c or name.startswith(c + ".") for c in covered):
            continue
        if selected(module):
            found.append(module)
            covered.append(name)
    return found


RUNNING_STATS = ("running_mean", "running_var", "num_batches_tracked")


def _running_stat_layers(block: Any) -> list[Any]:
    """BatchNorm-style layers in ``block`` that update running statistics while training."""
    return [
        m
        for m in block.modules()
        if getattr(m, "track_running_stats", False) and getattr(m, "running_mean", None) is not None
    ]


@contextmanager
def _running_stats_kept(layers: list[Any]) -> Iterator[None]:
    """Undo what the recomputation does to running statistics.

    The recomputed forward of a training BatchNorm updates ``running_mean`` / ``running_var``
    / ``num_batches_tracked`` a second time (momentum applied twice per step); its output does
    not depend on them (training mode normalises with the batch's statistics).
    """
    import torch

    saved = [
        (buf, buf.detach().clone())
        for m in layers
        for buf in (getattr(m, name, None) for name in RUNNING_STATS)
        if buf is not None
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, value in saved:
                buf.copy_(value)


class CheckpointedForward:
    """A block's ``forward`` that goes through ``torch.utils.checkpoint`` while training.

    A callable object rather than a closure, so ``copy.deepcopy`` of the model (a trial's
    copy) gives a copy whose blocks checkpoint themselves, not the original's blocks.
    """

    def __init__(self, module: Any, previous: Callable[..., Any] | None) -> None:
        self.module = module
        self.previous = previous  # the instance's own forward before this one, if it had one
        self.stat_layers = _running_stat_layers(module)
        self.checkpointed = 0  # forward calls that went through torch.utils.checkpoint
        self.recomputed = 0  # of those, forwards run again during a backward pass

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        if self.previous is not None:
            return self.previous
        return functools.partial(type(self.module).forward, self.module)

    def _contexts(self) -> tuple[AbstractContextManager[Any], AbstractContextManager[Any]]:
        return nullcontext(), _running_stats_kept(self.stat_layers)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch
        from torch.utils.checkpoint import checkpoint

        forward = self.__wrapped__
        if not (torch.is_grad_enabled() and self.module.training):
            return forward(*args, **kwargs)
        if kwargs:
            # bound here: checkpoint reads preserve_rng_state, debug, early_stop, ... by name
            forward = functools.partial(forward, **kwargs)
        if not torch.compiler.is_compiling():
            # Counted in eager mode only: traced, the counter would change the compiled graph
            # (a compiled arm's proof is "unverified" anyway).
            self.checkpointed += 1
            forward = functools.partial(_counted, self, forward)
        extra: dict[str, Any] = {}
        if self.stat_layers and not torch.compiler.is_compiling():
            # compiled graphs apply buffer updates once, in the forward graph; dynamo cannot
            # trace a custom context_fn
            extra["context_fn"] = self._contexts
        # use_reentrant must be given (torch 2.4+ warns without it); the non-reentrant variant
        # takes keyword arguments and inputs that do not require grad. preserve_rng_state
        # (default True) restores the RNG state for the recomputation, so dropout draws the
        # same masks as in the forward pass.
        return checkpoint(forward, *args, use_reentrant=False, **extra)


def _counted(wrapper: CheckpointedForward, forward: Callable[..., Any], *args: Any) -> Any:
    """``forward`` counting its runs inside a backward pass (the recomputation)."""
    import torch

    if torch._C._current_graph_task_id() != -1:
        wrapper.recomputed += 1
    return forward(*args)


@register
class ActivationCheckpointing(FixSpec):
    id = "activation.checkpointing"
    needs = frozenset({Need.MODEL})
    saves_memory = True
    summary = (
        "Recompute activations in the backward pass instead of keeping them "
        "(torch.utils.checkpoint): less memory for a bigger batch, at some extra compute."
    )
    Params = CheckpointingParams
    main_param = "every_n_layers"

    def normalize(self, params: Mapping[str, Any]) -> dict[str, Any]:
        # classes="Block" and the label's spelling "classes=Block+Attention" both work.
        out = dict(params)
        if isinstance(out.get("classes"), str):
            out["classes"] = tuple(c.strip() for c in out["classes"].split("+") if c.strip())
        return out

    def describe(self, params: Mapping[str, Any]) -> str:
        n = int(params.get("every_n_layers", 1))
        which = "every block" if n == 1 else f"every {_ordinal(n)} block"
        classes = params.get("classes") or ()
        of = f" of class {', '.join(classes)}" if classes else " (the model's repeated blocks)"
        return f"{self.summary} Checkpoints {which}{of}."

    def prepare(self, params: Mapping[str, Any], target: Step, stack: ExitStack) -> None:
        from torch import nn

        model = target.model
        if not isinstance(model, nn.Module):
            raise UnsupportedFixError(
                "activation.checkpointing wraps blocks of a torch.nn.Module; "
                f"got {type(model).__name__}: give the model (gd.Workload(model, ...) or "
                "Fix.apply(model))"
            )
        classes = tuple(params.get("classes") or ())
        blocks = named_blocks(model, classes) if classes else repeated_blocks(model)
        if not blocks:
            raise UnsupportedFixError(_nothing_found(model, classes))
        n = int(params.get("every_n_layers", 1))
        wrapped = blocks[::n]
        target.state[self.id] = [_wrap(block, stack) for block in wrapped]
        counts = Counter(type(b).__name__ for b in wrapped)
        what = ", ".join(f"{count} {name}" for name, count in counts.items())
        target.notes.append(
            f"activation.checkpointing: {len(wrapped)} of {len(blocks)} blocks checkpointed "
            f"({what})"
        )

    def memory_args(self, params: Mapping[str, Any]) -> dict[str, Any]:
        n = int(params.get("every_n_layers", 1))
        return {"checkpointing": n if n > 1 else True}

    def proof(
        self, params: Mapping[str, Any], arm: Observation, baseline: Observation | None
    ) -> Proof:
        """Recomputation in the backward: checkpointed blocks whose forward ran again while
        the gradients were computed (counted by the wrappers this fix installed)."""
        wrappers = arm.step.state.get(self.id) or []
        if not wrappers:
            return not_applied(self.id, "no block of the arm's model was wrapped")
        if arm.compiled is not None:
            return unverified(
                self.id,
                f"{len(wrappers)} block(s) wrapped, but the arm is compiled: the recomputation "
                "runs inside compiled code, where it cannot be counted",
            )
        checkpointed = sum(w.checkpointed for w in wrappers)
        recomputed = sum(w.recomputed for w in wrappers)
        evidence = (
            f"{recomputed} block forward(s) recomputed in the backward over the arm's steps so "
            f"far ({checkpointed} checkpointed forwards, {len(wrappers)} block(s) wrapped)"
        )
        if not recomputed:
            return not_applied(
                self.id,
                "no checkpointed block was recomputed in the backward: the blocks ran without "
                "gradients or in eval mode",
                evidence=evidence,
            )
        return applied(self.id, evidence)

    def code(self, params: Mapping[str, Any]) -> list[str]:
        n = int(params.get("every_n_layers", 1))
        classes = tuple(params.get("classes") or ())
        if classes:
            names = "{" + ", ".join(repr(c) for c in classes) + "}"
            find = f"blocks = [m for m in model.modules() if type(m).__name__ in {names}]"
        else:
            find = "blocks = list(model.layers)  # your model's repeated blocks (nn.ModuleList)"
        step = f"[::{n}]" if n > 1 else ""
        return [
            "import functools",
            "from torch.utils.checkpoint import checkpoint",
            find,
            f"for block in blocks{step}:",
            "    block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)",
        ]


def _wrap(block: Any, stack: ExitStack) -> CheckpointedForward:
    wrapper = CheckpointedForward(block, vars(block).get("forward"))
    replace_forward(block, wrapper, stack)
    return wrapper


def _nothing_found(model: Any, classes: tuple[str, ...]) -> str:
    counts = Counter(type(m).__name__ for m in model.modules() if m is not model)
    repeated = ", ".join(f"{name} ({n})" for name, n in counts.most_common() if n >= 2)
    seen = f"; classes that occur more than once: {repeated}" if repeated else ""
    if classes:
        return (
            f"activation.checkpointing: no submodule of {type(model).__name__} has class "
            f"{' or '.join(classes)}{seen}"
        )
    return (
        f"activation.checkpointing found no repeated blocks in {type(model).__name__} (no "
        "nn.ModuleList / nn.Sequential of two or more modules of one class): name the block "
        f"classes, e.g. Fix('activation.checkpointing', classes=('Block',)){seen}"
    )


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
