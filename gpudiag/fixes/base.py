"""Fixes with their parameters: look-up by id, conflicts, apply and revert (the spec protocol
and the registry are in gpudiag.fixes.spec)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

from gpudiag._report import card, esc, html_table, jsonable
from gpudiag.errors import FixConflictError, FixError, UnsupportedFixError
from gpudiag.fixes import _system
from gpudiag.fixes.proof import Observation, Proof, ProofStatus
from gpudiag.fixes.spec import (
    _REGISTRY,
    NEED_TEXT,
    FixKind,
    FixParams,
    FixSpec,
    Need,
    _model_device_type,
    claim_graph_capture,
    honour_autocast,
    parse_value,
    register,
    replace_forward,
    to_float32,
)
from gpudiag.step import Step, Workload

if TYPE_CHECKING:
    from pydantic import GetCoreSchemaHandler
    from pydantic_core import CoreSchema

    from gpudiag.probe.system import SystemReport


def _load_all() -> None:
    # The spec modules register themselves on import.
    from gpudiag.fixes import (  # noqa: F401
        attention,
        batch,
        checkpointing,
        compile,
        cuda_graphs,
        dataloader,
        environment,
        fsdp,
        precision,
        switches,
    )


def registry() -> Mapping[str, FixSpec]:
    _load_all()
    return dict(_REGISTRY)


def get_spec(fix_id: str) -> FixSpec:
    _load_all()
    try:
        return _REGISTRY[fix_id]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise FixError(f"unknown fix id {fix_id!r}. Known fixes: {known}") from None


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


class Fix:
    """One fix with its parameters: ``gd.Fix("attention.backend", backend="flash")``.

    The one type of a fix wherever it appears: a finding's next step, an arm of a comparison,
    an entry of a recipe (with the ``evidence`` it was kept on). Immutable and hashable by id
    and parameters (evidence is a note, not part of its identity); ``Fix.parse(
    "attention.backend=flash")`` reads the command-line spelling; ``Fix(id, {"key": value})``
    takes the parameters as a mapping too. ``supported(system)`` says whether this machine
    can take it and why not; ``apply(model)`` applies it (returning a handle whose
    ``revert()`` undoes it); ``with fix.applied(): ...`` applies it around a block.
    """

    __slots__ = ("_params", "evidence", "id")

    id: str
    _params: dict[str, Any]
    evidence: Any

    def __init__(
        self,
        id: str,
        params: Mapping[str, Any] | None = None,
        *,
        evidence: Any = None,
        **kwargs: Any,
    ) -> None:
        if params is not None and not isinstance(params, Mapping):
            raise FixError(
                f"parameters of fix {id!r} are a mapping or keyword arguments, "
                f"got {type(params).__name__}"
            )
        spec = get_spec(id)
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "_params", spec.validate({**dict(params or {}), **kwargs}))
        object.__setattr__(self, "evidence", evidence)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Fix is immutable: make a new one")

    def with_evidence(self, evidence: Any) -> Fix:
        """The same fix carrying ``evidence`` (what a comparison measured of it)."""
        return Fix(self.id, self._params, evidence=evidence)

    def to_fix(self) -> Fix:
        """Itself (a finding's fix is a Fix; kept for code written against FixRef)."""
        return self

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> Fix:
        """``ID``, ``ID=VALUE`` (the fix's main parameter) or ``ID:key=value,key=value``."""
        text = text.strip()
        if not text:
            raise FixError(
                "empty fix: write an id such as precision.bf16 or attention.backend=flash"
            )
        colon, equals = text.find(":"), text.find("=")
        if colon != -1 and (equals == -1 or colon < equals):
            fix_id, _, rest = text.partition(":")
            params: dict[str, Any] = {}
            for item in filter(None, (p.strip() for p in rest.split(","))):
                key, eq, value = item.partition("=")
                if not eq:
                    raise FixError(f"in {text!r}: write parameters as key=value, got {item!r}")
                params[key.strip()] = parse_value(value.strip())
            return cls(fix_id.strip(), **params)
        fix_id, eq, value = text.partition("=")
        fix_id = fix_id.strip()
        if not eq:
            return cls(fix_id)
        spec = get_spec(fix_id)
        if spec.main_param is None:
            raise FixError(
                f"fix {fix_id!r} has no main parameter; write {fix_id}:key=value. "
                f"It takes: {spec.params_help()}"
            )
        return cls(fix_id, **{spec.main_param: parse_value(value.strip())})

    @classmethod
    def coerce(cls, value: Fix | str | Mapping[str, Any]) -> Fix:
        """A Fix from a Fix, its text spelling, or its ``to_dict()`` form."""
        if isinstance(value, Fix):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, Mapping):
            return cls.from_dict(value)
        raise FixError(f"expected a gd.Fix, a fix id string or a dict, got {type(value).__name__}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fix:
        """From ``{"id": ..., "params": {...}}`` (``to_dict()``'s form; its other keys, which
        it derives, are ignored)."""
        if "id" not in data:
            raise FixError(f"a fix needs an 'id', got keys {sorted(data)}")
        params = data.get("params") or {}
        if not isinstance(params, Mapping):
            raise FixError(f"params of fix {data['id']!r} must be a mapping")
        return cls(str(data["id"]), params, evidence=data.get("evidence"))

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        """A Fix as a field of a pydantic model: validated from a Fix or its dict form,
        written as ``{"id", "params"[, "evidence"]}``."""
        from pydantic_core import core_schema

        return core_schema.no_info_plain_validator_function(
            cls.coerce,
            serialization=core_schema.plain_serializer_function_ser_schema(
                _fix_data, when_used="always"
            ),
        )

    # -- facts ----------------------------------------------------------------------------
    @property
    def spec(self) -> FixSpec:
        return get_spec(self.id)

    @property
    def params(self) -> dict[str, Any]:
        return dict(self._params)

    @property
    def kind(self) -> FixKind:
        return self.spec.kind

    @property
    def implemented(self) -> bool:
        return self.spec.is_implemented(self._params)

    @property
    def label(self) -> str:
        """Short text that names this fix and its non-default parameters."""
        defaults = {} if _has_required(self.spec) else self.spec.validate({})
        changed = {k: v for k, v in self._params.items() if defaults.get(k, object()) != v}
        if not changed:
            return self.id
        main = self.spec.main_param
        if main is not None and set(changed) == {main}:
            return f"{self.id}={changed[main]}"
        items: list[tuple[str, Any]] = []
        for key, value in sorted(changed.items()):
            # dict parameters (nccl.env's variables) are written as their own key=value pairs
            items += sorted(value.items()) if isinstance(value, dict) else [(key, value)]
        return self.id + ":" + ",".join(f"{k}={_value_text(v)}" for k, v in items)

    def describe(self) -> str:
        return self.spec.describe(self._params)

    def supported(
        self, system: SystemReport | None = None, device_type: str | None = None
    ) -> tuple[bool, str]:
        """(True, "") or (False, why not) for this machine (``gd.inspect()`` when not given)."""
        if system is None:
            system = _system.current_system()
        return self.spec.supported(
            self._params, system, _system.device_type_for(system, device_type)
        )

    def tryable(
        self, system: SystemReport | None = None, device_type: str | None = None
    ) -> tuple[bool, str]:
        """Can gpudiag try it live in a trial here? (supported, implemented, not env/advice)."""
        blocker = self.live_blocker()
        if blocker:
            return False, blocker
        return self.supported(system, device_type)

    def live_blocker(self) -> str:
        """Why this fix can never be applied live by gpudiag ("" when it can)."""
        if self.kind is FixKind.ENVIRONMENT:
            return "environment fixes need a new process: export them with to_env()"
        if self.kind is FixKind.ADVICE:
            return f"advice only, the change is in your code: {self.describe()}"
        if not self.implemented:
            return f"{self.label} is not implemented in this version of gpudiag"
        return ""

    def missing(self) -> str:
        """What must still be given before this fix changes anything ("" when nothing)."""
        return self.spec.missing(self._params)

    def unmet_needs(self, workload: Workload) -> str:
        """Why ``workload`` cannot take this fix ("" when it can): what the fix needs
        (``FixSpec.needs``) that the workload lacks."""
        lacks = [
            need
            for need in sorted(self.spec.needs, key=lambda n: n.value)
            if (need is Need.MODEL and workload.model is None)
            or (need is Need.OWN_STEP and not workload.owns_step)
            or (need is Need.DATALOADER and workload.dataloader is None)
        ]
        if not lacks:
            return ""
        return f"{self.label} needs " + "; and ".join(NEED_TEXT[n] for n in lacks)

    def proof(self, arm: Observation, baseline: Observation | None = None) -> Proof:
        """Whether this fix took effect in ``arm`` (see gpudiag.fixes.proof)."""
        result = self.spec.proof(self._params, arm, baseline)
        return Proof(self.label, result.status, result.evidence, result.reason, result.manual)

    def memory_args(self) -> dict[str, Any]:
        return self.spec.memory_args(self._params)

    def env(self) -> dict[str, str]:
        return self.spec.env(self._params)

    def code(self) -> list[str]:
        return self.spec.code(self._params)

    # -- applying -------------------------------------------------------------------------
    def apply(
        self,
        model: Any = None,
        optimizer: Any = None,
        *,
        system: SystemReport | None = None,
        device_type: str | None = None,
        check: bool = True,
    ) -> AppliedFixes:
        """Apply this fix until ``revert()`` (see :func:`apply_fixes`)."""
        return apply_fixes(
            [self], model, optimizer, system=system, device_type=device_type, check=check
        )

    @contextmanager
    def applied(
        self, model: Any = None, optimizer: Any = None, **kwargs: Any
    ) -> Iterator[AppliedFixes]:
        handle = self.apply(model, optimizer, **kwargs)
        try:
            yield handle
        finally:
            handle.revert()

    # -- identity and display ---------------------------------------------------------------
    def _key(self) -> tuple[Any, ...]:
        return (self.id, _freeze(self._params))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Fix) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self._params.items())
        return f"Fix({self.id!r}{args})"

    def __str__(self) -> str:
        return self.label

    def to_dict(self) -> dict[str, Any]:
        data = {
            "id": self.id,
            "params": self._params,
            "label": self.label,
            "kind": self.kind.value,
            "implemented": self.implemented,
            "description": self.describe(),
        }
        if self.evidence is not None:
            data["evidence"] = self.evidence
        return jsonable(data)

    def _repr_html_(self) -> str:
        rows: list[tuple[object, object]] = [("kind", self.kind.value)]
        rows += [(k, _value_text(v)) for k, v in self._params.items()]
        if not self.implemented:
            rows.append(("status", "not implemented in this version"))
        return card(f"Fix {self.label}", f"<div>{esc(self.describe())}</div>" + html_table(rows))


def _has_required(spec: FixSpec) -> bool:
    return any(f.is_required() for f in spec.Params.model_fields.values())


def _value_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "+".join(str(v) for v in value)
    if isinstance(value, dict):
        return ";".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def _fix_data(fix: Fix) -> dict[str, Any]:
    """A fix as data (a recipe entry): id, parameters, and its evidence when it has one."""
    data: dict[str, Any] = {"id": fix.id, "params": jsonable(fix.params)}
    evidence = fix.evidence
    if evidence is not None:
        dump = getattr(evidence, "model_dump", None)
        data["evidence"] = dump(mode="json", exclude_none=True) if dump else jsonable(evidence)
    return data


# -- applying several fixes -------------------------------------------------------------------


def check_conflicts(fixes: Iterable[Fix]) -> None:
    """At most one fix per group (one precision, one attention backend), no duplicates, and
    no pair a spec declares in conflict (``FixSpec.conflicts_with``)."""
    fixes = list(fixes)
    seen: dict[str, Fix] = {}
    for fix in fixes:
        key = fix.spec.group or fix.id
        if key in seen:
            other = seen[key]
            raise FixConflictError(
                f"{other.label} and {fix.label} change the same thing ({key}); "
                "try them as separate fixes (separate arms) instead of together"
            )
        seen[key] = fix
    for i, fix in enumerate(fixes):
        for other in fixes[i + 1 :]:
            why = fix.spec.conflicts_with(fix.params, other.spec, other.params)
            why = why or other.spec.conflicts_with(other.params, fix.spec, fix.params)
            if why:
                raise FixConflictError(
                    f"{fix.label} and {other.label} cannot go together ({why}); "
                    "try them as separate fixes (separate arms)"
                )


def ordered(fixes: Iterable[Fix]) -> list[Fix]:
    return sorted(fixes, key=lambda f: f.spec.order)


def transform(step: Step, fixes: Iterable[Fix], stack: ExitStack) -> Step:
    """The structural part of ``fixes``: each one's ``prepare`` changes ``step`` (its model,
    optimizer, batch, dataloader, autocast dtype) in ``FixSpec.order`` (compile wraps before
    cuda.graphs captures), undone when ``stack`` closes. The one way a fix changes a step:
    trials and :func:`apply_fixes` both call it."""
    for fix in ordered(fixes):
        blocker = fix.live_blocker()
        if blocker:
            raise UnsupportedFixError(f"cannot apply {fix.label} live: {blocker}")
        fix.spec.prepare(fix.params, step, stack)
    return step


@contextmanager
def ambient(step: Step, fixes: Iterable[Fix]) -> Iterator[None]:
    """The ambient part of ``fixes``: their process-wide switches and contexts, entered
    around the step's calls and left afterwards."""
    with ExitStack() as stack:
        for fix in fixes:
            stack.enter_context(fix.spec.scope(fix.params, step))
        yield


class AppliedFixes:
    """Fixes applied to a model (or the process) until ``revert()``.

    ``model`` may be a new object (``torch.compile`` returns a wrapper): use it. ``scaler`` is
    the GradScaler fp16 needs (None otherwise). ``skipped`` lists (fix, reason) pairs that were
    not applied. ``revert()`` undoes everything; a second call does nothing.
    """

    def __init__(
        self, fixes: list[Fix], target: Step, stack: ExitStack, skipped: list[tuple[Fix, str]]
    ):
        self.fixes = fixes
        self.target = target
        self.skipped = skipped
        self._stack = stack

    @property
    def model(self) -> Any:
        return self.target.model

    @property
    def optimizer(self) -> Any:
        return self.target.optimizer

    @property
    def scaler(self) -> Any:
        return self.target.scaler

    @property
    def notes(self) -> list[str]:
        return list(self.target.notes)

    def revert(self) -> None:
        self._stack.close()

    def __enter__(self) -> AppliedFixes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.revert()

    def __repr__(self) -> str:
        applied = ", ".join(f.label for f in self.fixes) or "nothing"
        text = f"AppliedFixes({applied})"
        for fix, reason in self.skipped:
            text += f"\n  skipped {fix.label}: {reason}"
        for note in self.target.notes:
            text += f"\n  note: {note}"
        return text


def apply_fixes(
    fixes: Iterable[Fix],
    model: Any = None,
    optimizer: Any = None,
    *,
    system: SystemReport | None = None,
    device_type: str | None = None,
    check: bool = True,
    skip_unsupported: bool = False,
) -> AppliedFixes:
    """Apply fixes to a user's own training code until ``revert()``.

    Switches (TF32, SDPA backends, cudnn.benchmark) are set process-wide. Precision fixes wrap
    ``model.forward`` in autocast (outputs cast back to float32, so the loss is computed in
    float32), or, without a model, enter autocast for everything that follows. Environment and
    advice fixes cannot be applied live and raise UnsupportedFixError (or are skipped with
    ``skip_unsupported``), as do fixes the hardware cannot take when ``check`` is on.
    """
    fixes = ordered(fixes)
    check_conflicts(fixes)
    if device_type is None and model is not None:
        device_type = _model_device_type(model)
    if check and system is None:
        system = _system.current_system()
    dev = (
        _system.device_type_for(system, device_type)
        if system is not None
        else (device_type or "cpu")
    )
    target = Step(model=model, optimizer=optimizer, owns_step=False, device_type=dev, system=system)
    stack = ExitStack()
    applied: list[Fix] = []
    skipped: list[tuple[Fix, str]] = []
    try:
        for fix in fixes:
            reason = fix.live_blocker()
            if not reason and fix.spec.trial_only:
                reason = (
                    f"{fix.label} {fix.spec.trial_only_reason}; in a training script: "
                    + " ".join(line.strip() for line in fix.code())
                )
            can = not reason
            if can and check:
                can, reason = fix.supported(system, dev)
            if not can:
                if skip_unsupported:
                    skipped.append((fix, reason))
                    continue
                raise UnsupportedFixError(f"cannot apply {fix.label}: {reason}")
            applied.append(fix)
        transform(target, applied, stack)
        stack.enter_context(ambient(target, applied))
        honour_autocast(target, stack)
    except BaseException:
        stack.close()
        raise
    return AppliedFixes(applied, target, stack, skipped)


# The spec protocol lives in gpudiag.fixes.spec; its names stay importable from here.
__all__ = [
    "AppliedFixes",
    "Fix",
    "FixConflictError",
    "FixError",
    "FixKind",
    "FixParams",
    "FixSpec",
    "Need",
    "Observation",
    "Proof",
    "ProofStatus",
    "Step",
    "apply_fixes",
    "check_conflicts",
    "claim_graph_capture",
    "get_spec",
    "honour_autocast",
    "ordered",
    "parse_value",
    "register",
    "registry",
    "replace_forward",
    "to_float32",
]
