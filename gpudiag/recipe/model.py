"""The recipe schema: kept fixes with their parameters and evidence; safe YAML / JSON; export."""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gpudiag._files import read_bytes
from gpudiag._views import Card, Carded, Facts, Grid, Lines
from gpudiag.errors import GpuDiagError, RecipeError
from gpudiag.fixes import AppliedFixes, Fix, FixKind, Observation, apply_fixes, check_conflicts
from gpudiag.fixes.environment import nccl_refusal
from gpudiag.recipe.shell import check_env_name, env_value

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport

SCHEMA_VERSION = 1
RECIPE_KIND = "gpudiag.recipe"
# A recipe is a few fixes with flat parameters: nesting deeper than this, or a file larger, is
# not a recipe, and refusing it early keeps a hostile file from exhausting the stack or memory.
MAX_DEPTH = 16
MAX_BYTES = 4 * 1024 * 1024
MAX_NODES = 100_000


def _shape_problem(data: Any) -> str | None:
    """Why ``data`` cannot be a recipe by its shape alone: lists/mappings nested deeper than
    MAX_DEPTH, or more than MAX_NODES values (YAML aliases can make a small file expand
    into billions: "billion laughs"). Iterative, so there is no recursion to exhaust."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    nodes = 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            return f"holds more than {MAX_NODES} values"
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_DEPTH:
            return f"nests lists or mappings more than {MAX_DEPTH} deep"
        stack.extend((child, depth + 1) for child in children)
    return None


class Evidence(BaseModel):
    """Why a fix is in the recipe: what it measured, where, and how sure that is."""

    model_config = ConfigDict(extra="forbid")

    speedup: float | None = None  # baseline step time / fix step time (median per round)
    speedup_low: float | None = None
    speedup_high: float | None = None
    confidence: float | None = None
    verdict: Literal["faster", "slower", "no significant difference", "undecided"] | None = None
    arm: str | None = None  # the arm it was measured in (a combination names all its fixes)
    # Its proof of effect in that arm ("applied (2 fused (flash) attention calls; ...)"), and
    # whether every fix of the arm was proven to take effect.
    proof: str | None = None
    verified: bool | None = None
    step_time_s: float | None = None
    baseline_step_time_s: float | None = None
    rounds: int | None = Field(None, ge=0)
    loss_drift: float | None = None  # max relative difference of the loss over the drift steps
    grad_norm_drift: float | None = None
    drift_status: str | None = None
    peak_memory_bytes: int | None = None
    baseline_peak_memory_bytes: int | None = None
    memory_method: str | None = None
    hardware: str | None = None
    device_type: Literal["cpu", "cuda"] | None = None
    compute_capability: str | None = None
    torch_version: str | None = None
    workload: str | None = None
    measured_at: str | None = None

    def summary(self) -> str:
        parts = []
        if self.speedup is not None:
            ci = ""
            if self.speedup_low is not None and self.speedup_high is not None:
                pct = f"{self.confidence:.0%} " if self.confidence else ""
                ci = f" ({pct}CI {self.speedup_low:.2f}-{self.speedup_high:.2f}x)"
            parts.append(f"{self.speedup:.2f}x{ci}")
        if self.verdict is not None:
            parts.append(self.verdict)
        if self.verified is False:
            parts.append("unverified (no proof the fix took effect)")
        if self.loss_drift is not None:
            parts.append(f"loss drift {self.loss_drift * 100:.2g}%")
        if self.hardware:
            parts.append(f"on {self.hardware}")
        return ", ".join(parts) or "no evidence recorded"


_ENTRY_KEYS = frozenset({"id", "params", "evidence"})


def _entry(value: Any) -> Any:
    """A recipe entry as a Fix: ``{"id", "params", "evidence"}`` (no other key), the fix known
    and its parameters valid (FixError otherwise), the evidence an :class:`Evidence`."""
    if isinstance(value, Fix):
        evidence = value.evidence
        if evidence is None or isinstance(evidence, Evidence):
            return value
        return value.with_evidence(Evidence.model_validate(evidence))
    if not isinstance(value, dict):
        raise ValueError(f"a recipe entry is a mapping (id, params, evidence), got {value!r}")
    unknown = sorted(set(value) - _ENTRY_KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(map(str, unknown))} in a recipe entry")
    if not isinstance(value.get("id"), str):
        raise ValueError("a recipe entry needs an id (a fix id such as precision.bf16)")
    params = value.get("params") or {}
    if not isinstance(params, dict):
        raise ValueError(f"params of {value['id']} must be a mapping")
    evidence = value.get("evidence")
    return Fix(
        value["id"],
        params,
        evidence=None if evidence is None else Evidence.model_validate(evidence),
    )


# One fix of a recipe is a gd.Fix (its ``evidence`` an Evidence); ``RecipeFix(id=..., params=
# ..., evidence=...)`` builds one.
RecipeFix = Fix
RecipeEntry = Annotated[Fix, BeforeValidator(_entry)]


class Recipe(Carded, BaseModel):
    """Fixes that worked, as data: ``gd.Recipe.load(path).apply(model, optimizer=...)``.

    Versioned (``schema_version``); saved as YAML or JSON and loaded with a safe loader;
    unknown fix ids or parameters are rejected; nothing in the file is ever executed.
    ``apply`` re-checks the hardware and skips, with the reason, what it cannot do.
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["gpudiag.recipe"] = "gpudiag.recipe"
    schema_version: int = SCHEMA_VERSION
    gpudiag_version: str = ""
    created_at: str = ""
    workload: str | None = None
    hardware: str | None = None
    fixes: list[RecipeEntry] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @field_validator("schema_version")
    @classmethod
    def _version(cls, value: int) -> int:
        if value > SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {value} is newer than this gpudiag understands "
                f"({SCHEMA_VERSION}): upgrade gpudiag"
            )
        if value < 1:
            raise ValueError("schema_version must be 1 or more")
        return value

    @model_validator(mode="after")
    def _compatible(self) -> Recipe:
        check_conflicts(self.fixes)
        return self

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def of(
        cls, fixes: Iterable[Fix | str], *, workload: str | None = None, notes: Sequence[str] = ()
    ) -> Recipe:
        """A recipe from fixes alone (no evidence), e.g. to export a hand-picked set."""
        items = [Fix.coerce(f).with_evidence(None) for f in fixes]
        return cls._build(items, workload=workload, notes=notes)

    @classmethod
    def _build(cls, fixes: list[Fix], **kwargs: Any) -> Recipe:
        from gpudiag._version import __version__

        return cls(
            gpudiag_version=__version__,
            created_at=_dt.datetime.now().isoformat(timespec="seconds"),
            fixes=fixes,
            notes=list(kwargs.pop("notes", ()) or ()),
            **kwargs,
        )

    @classmethod
    def from_comparison(cls, comparison: Any, arms: Sequence[Any]) -> Recipe:
        """The fixes of ``arms``, best first (conflicts and repeats dropped), with evidence."""
        base = comparison.baseline
        chosen: list[Fix] = []
        groups: set[str] = set()
        ranked = sorted(arms, key=lambda a: a.speedup.value if a.speedup else 0.0, reverse=True)
        notes = []
        for arm in ranked:
            for fix in arm.fixes:
                group = fix.spec.group or fix.id
                if group in groups:
                    continue
                groups.add(group)
                chosen.append(fix.with_evidence(_evidence(comparison, arm, base, fix)))
        if not chosen:
            notes.append(
                "no fix was both faster and numerically close to the baseline in this comparison"
            )
        return cls._build(
            chosen, workload=comparison.workload, hardware=comparison.hardware, notes=notes
        )

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "recipe") -> Recipe:
        if not isinstance(data, dict):
            raise RecipeError(
                f"{source}: a recipe is a mapping (kind, schema_version, fixes), "
                f"got {type(data).__name__}"
            )
        problem = _shape_problem(data)
        if problem:
            raise RecipeError(
                f"{source} {problem}: not a recipe (a recipe is a list of fixes with flat "
                "parameters)"
            )
        if data.get("kind", RECIPE_KIND) != RECIPE_KIND:
            raise RecipeError(
                f"{source}: kind is {data.get('kind')!r}, not {RECIPE_KIND!r}: not a gpudiag recipe"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(_error_text(err) for err in exc.errors())
            raise RecipeError(f"{source} is not a valid recipe: {problems}") from None
        except GpuDiagError as exc:  # a conflict found by the model validator
            raise RecipeError(f"{source}: {exc}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Recipe:
        """Read a recipe (``.json``, else YAML with the safe loader); errors say what to fix."""
        p = Path(path)
        fmt = "JSON" if p.suffix.lower() == ".json" else "YAML"
        # Bounded, folders and devices refused (a recipe is a few fixes and their evidence).
        raw = read_bytes(p, "recipe", max_bytes=MAX_BYTES, error=RecipeError)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecipeError(f"{p} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        try:
            data = json.loads(text) if fmt == "JSON" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise RecipeError(f"{p} is not valid {fmt}: {exc}") from None
        except RecursionError:
            raise RecipeError(
                f"{p} nests lists or mappings too deeply for a {fmt} recipe: not a recipe"
            ) from None
        return cls.from_dict(data, source=str(p))

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write as JSON (``.json``) or YAML (anything else); returns the path."""
        p = Path(path)
        p.write_text(
            self.to_json() if p.suffix.lower() == ".json" else self.to_yaml(), encoding="utf-8"
        )
        return p

    # -- views ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def to_yaml(self) -> str:
        header = (
            "# gpudiag recipe: data only (safe YAML).\n"
            "# Apply with gd.Recipe.load(path).apply(model, optimizer=...)\n"
        )
        return header + yaml.safe_dump(self.to_dict(), sort_keys=False)

    def fix_objects(self) -> list[Fix]:
        return list(self.fixes)

    def refused_env(self, allow: Iterable[str] = ()) -> dict[str, str]:
        """NCCL variables of this recipe that are refused on export (plugins, files, anything
        that is not a tuning variable: gpudiag.fixes.environment.nccl_refusal), with why;
        those named in ``allow`` are not."""
        allowed = set(allow)
        out: dict[str, str] = {}
        for fix in self.fix_objects():
            for name in fix.env():
                why = nccl_refusal(name) if name.startswith("NCCL_") else ""
                if why and name not in allowed:
                    out[name] = why
        return out

    def env_vars(self, allow: Iterable[str] = ()) -> dict[str, str]:
        """The environment the recipe's environment fixes set; every name is checked against
        ``[A-Z_][A-Z0-9_]*`` (RecipeError otherwise), whatever fix produced it. An NCCL
        variable that loads code or names a file, or is not a tuning variable, is a RecipeError
        unless ``allow`` names it: a recipe is data, and exporting it must not load a library
        or overwrite a file."""
        out: dict[str, str] = {}
        for fix in self.fix_objects():
            out.update({check_env_name(k): v for k, v in fix.env().items()})
        refused = self.refused_env(allow)
        if refused:
            name, why = next(iter(refused.items()))
            names = ", ".join(refused)
            raise RecipeError(
                f"the recipe sets {names}; refused: {why}. A recipe is data that is exported "
                "without a second look; if you wrote or checked it, allow the variable by name: "
                f"allow=[{name!r}] in Python, --allow {name} on the command line"
            )
        return out

    def to_env(self, allow: Iterable[str] = ()) -> str:
        """``export NAME=value`` lines for the environment fixes (empty when there are none);
        values are shell-quoted; ``allow``: see ``env_vars``."""
        return "".join(f"export {k}={env_value(v)}\n" for k, v in self.env_vars(allow).items())

    def torchrun_command(
        self,
        script: str = "train.py",
        *,
        nproc_per_node: int | str = "gpu",
        nnodes: int | str = 1,
        rdzv_endpoint: str | None = None,
        rdzv_id: str | None = None,
        args: Sequence[str] = (),
        allow: Iterable[str] = (),
    ) -> str:
        """A launch line with the recipe's environment: ``NAME=value torchrun ... script``.

        One node: ``torchrun --standalone``. Several (``nnodes=2`` or elastic ``"1:4"``): a c10d
        rendezvous at ``rdzv_endpoint`` (default ``$MASTER_ADDR:29500``, expanded by the shell
        on each node); run the line on every node. Values are checked or shell-quoted; a value
        that cannot be made safe is a RecipeError; ``allow``: see ``env_vars``.
        """
        from gpudiag.recipe.launch import torchrun_command

        return torchrun_command(
            self.env_vars(allow),
            script,
            nproc_per_node=nproc_per_node,
            nnodes=nnodes,
            rdzv_endpoint=rdzv_endpoint,
            rdzv_id=rdzv_id,
            args=args,
        )

    def slurm_script(
        self,
        script: str = "train.py",
        *,
        nodes: int = 1,
        gpus_per_node: int = 8,
        cpus_per_task: int | None = None,
        job_name: str = "gpudiag-train",
        partition: str | None = None,
        time: str | None = None,
        port: int = 29500,
        args: Sequence[str] = (),
        allow: Iterable[str] = (),
    ) -> str:
        """A SLURM batch script (``sbatch job.sh``): ``nodes`` nodes, one task per node running
        ``torchrun`` with ``gpus_per_node`` ranks, the first node as rendezvous host, the
        recipe's environment exported. Values are checked or shell-quoted; ``allow``: see
        ``env_vars``."""
        from gpudiag.recipe.launch import slurm_script

        summary = [f"gpudiag recipe{f' for {self.workload}' if self.workload else ''}"]
        summary += [f"  {f.label}" for f in self.fixes]
        return slurm_script(
            self.env_vars(allow),
            script,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            cpus_per_task=cpus_per_task,
            job_name=job_name,
            partition=partition,
            time=time,
            port=port,
            args=args,
            comment="\n".join(summary),
        )

    def to_python(self, path: str = "recipe.yaml", allow: Iterable[str] = ()) -> str:
        """A snippet applying this recipe in a training script, and its plain-PyTorch equivalent.

        Text from the recipe (workload, hardware, evidence, labels) only ever lands in comments,
        one line each: a line break in it cannot start a line of code."""
        lines = [f"# gpudiag recipe{f' for {_one_line(self.workload)}' if self.workload else ''}"]
        if self.hardware:
            lines.append(f"# measured on {_one_line(self.hardware)}")
        for f in self.fixes:
            evidence = f" - {f.evidence.summary()}" if f.evidence else ""
            lines.append(f"#   {_one_line(f.label + evidence)}")
        env = self.to_env(allow)
        if env:
            lines.append("# Environment fixes must be set before the process starts:")
            lines += [f"#   {line}" for line in env.splitlines()]
        lines += [
            "import gpudiag as gd",
            "",
            f"applied = gd.Recipe.load({path!r}).apply(model, optimizer=optimizer)",
            "print(applied)  # what was applied; what this machine cannot do is skipped, with why",
            "model = applied.model  # torch.compile returns a wrapper: use this one",
        ]
        lines += list(dict.fromkeys(line for f in self.fixes for line in f.spec.after_apply))
        plain = [
            line
            for fix in self.fix_objects()
            for line in [
                f"# {_one_line(fix.label)}:",
                *(f"#     {_one_line(c)}" for c in fix.code()),
            ]
            if fix.code()
        ]
        if plain:
            lines += ["", "# The same in plain PyTorch:", *plain]
        return "\n".join(lines) + "\n"

    def check(
        self, system: SystemReport | None = None, device_type: str | None = None
    ) -> list[tuple[Fix, bool, str]]:
        """(fix, can be applied here, reason) for each fix, against this (or the given) machine."""
        if system is None:
            from gpudiag.fixes._system import current_system

            system = current_system()
        out = []
        refused = self.refused_env()
        for fix in self.fix_objects():
            why_not = [f"{name} refused: {refused[name]}" for name in fix.env() if name in refused]
            if why_not:
                out.append((fix, False, "; ".join(why_not)))
            elif fix.kind is FixKind.ENVIRONMENT:
                ok, reason = fix.supported(system, device_type)
                out.append(
                    (
                        fix,
                        ok,
                        reason
                        or "export before starting: "
                        + ", ".join(f"{k}={v}" for k, v in fix.env().items()),
                    )
                )
            else:
                ok, reason = fix.tryable(system, device_type)
                out.append((fix, ok, reason))
        return out

    def apply(
        self,
        model: Any = None,
        optimizer: Any = None,
        system: SystemReport | None = None,
        *,
        device_type: str | None = None,
    ) -> AppliedFixes:
        """Apply the recipe to a training script's model; revert with ``.revert()``.

        Re-checks each fix on this machine: what it cannot do (other hardware, a missing
        package, an environment variable not set before start, a fix not implemented in this
        version) is skipped and listed in ``.skipped`` with the reason, never forced.
        """
        fixes = self.fix_objects()
        live = [f for f in fixes if f.kind is not FixKind.ENVIRONMENT]
        applied = apply_fixes(
            live, model, optimizer, system=system, device_type=device_type, skip_unsupported=True
        )
        refused = self.refused_env()
        for fix in fixes:
            if fix.kind is FixKind.ENVIRONMENT:
                if any(name in refused for name in fix.env()):
                    why = "; ".join(f"{n} refused: {refused[n]}" for n in fix.env() if n in refused)
                    applied.skipped.append((fix, why))
                    continue
                # Its proof reads the variables back in this process.
                proof = fix.proof(Observation(step=applied.target, environ=dict(os.environ)))
                if proof.not_applied:
                    applied.skipped.append((fix, f"{proof.reason}: {proof.manual}"))
                else:
                    applied.fixes.append(fix)
        return applied

    # -- display ----------------------------------------------------------------------------
    def __repr__(self) -> str:
        count = f"{len(self.fixes)} fix{'es' if len(self.fixes) != 1 else ''}"
        head = f"Recipe(schema {self.schema_version}, {count}"
        head += f", workload {self.workload!r})" if self.workload else ")"
        lines = [head]
        if self.hardware:
            lines.append(f"  measured on {self.hardware}")
        for f in self.fixes:
            lines.append(
                f"  {f.label}: " + (f.evidence.summary() if f.evidence else "no evidence recorded")
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.__repr__()

    def as_card(self) -> Card:
        rows = [
            [f.label, f.kind.value, f.evidence.summary() if f.evidence else "none"]
            for f in self.fixes
        ]
        facts = Facts(
            [
                ("schema", self.schema_version),
                ("workload", self.workload or ""),
                ("measured on", self.hardware or ""),
            ]
        )
        notes = Lines(self.notes, "note", prefix="note: ")
        return Card("gpudiag recipe", [Grid(("fix", "kind", "evidence"), rows), facts, notes])


def _one_line(text: str) -> str:
    """``text`` with every line break (as ``str.splitlines`` knows them) turned into a space."""
    return " ".join(str(text).splitlines())


def _error_text(err: Any) -> str:
    loc = ".".join(str(p) for p in err.get("loc", ()))
    msg = str(err.get("msg", "")).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def _evidence(comparison: Any, arm: Any, base: Any, fix: Fix) -> Evidence:
    facts = comparison.system or {}
    proof = next((p for p in arm.proofs if p.fix == fix.label), None)
    drift = arm.drift
    mem = arm.memory
    base_mem = base.memory
    sp = arm.speedup
    return Evidence(
        speedup=sp.value if sp else None,
        speedup_low=sp.low if sp and sp.bounded else None,
        speedup_high=sp.high if sp and sp.bounded else None,
        confidence=sp.confidence if sp else None,
        verdict=arm.verdict,
        arm=arm.label,
        proof=str(proof) if proof is not None else None,
        verified=arm.verified,
        step_time_s=arm.step_time.median_s if arm.step_time.n else None,
        baseline_step_time_s=base.step_time.median_s if base.step_time.n else None,
        rounds=arm.step_time.n,
        loss_drift=drift.loss_rel if drift else None,
        grad_norm_drift=drift.grad_norm_rel if drift else None,
        drift_status=drift.status if drift else None,
        peak_memory_bytes=mem.peak_bytes if mem else None,
        baseline_peak_memory_bytes=base_mem.peak_bytes if base_mem else None,
        memory_method=mem.method if mem else None,
        hardware=comparison.hardware,
        device_type=facts.get("device_type"),
        compute_capability=facts.get("compute_capability"),
        torch_version=facts.get("torch"),
        workload=comparison.workload,
        measured_at=comparison.created_at or None,
    )
