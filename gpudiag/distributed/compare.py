"""``gd.compare(workload, fixes=["fsdp.wrap"], nproc=2)``: a trial run as N ranks through torchrun.

From a notebook (or any process) gpudiag writes a plan, starts ``python -m
torch.distributed.run --standalone --nproc-per-node=N -m gpudiag.distributed._trial_worker``
and reads back what rank 0 gathered. The baseline is DDP (its ``bucket_cap_mb``,
``gradient_as_bucket_view`` and ``static_graph`` from ``ddp=``; ``accumulation`` micro-batches
per step with ``no_sync``); each ``fsdp.wrap`` arm is FSDP2 ``fully_shard`` per block class with
its ``reshard_after_forward`` and ``mixed_precision``. The result is a ``Comparison``: the job's
step time (slowest rank per round), global throughput, per-arm peak memory (the largest rank's,
every rank's in ``.ranks``), loss drift vs DDP, verdicts, ``.recipe()``.

The user's state is untouched by construction: the notebook's objects never leave it, each rank
rebuilds the workload in its own process (see gpudiag.distributed.workload for what must be
importable). gloo on a CPU (tested with 2 real processes), NCCL with one GPU per rank (untested
on a real GPU in this version).
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import json
import socket
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudiag._progress import ProgressFn, resolve, ticking
from gpudiag._report import html_grid, jsonable
from gpudiag._values import finite_number, whole_number
from gpudiag.analysis.stats import Measurement
from gpudiag.analysis.verdict import NOT_APPLIED, VerdictPlan, judge
from gpudiag.distributed.launch import torchrun
from gpudiag.distributed.trial import CPU_MEMORY, DdpOptions
from gpudiag.distributed.workload import check_picklable, spec_of
from gpudiag.errors import DistributedError, WorkloadSpecError
from gpudiag.experiment.compare import ArmResult, Comparison
from gpudiag.experiment.drift import StepTrace, compare_traces
from gpudiag.experiment.memory import PeakMemory
from gpudiag.experiment.workload import Workload
from gpudiag.fixes import Fix, Proof, ProofStatus
from gpudiag.probe import cuda

WORKER_MODULE = "gpudiag.distributed._trial_worker"
BASELINE_LABEL = "ddp (baseline)"


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.1f} MiB"


@dataclass(frozen=True)
class DistributedComparison(Comparison):
    """A ``Comparison`` measured across ranks; ``ranks`` keeps every rank's own figures."""

    nproc: int = 0
    backend: str = ""
    ranks: tuple[dict[str, Any], ...] = ()
    ddp: dict[str, Any] | None = None
    accumulation: int = 1

    def peak_bytes_per_rank(self, label: str) -> list[int | None]:
        """Each rank's step peak memory for the arm ``label`` (baseline: BASELINE_LABEL)."""
        out = []
        for r in self.ranks:
            arm = next((a for a in r["arms"] if a["label"] == label), None)
            out.append(None if arm is None else arm.get("peak_bytes"))
        return out

    RANK_HEADER = ("rank", "arm", "peak memory", "live after wrap", "median step", "samples/s")

    def rank_rows(self) -> list[tuple[str, ...]]:
        out: list[tuple[str, ...]] = []
        for r in self.ranks:
            for a in r["arms"]:
                times = sorted(a.get("step_s") or [])
                median = times[len(times) // 2] if times else None
                sps = a.get("samples_per_step") or 0
                out.append(
                    (
                        str(r["rank"]),
                        a["label"],
                        _mib(a.get("peak_bytes")),
                        _mib(a.get("resident_bytes")),
                        "n/a" if median is None else f"{median * 1e3:.1f} ms",
                        "n/a" if not median or not sps else f"{sps / median:,.1f}",
                    )
                )
        return out

    def __repr__(self) -> str:
        table = [self.RANK_HEADER, *self.rank_rows()]
        widths = [max(len(row[i]) for row in table) for i in range(len(self.RANK_HEADER))]
        lines = [super().__repr__(), "  per rank:"]
        for row in table:
            cells = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
            lines.append("    " + cells.rstrip())
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        extra = "<div><b>per rank</b></div>" + html_grid(self.RANK_HEADER, self.rank_rows())
        return super()._repr_html_() + f"<div>{extra}</div>"

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out.update(
            jsonable(
                {
                    "nproc": self.nproc,
                    "backend": self.backend,
                    "ddp": self.ddp,
                    "accumulation": self.accumulation,
                    "ranks": list(self.ranks),
                }
            )
        )
        return dict(out)


def _findable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package, an empty name
        return False


def _rebuild_spec(workload: Any, workload_args: Mapping[str, Any] | None) -> tuple[str, dict]:
    if isinstance(workload, Workload) and workload.rebuild_spec is not None:
        name, args = workload.rebuild_spec
        return str(name), {**dict(args), **dict(workload_args or {})}
    spec = spec_of(workload)  # a notebook's own Workload is refused here, with what to do
    module = spec.partition(":")[0] if ":" in spec else None
    if module is not None and not _findable(module):
        raise WorkloadSpecError(
            f"cannot find module {module!r} of workload {spec!r}: the ranks import it in a fresh "
            "Python, so it must be a module on sys.path or in the working directory"
        )
    return spec, dict(workload_args or {})


def _arms(fixes: Iterable[Any]) -> tuple[list[dict[str, Any]], list[Fix], list[tuple[str, str]]]:
    arms: list[dict[str, Any]] = [{"label": BASELINE_LABEL, "strategy": "ddp", "params": {}}]
    chosen: list[Fix] = []
    skipped: list[tuple[str, str]] = []
    for item in fixes:
        if not isinstance(item, (Fix, str)):
            skipped.append((str(item), "a distributed trial takes one fix per arm"))
            continue
        fix = item if isinstance(item, Fix) else Fix.parse(item)
        if fix.id != "fsdp.wrap":
            skipped.append(
                (
                    fix.label,
                    "only fsdp.wrap is tried across ranks in this version; compare it on one "
                    "process (nproc=None)",
                )
            )
            continue
        if fix in chosen:
            continue
        chosen.append(fix)
        arms.append({"label": fix.label, "strategy": "fsdp", "params": dict(fix.params)})
    return arms, chosen, skipped


def launch(
    plan: Mapping[str, Any],
    nproc: int,
    *,
    timeout_s: float = 600.0,
    cwd: str | None = None,
) -> dict[str, Any]:
    """Run ``plan`` on ``nproc`` local ranks; rank 0's gathered results, or DistributedError."""
    with tempfile.TemporaryDirectory(prefix="gpudiag-trial-") as tmp:
        plan_path, out_path = Path(tmp) / "plan.json", Path(tmp) / "result.json"
        plan_path.write_text(json.dumps(plan), encoding="utf-8")
        torchrun(
            [WORKER_MODULE, str(plan_path), str(out_path)],
            nproc,
            timeout_s=timeout_s,
            cwd=cwd,
            what="trial",
        )
        if not out_path.is_file():
            raise DistributedError(f"the {nproc}-rank trial wrote no result")
        data: dict[str, Any] = json.loads(out_path.read_text(encoding="utf-8"))
        return data


def _plan(rounds: int, confidence: float, tolerance: float) -> VerdictPlan:
    """One look after the fixed rounds, with the verdict rules of gd.compare."""
    return VerdictPlan(
        min_rounds=2,
        max_rounds=max(2, rounds),
        confidence=confidence,
        tolerance=tolerance,
        adaptive=False,
    )


def _arm_result(
    label: str,
    fixes: tuple[Fix, ...],
    per_rank: Sequence[Mapping[str, Any]],
    baseline: Mapping[str, Any] | None,
    nproc: int,
    confidence: float,
    tolerance: float,
    seed: int,
) -> ArmResult:
    first = per_rank[0]
    errors = sorted({a["error"] for a in per_rank if a.get("error")})
    samples = tuple(first.get("slowest_step_s") or ())
    peaks = [a.get("peak_bytes") for a in per_rank]
    memory = None
    if peaks and all(p is not None for p in peaks):
        shown = ", ".join(f"rank {i}: {_mib(p)}" for i, p in enumerate(peaks))
        memory = PeakMemory(
            max(p for p in peaks if p is not None),
            None,
            str(first.get("memory_method") or CPU_MEMORY),
            note=f"largest of {len(peaks)} ranks ({shown})",
        )
    est = verdict_text = drift = look = None
    proofs = tuple(
        Proof(fixes[0].label if fixes else label, ProofStatus(p["status"]), p["evidence"],
              p["reason"], p["manual"])
        for p in [first.get("proof")] if p
    )  # fmt: skip
    if baseline is not None and any(p.not_applied for p in proofs):
        verdict_text = NOT_APPLIED
    elif baseline is not None and samples and not errors:
        base_samples = baseline.get("slowest_step_s") or []
        look = judge(base_samples, samples, _plan(len(samples), confidence, tolerance), final=True)
        est, verdict_text = look.estimate, look.verdict
        drift = compare_traces(
            StepTrace(tuple(baseline.get("losses") or ())),
            StepTrace(tuple(first.get("losses") or ())),
        )
    notes = tuple(dict.fromkeys(n for a in per_rank for n in a.get("notes", [])))
    return ArmResult(
        label=label,
        fixes=fixes,
        step_time=Measurement(samples, label),
        samples_per_step=int(first.get("samples_per_step") or 0) * nproc,
        tokens_per_sample=first.get("tokens_per_sample"),
        memory=memory,
        drift=drift,
        speedup=est,
        verdict=verdict_text,
        stop_reason="" if baseline is None else "fixed",
        first_step_s=None,
        error="; ".join(errors) or None,
        notes=notes,
        proofs=proofs,
        judgement=look,
    )


def compare_distributed(
    workload: Any,
    fixes: Iterable[Any] = ("fsdp.wrap",),
    *,
    nproc: int = 2,
    workload_args: Mapping[str, Any] | None = None,
    ddp: Mapping[str, Any] | None = None,
    accumulation: int = 1,
    rounds: int = 8,
    steps_per_round: int = 2,
    memory_steps: int = 3,
    seed: int = 0,
    confidence: float = 0.95,
    tolerance: float = 0.01,
    timeout_s: float = 600.0,
    progress: bool | ProgressFn = True,
) -> DistributedComparison:
    """DDP (baseline) vs each ``fsdp.wrap`` arm on ``nproc`` ranks; see the module docstring.

    ``workload``: a demo workload (``gd.workloads.get("gpt", ...)`` or its name) or
    ``"package.module:function"`` returning a ``gd.Workload``, rebuilt inside every rank with
    ``workload_args``. ``ddp``: ``bucket_cap_mb``, ``gradient_as_bucket_view``,
    ``static_graph``. ``accumulation``: micro-batches per optimizer step, gradients synced on
    the last only (DDP ``no_sync``, FSDP ``set_requires_gradient_sync``). Each arm runs
    ``memory_steps`` measured first steps (memory, losses), then ``rounds`` interleaved rounds
    of ``steps_per_round`` timed steps, judged once at the end as gd.compare judges (a 95 %
    verdict needs at least 6 rounds; fewer leave it "undecided"). Each rank checks that
    ``fully_shard`` reached its model (FSDP modules, sharded parameters): an arm where it did
    not is "not applied". ``progress``: the seconds waited on the ranks (a bar, ``True``),
    none (``False``), or a callback.
    """
    started = time.perf_counter()
    if not isinstance(nproc, int) or nproc < 1:
        raise DistributedError(f"nproc must be a whole number of ranks, 1 or more; got {nproc!r}")
    for name, value in (
        ("rounds", rounds), ("steps_per_round", steps_per_round), ("accumulation", accumulation),
        ("memory_steps", memory_steps),
    ):  # fmt: skip
        whole_number(value, name, low=0 if name == "memory_steps" else 1, high=10_000,
                     error=DistributedError)  # fmt: skip
    finite_number(timeout_s, "timeout_s", low=0, low_open=True, error=DistributedError)
    on_gpu = cuda.available()
    if on_gpu and nproc > cuda.device_count():
        raise DistributedError(
            f"NCCL needs one GPU per rank: nproc={nproc} but {cuda.device_count()} GPU(s) visible"
        )
    spec, overrides = _rebuild_spec(workload, workload_args)
    check_picklable(overrides)
    try:
        json.dumps(overrides)
    except TypeError as exc:
        raise WorkloadSpecError(f"workload_args must be JSON values for the ranks: {exc}") from None
    ddp_options = DdpOptions.from_dict(ddp)
    if ddp_options.static_graph and accumulation > 1:
        # Measured with torch 2.13: no_sync on a static-graph DDP model fails inside torch's
        # reducer ("expect_autograd_hooks_ INTERNAL ASSERT FAILED").
        raise DistributedError(
            "DDP static_graph=True does not work with no_sync accumulation in this torch "
            "(its reducer asserts): use accumulation=1 or static_graph=False"
        )
    arms, chosen, skipped = _arms(fixes)
    plan = {
        "workload": spec,
        "overrides": overrides,
        "seed": seed,
        "arms": arms,
        "ddp": ddp_options.__dict__,
        "accumulation": int(accumulation),
        "memory_steps": int(memory_steps),
        "rounds": int(rounds),
        "steps_per_round": int(steps_per_round),
    }
    t0 = time.perf_counter()
    with ticking(resolve(progress, "compare"), f"{nproc} ranks", "DDP and FSDP arms (torchrun)"):
        data = launch(plan, nproc, timeout_s=timeout_s)
    measuring = time.perf_counter() - t0
    ranks = sorted(data["ranks"], key=lambda r: r["rank"])

    def per_rank(label: str) -> list[dict[str, Any]]:
        return [next(a for a in r["arms"] if a["label"] == label) for r in ranks]

    base_rows = per_rank(BASELINE_LABEL)
    baseline = _arm_result(BASELINE_LABEL, (), base_rows, None, nproc, confidence, tolerance, seed)
    results = []
    for fix in chosen:
        rows = per_rank(fix.label)
        results.append(
            _arm_result(fix.label, (fix,), rows, base_rows[0], nproc, confidence, tolerance, seed)
        )
    backend = str(data.get("backend", ""))
    device = "cuda" if backend == "nccl" else "cpu"
    overrides_text = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
    description = f"{spec}({overrides_text}) rebuilt on each of {nproc} ranks"
    per_rank_batch = int(base_rows[0].get("samples_per_step") or 0)
    notes = [
        f"every rank steps the same batch of {per_rank_batch} samples (throughput counts all "
        f"{nproc} ranks); step time is the slowest rank's per round",
        "peak memory: " + str(base_rows[0].get("memory_method") or CPU_MEMORY),
    ]
    if accumulation > 1:
        notes.append(f"{accumulation} micro-batches per step, gradients synced on the last")
    return DistributedComparison(
        workload=spec,
        workload_description=description,
        device=device,
        hardware=f"{nproc} ranks over {backend} on {socket.gethostname()}",
        baseline=baseline,
        arms=tuple(results),
        skipped=tuple(skipped),
        rounds=int(rounds),
        steps_per_sample=int(steps_per_round),
        adaptive=False,
        stop_reason=f"fixed: {rounds} rounds",
        elapsed_s=time.perf_counter() - started,
        measuring_s=measuring,
        confidence=confidence,
        tolerance=tolerance,
        isolation="each rank rebuilt the workload in its own process; the caller's objects "
        "were never touched",
        notes=tuple(notes),
        created_at=_dt.datetime.now().isoformat(timespec="seconds"),
        system={"nproc": nproc, "backend": backend},
        verdict_rule=_plan(int(rounds), confidence, tolerance).describe(),
        nproc=nproc,
        backend=backend,
        ranks=tuple(ranks),
        ddp=dict(ddp_options.__dict__),
        accumulation=int(accumulation),
    )
