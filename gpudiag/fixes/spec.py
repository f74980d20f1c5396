"""What a fix is: typed parameters, its hooks (and the kind that follows from them), what it
needs, how it proves it took effect, what it changes in a memory estimate, and the registry
the spec modules add themselves to (they import this module, never gpudiag.fixes.base)."""

from __future__ import annotations

import contextlib
import enum
import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from gpudiag._values import is_ascii_int, is_ascii_number
from gpudiag.errors import FixError, UnsupportedFixError
from gpudiag.fixes.proof import Observation, Proof, unverified
from gpudiag.step import Step

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport


class FixKind(str, enum.Enum):
    """How a fix reaches the code it changes; it follows from the hooks a spec implements."""

    AMBIENT = "ambient"  # scope: a context around any code's calls, a notebook cell included
    STRUCTURAL = "structural"  # prepare: transforms a copy of the model / optimizer / data
    ENVIRONMENT = "environment"  # env: variables read at start, exported not applied live
    ADVICE = "advice"  # no hook: a change to the user's code that gpudiag can only describe


class Need(str, enum.Enum):
    """What a fix needs of the workload it is tried on."""

    MODEL = "model"  # a torch.nn.Module to change
    OWN_STEP = "own step"  # gpudiag runs forward, loss, backward and optimizer itself
    DATALOADER = "dataloader"  # the workload reads its batches from a torch DataLoader


NEED_TEXT = {
    Need.MODEL: "a model (a torch.nn.Module): gd.Workload(model, batch=..., loss=...)",
    Need.OWN_STEP: (
        "gpudiag's own training step (gd.Workload(model, batch=... or dataloader=..., "
        "loss=...)), not a step function"
    ),
    Need.DATALOADER: "a torch DataLoader: gd.Workload(model, dataloader=..., loss=...)",
}

_BOOLEANS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def parse_value(text: str) -> Any:
    """One spelling of values for every ``key=value`` gpudiag reads (fix parameters,
    ``--set`` of the demo workloads): true/yes/on, false/no/off, none/null, whole and decimal
    numbers in ASCII digits (``'٣'``, ``nan``, ``inf`` and ``1_000`` stay text, which the
    parameter's own check then refuses by name), else the text itself."""
    low = text.strip().lower()
    if low in _BOOLEANS:
        return _BOOLEANS[low]
    if low in {"none", "null"}:
        return None
    if is_ascii_int(text) and len(text.strip().lstrip("+-")) <= 19:  # int() stops at 4300
        return int(text)
    if is_ascii_number(text):
        return float(text)
    return text


class FixParams(BaseModel):
    """Parameters of one fix: unknown names are rejected, values are typed and immutable
    (a number given for a text parameter, as ``key=12`` reads, is taken as its text)."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


def _kind_from_hooks(cls: type[FixSpec]) -> FixKind:
    if cls.env is not FixSpec.env:
        return FixKind.ENVIRONMENT
    if cls.scope is not FixSpec.scope:
        return FixKind.AMBIENT
    if cls.prepare is not FixSpec.prepare:
        return FixKind.STRUCTURAL
    return FixKind.ADVICE


class FixSpec:
    """One entry of the registry: everything about one fix id. Callers ask it; they never
    branch on its id.

    Hooks (the fix's kind follows from which it implements: ``env`` environment, ``scope``
    ambient, ``prepare`` structural, none advice): ``supported`` (can this machine take it),
    ``prepare`` (one-time changes to the trial's Step, undone through ``stack``), ``scope``
    (a context entered around each of the Step's calls, so interleaved arms never see each
    other's switches), ``env`` (environment variables), ``code`` (the plain PyTorch lines a
    training script would use), ``proof`` (did it take effect, read from the arm's own step),
    ``memory_args`` (what it changes in ``gd.estimate_memory``), ``missing`` (a parameter the
    user must still give). ``needs``: what the workload must have.
    """

    id: ClassVar[str]
    kind: ClassVar[FixKind]
    summary: ClassVar[str]
    needs: ClassVar[frozenset[Need]] = frozenset()
    # Compiled code does not pass through the dispatcher: an arm with such a fix is observed
    # through the profiler (compiled regions), not by counting its operators.
    bypasses_dispatcher: ClassVar[bool] = False
    # Said once under a comparison with an arm that has this fix (its first steps differ).
    first_steps_note: ClassVar[str] = ""
    # Lines a training script adds after ``Recipe.apply`` (``to_python()``), e.g. fp16's scaler.
    after_apply: ClassVar[tuple[str, ...]] = ()
    Params: ClassVar[type[FixParams]] = FixParams
    main_param: ClassVar[str | None] = None  # ``attention.backend=flash`` sets this parameter
    group: ClassVar[str | None] = None  # at most one fix of a group in one trial
    implemented: ClassVar[bool] = True
    # Its purpose is memory, not speed: a comparison keeps it when peak memory falls, even
    # at some cost in speed (a recipe that fits a bigger batch or model).
    saves_memory: ClassVar[bool] = False
    # Changes only what gpudiag's own step feeds (its batches): tried in trials, while applied
    # to a user's model it is skipped with how to make the change in a training script.
    trial_only: ClassVar[bool] = False
    trial_only_reason: ClassVar[str] = "changes the batches of gpudiag's trials only"
    order: ClassVar[int] = 50  # application order: compile (90) wraps, cuda.graphs (95) captures
    # Its first step compiles or captures (minutes, not milliseconds): a trial gives that step
    # the long first-step limit (gpudiag.experiment.step_limit) instead of 10x the baseline's.
    slow_first_step: ClassVar[bool] = False
    # Measured only across ranks (gd.compare(..., nproc=N): a DDP baseline), never beside the
    # one-process arms of a search.
    multi_rank: ClassVar[bool] = False

    def captures_graphs(self, params: Mapping[str, Any]) -> bool:
        """Whether the fix records CUDA graphs of the step (two capturers cannot nest)."""
        return False

    def conflicts_with(
        self, params: Mapping[str, Any], other: FixSpec, other_params: Mapping[str, Any]
    ) -> str:
        """Why this fix cannot go with ``other`` in one arm beyond ``group`` ("" when it can).
        ``check_conflicts`` asks both fixes of every pair, before anything is prepared."""
        if self.captures_graphs(params) and other.captures_graphs(other_params):
            return "both capture CUDA graphs of the step"
        return ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in vars(cls):
            raise TypeError(
                f"{cls.__name__}: a fix's kind follows from its hooks (env, scope, prepare); "
                "do not set it"
            )
        cls.kind = _kind_from_hooks(cls)

    # -- parameters -----------------------------------------------------------------------
    def normalize(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Turn convenience spellings into the schema's fields (override for aliases)."""
        return dict(params)

    def validate(self, params: Mapping[str, Any]) -> dict[str, Any]:
        try:
            model = self.Params.model_validate(self.normalize(params))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'parameters'}: {err['msg']}"
                for err in exc.errors()
            )
            raise FixError(
                f"bad parameters for fix {self.id!r}: {problems}. It takes: {self.params_help()}"
            ) from None
        return model.model_dump(mode="json")

    def params_help(self) -> str:
        fields = self.Params.model_fields
        if not fields:
            return "no parameters"
        parts = []
        for name, info in fields.items():
            default = (
                "" if info.is_required() else f" = {info.get_default(call_default_factory=True)!r}"
            )
            parts.append(f"{name}{default}")
        return ", ".join(parts)

    def is_implemented(self, params: Mapping[str, Any]) -> bool:
        return self.implemented

    # -- hooks ----------------------------------------------------------------------------
    def supported(
        self, params: Mapping[str, Any], system: SystemReport | None, device_type: str
    ) -> tuple[bool, str]:
        return True, ""

    def describe(self, params: Mapping[str, Any]) -> str:
        return self.summary

    def prepare(self, params: Mapping[str, Any], target: Step, stack: ExitStack) -> None:
        return None

    def scope(self, params: Mapping[str, Any], target: Step) -> AbstractContextManager[Any]:
        return nullcontext()

    def env(self, params: Mapping[str, Any]) -> dict[str, str]:
        return {}

    def code(self, params: Mapping[str, Any]) -> list[str]:
        return []

    def proof(
        self, params: Mapping[str, Any], arm: Observation, baseline: Observation | None
    ) -> Proof:
        """Whether this fix took effect in ``arm`` (the arm's own step), against the baseline's
        step; the default: it cannot be told."""
        return unverified(self.id, "this fix declares no way to check that it took effect")

    def memory_args(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Keyword arguments of ``gd.estimate_memory`` that describe this fix (``precision``,
        ``checkpointing``, ``batch_size``, ``parallelism``); empty when it changes none."""
        return {}

    def missing(self, params: Mapping[str, Any]) -> str:
        """What the user must still give before this fix changes anything ("" when
        nothing): ``batch.size`` without a size would measure a copy of the baseline."""
        return ""

    def not_implemented(self, params: Mapping[str, Any]) -> UnsupportedFixError:
        return UnsupportedFixError(
            f"fix {self.id!r} is not implemented in this version of gpudiag (it is defined so "
            f"findings and recipes can name it). What it means: {self.describe(params)}"
        )


_REGISTRY: dict[str, FixSpec] = {}


def register(cls: type[FixSpec]) -> type[FixSpec]:
    """Class decorator: add a spec to the registry under its ``id``."""
    _REGISTRY[cls.id] = cls()
    return cls


@contextlib.contextmanager
def registered(cls: type[FixSpec]) -> Iterator[FixSpec]:
    """A spec in the registry for a while (a control arm, a fix under test), then removed."""
    if cls.id in _REGISTRY:
        raise FixError(f"fix id {cls.id!r} is already registered")
    spec = _REGISTRY[cls.id] = cls()
    try:
        yield spec
    finally:
        _REGISTRY.pop(cls.id, None)


def _model_device_type(model: Any) -> str | None:
    try:
        first = next(iter(model.parameters()))
    except (AttributeError, StopIteration, TypeError):
        return None
    return str(first.device.type)


def honour_autocast(target: Step, stack: ExitStack) -> None:
    """Make ``target.autocast_dtype`` take effect outside gpudiag's own step (see Step)."""
    if target.autocast_dtype is None:
        return
    import torch

    if target.model is None:
        stack.enter_context(torch.autocast(target.device_type, dtype=target.autocast_dtype))
        return
    model = target.model
    original = model.forward
    device_type, dtype = target.device_type, target.autocast_dtype

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype):
            out = original(*args, **kwargs)
        return to_float32(out)

    replace_forward(model, forward, stack)


def claim_graph_capture(target: Step, by: str, stack: ExitStack) -> None:
    """Record that ``by`` captures CUDA graphs of the trial's step, until ``stack`` closes.

    Two capturers (compile modes reduce-overhead / max-autotune, cuda.graphs) would nest
    graphs in graphs; fix groups are per fix, not per parameter, so the second is refused.
    """
    if target.graph_capture:
        raise UnsupportedFixError(
            f"{by} and {target.graph_capture} both capture CUDA graphs of the step; try them "
            "as separate arms (compile mode default or max-autotune-no-cudagraphs goes with "
            "cuda.graphs)"
        )
    target.graph_capture = by

    def release() -> None:
        target.graph_capture = ""

    stack.callback(release)


def replace_forward(module: Any, forward: Callable[..., Any], stack: ExitStack) -> None:
    """Give ``module`` (an instance; its class is untouched) ``forward`` until ``stack``
    closes, then restore the instance's own ``forward`` if it had one, else drop it."""
    had_own = "forward" in vars(module)
    previous = vars(module).get("forward")
    module.forward = forward

    def undo() -> None:
        if had_own:
            module.forward = previous
        else:
            vars(module).pop("forward", None)

    stack.callback(undo)


def to_float32(value: Any) -> Any:
    """Low-precision floating tensors in (nested) outputs back to float32 for the loss."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.float16, torch.bfloat16) else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # named tuple
        return type(value)(*(to_float32(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(to_float32(v) for v in value)
    if isinstance(value, dict):
        out = dict(value) if type(value) is dict else value  # model-output classes update in place
        for k, v in list(value.items()):
            out[k] = to_float32(v)
        return out
    return value
