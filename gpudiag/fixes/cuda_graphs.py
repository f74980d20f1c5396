"""cuda.graphs: capture the model's forward and backward as CUDA graphs and replay them.

The model's ``forward`` (an instance attribute; its class is untouched) becomes a
:class:`GraphedForward`. At its first call with gradients on, it hands the model to
``torch.cuda.make_graphed_callables`` (through ``gpudiag.probe.cuda``) with copies of that
call's inputs as the sample (the graphs' static inputs). Later calls whose inputs have the
same shapes, dtypes, devices and ``requires_grad``, in the same training mode and autocast
state, replay the two graphs: a few launches per step instead of one per kernel. Other calls
run the model's own forward: under ``no_grad`` plainly (nothing is captured there: graphs
without their backward would leave the parameters without gradients); keyword or non-tensor
arguments, and inputs unlike the captured ones, with a note (a graphed callable takes
positional tensors of fixed shapes). Reverting removes the instance attribute.

Tried in gpudiag's trials only: their fixed batches keep the shapes static and their step
runs one forward per backward, then ``zero_grad(set_to_none=True)``. A graph keeps one set
of activations and hands out its static gradient buffers, so a second forward before the
backward is refused and, with gradient accumulation, gradients are copied out of the
buffers (pytorch/pytorch#181723: accumulating into them corrupts the sum). Hooks of
submodules run only while the graphs are captured, not at replay.

It captures whatever the fixes before it built (``order`` 95), a ``torch.compile``'d module
included. Compile modes reduce-overhead and max-autotune capture CUDA graphs themselves, so
either of them with cuda.graphs is refused when prepared (``claim_graph_capture``; a fix
group would refuse compile's other modes too).

Written against PyTorch's documented API (``torch.cuda.make_graphed_callables``; "CUDA
semantics", "Partial-network capture") and tested with fakes on the CPU: untested on a real
GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudiag.errors import GpuDiagError, UnsupportedFixError
from gpudiag.fixes import _system
from gpudiag.fixes.proof import Observation, Proof, applied, not_applied
from gpudiag.fixes.spec import (
    FixSpec,
    Need,
    Step,
    claim_graph_capture,
    register,
    replace_forward,
)
from gpudiag.probe import cuda

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport

# make_graphed_callables' default: warm-up iterations on a side stream before the capture.
NUM_WARMUP_ITERS = 3


@dataclass(frozen=True)
class InputSignature:
    """What a replay must match: each positional tensor's shape, dtype, device and
    ``requires_grad``, the module's training mode and the autocast dtype (None outside)."""

    tensors: tuple[tuple[tuple[int, ...], Any, Any, bool], ...]
    training: bool
    autocast: Any

    @classmethod
    def of(cls, args: tuple[Any, ...], training: bool, device_type: str) -> InputSignature:
        import torch

        autocast = (
            torch.get_autocast_dtype(device_type)
            if torch.is_autocast_enabled(device_type)
            else None
        )
        return cls(
            tuple((tuple(a.shape), a.dtype, a.device, bool(a.requires_grad)) for a in args),
            bool(training),
            autocast,
        )

    def __str__(self) -> str:
        shapes = ", ".join(
            f"{str(dtype).removeprefix('torch.')}[{', '.join(map(str, shape))}]"
            for shape, dtype, _, _ in self.tensors
        )
        mode = "" if self.training else " in eval mode"
        under = f" under {str(self.autocast).removeprefix('torch.')} autocast"
        return f"({shapes}){mode}{under if self.autocast is not None else ''}"


class GraphedForward:
    """A model's ``forward`` that captures itself as CUDA graphs at its first call with
    gradients on.

    A callable object rather than a closure (like ``CheckpointedForward``). ``replays`` and
    ``eager_calls`` count what each call with gradients on did.
    """

    def __init__(
        self,
        module: Any,
        previous: Callable[..., Any] | None,
        device_type: str,
        notes: list[str],
        num_warmup_iters: int = NUM_WARMUP_ITERS,
    ) -> None:
        self.module = module
        self.previous = previous  # the instance's own forward before this one, if it had one
        self.device_type = device_type
        self.notes = notes  # the trial's notes: what happened at step time goes there
        self.num_warmup_iters = num_warmup_iters
        self.graphed: Callable[..., Any] | None = None
        self.signature: InputSignature | None = None
        self.replays = 0
        self.eager_calls = 0
        self._awaiting_backward = False

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        if self.previous is not None:
            return self.previous
        return functools.partial(type(self.module).forward, self.module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        forward = self.__wrapped__
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        why = self._not_replayable(args, kwargs)
        if why:
            self.eager_calls += 1
            self._note(f"cuda.graphs: {self._name()} ran eagerly: {why}")
            return forward(*args, **kwargs)
        if self.graphed is None:
            self._capture(args)
        elif self._awaiting_backward:
            raise UnsupportedFixError(
                f"cuda.graphs: {self._name()} was called again before the backward pass of "
                "its previous call; its CUDA graph keeps one set of activations, which this "
                "call would overwrite. Graph a step with one forward per backward."
            )
        assert self.graphed is not None
        out = self.graphed(*args)
        self.replays += 1
        self._watch_backward(out)
        return out

    def _name(self) -> str:
        return f"{type(self.module).__name__}.forward"

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _not_replayable(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        """Why this call cannot replay the graphs ("" when it can)."""
        import torch

        if kwargs:
            return (
                f"keyword arguments ({', '.join(sorted(kwargs))}); a graphed forward takes "
                "positional tensors only"
            )
        for i, arg in enumerate(args):
            if not isinstance(arg, torch.Tensor):
                return (
                    f"argument {i} is a {type(arg).__name__}; a graphed forward takes "
                    "positional tensors only"
                )
        if self.signature is None:
            return ""
        signature = self._signature(args)
        if signature != self.signature:
            return f"inputs {signature} differ from the captured {self.signature}"
        return ""

    def _signature(self, args: tuple[Any, ...]) -> InputSignature:
        return InputSignature.of(args, self.module.training, self.device_type)

    def _capture(self, args: tuple[Any, ...]) -> None:
        from torch import nn

        # A bare module holding the model: its parameters are the graphs' inputs (so the
        # backward graph computes their gradients), its forward the model's own, and its
        # instance forward, which make_graphed_callables replaces, is not the model's.
        holder = nn.Module()
        holder.model = self.module
        holder.forward = self.__wrapped__
        signature = self._signature(args)
        # The sample args become the graphs' static inputs, into which every replay copies
        # its own inputs: copies, so that the caller's tensors are never written.
        sample = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)
        try:
            with self._autocast_without_cache():
                self.graphed = cuda.make_graphed_callables(
                    holder,
                    sample,
                    num_warmup_iters=self.num_warmup_iters,
                    # unused parameters get no gradient, as in eager mode
                    allow_unused_input=True,
                )
        except GpuDiagError:
            raise
        except Exception as exc:
            raise UnsupportedFixError(
                f"cuda.graphs could not capture {self._name()}: {type(exc).__name__}: {exc}. "
                "A captured forward may not synchronise with the CPU (.item(), data-dependent "
                "shapes or control flow) and must return tensors."
            ) from exc
        self.signature = signature
        self._note(
            f"cuda.graphs: captured {self._name()} and its backward for inputs {signature} "
            f"at the first training step ({self.num_warmup_iters} warm-up iterations "
            "included in that step)"
        )

    def _autocast_without_cache(self) -> AbstractContextManager[Any]:
        """make_graphed_callables refuses autocast's weight cache (its docs: "AMP ... only
        with disabled caching"); a nested autocast of the same dtype turns it off."""
        import torch

        if not torch.is_autocast_enabled(self.device_type):
            return nullcontext()
        return torch.autocast(
            self.device_type,
            dtype=torch.get_autocast_dtype(self.device_type),
            cache_enabled=False,
        )

    def _watch_backward(self, out: Any) -> None:
        node = _grad_node(out)
        if node is None:
            return
        self._awaiting_backward = True

        def backward_ran(*_: Any) -> None:
            self._awaiting_backward = False

        node.register_hook(backward_ran)


def _grad_node(value: Any) -> Any:
    """The autograd node of the first output tensor that has one (all share the replay's)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.grad_fn
    if isinstance(value, Mapping):
        value = list(value.values())
    for item in value if isinstance(value, (tuple, list)) else ():
        node = _grad_node(item)
        if node is not None:
            return node
    return None


def _copied(grad: Any) -> Any:
    return None if grad is None else grad.clone()  # None: an unused parameter


def _clone_param_grads(model: Any, stack: ExitStack) -> int:
    """Hand autograd a copy of each parameter gradient instead of the graph's static buffer."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        stack.callback(p.register_hook(_copied).remove)
    return len(params)


@register
class CudaGraphs(FixSpec):
    id = "cuda.graphs"
    needs = frozenset({Need.OWN_STEP, Need.MODEL})
    slow_first_step = True
    summary = (
        "Capture the model's forward and backward as CUDA graphs "
        "(torch.cuda.make_graphed_callables) and replay them: a few launches per step "
        "instead of one per kernel."
    )
    trial_only = True
    trial_only_reason = (
        "is tried in gpudiag's trials only (their fixed batches keep the input shapes static, "
        "which replaying a graph needs)"
    )
    order = 95  # captures what the others built, compile's module included

    def captures_graphs(self, params: Mapping[str, Any]) -> bool:
        return True

    def supported(
        self, params: Mapping[str, Any], system: SystemReport | None, device_type: str
    ) -> tuple[bool, str]:
        if device_type != "cuda":
            return False, "CUDA graphs exist only on NVIDIA GPUs"
        if _system.active_gpu(system) is None:
            return False, "the system report shows no GPU that CUDA can use"
        return True, ""

    def prepare(self, params: Mapping[str, Any], target: Step, stack: ExitStack) -> None:
        from torch import nn

        if not target.owns_step:
            raise UnsupportedFixError(
                "cuda.graphs captures the model's forward with gpudiag's own fixed batches; a "
                "step function's inputs are not known to keep their shapes: give the model, "
                "batch and loss (gd.Workload(model, batch=..., loss=...))"
            )
        if target.per_sample:
            raise UnsupportedFixError(
                "cuda.graphs needs the arm's own copy of the model: arms that share the user's "
                "model apply their fixes again for every sample, so every sample would capture "
                "the graphs again (compare(..., copies=True) if the copies fit)"
            )
        model = target.model
        if not isinstance(model, nn.Module):
            raise UnsupportedFixError(
                f"cuda.graphs captures a torch.nn.Module; got {type(model).__name__}"
            )
        trainable = [name for name, b in model.named_buffers() if b.requires_grad]
        if trainable:
            raise UnsupportedFixError(
                "cuda.graphs: buffers may not require grad in a captured module (torch docs, "
                f"make_graphed_callables); these do: {', '.join(trainable[:5])}"
            )
        claim_graph_capture(target, self.id, stack)
        previous = vars(model).get("forward")
        graphed = GraphedForward(model, previous, target.device_type, target.notes)
        target.state[self.id] = graphed
        replace_forward(model, graphed, stack)
        if target.accumulation > 1:
            n = _clone_param_grads(model, stack)
            target.notes.append(
                f"cuda.graphs: {target.accumulation} micro-batches per step, so the gradients "
                f"of {n} parameters are copied out of the graph's buffers, which the next "
                "replay overwrites (pytorch/pytorch#181723)"
            )

    def proof(
        self, params: Mapping[str, Any], arm: Observation, baseline: Observation | None
    ) -> Proof:
        """Graph replays counted by the graphed forward this fix installed."""
        graphed = arm.step.state.get(self.id)
        if graphed is None:
            return not_applied(self.id, "the arm's model has no graphed forward")
        evidence = (
            f"{graphed.replays} CUDA graph replay(s), {graphed.eager_calls} eager call(s) over "
            "the arm's steps so far"
        )
        if not graphed.replays:
            why = next((n for n in arm.step.notes if "ran eagerly" in n), "")
            return not_applied(
                self.id,
                "the captured graphs never replayed" + (f" ({why})" if why else ""),
                evidence=evidence,
            )
        return applied(self.id, evidence)

    def code(self, params: Mapping[str, Any]) -> list[str]:
        return [
            "# every batch the same shapes, inputs positional, one forward per backward",
            "model = torch.cuda.make_graphed_callables(model, (sample_input,), "
            "allow_unused_input=True)",
            "# autocast around it needs cache_enabled=False; zero gradients with "
            "optimizer.zero_grad(set_to_none=True)",
            "# with gradient accumulation: for p in model.parameters(): "
            "p.register_hook(lambda g: g if g is None else g.clone())",
        ]
