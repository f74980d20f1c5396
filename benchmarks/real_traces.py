"""gpudiag's judgement on every real trace in the fixtures: top findings and reference agreement.

    python benchmarks/real_traces.py [--fixtures DIR] [--top 3] [--only SUBSTRING]

Runs ``gd.analyze_trace`` and ``gd.diagnose(trace=...)`` over each trace file and multi-rank
folder under ``tests/fixtures/traces`` and prints, per trace: the GPU, the time ledger (every
microsecond of the analysis window on one row, largest first, whether the rows sum to the
window, and the unexplained share), the top findings (id, severity, estimated gain over the
run, the ledger rows it claims), the tensor-core share of compute-kernel time, the
communication share of kernel time, and how the ledger agrees with the reference answers
that come with the fixtures (as a share of the window):

- HTA: Holistic Trace Analysis' temporal breakdown (busy = compute + non-compute, idle) of
  every fixture it reads, rank by rank, recorded by ``benchmarks/hta_reference.py
  --temporal`` into ``tests/analysis/trace/data/hta_temporal.json``;
- TraceLens: the ``gpu_timeline.csv`` (total, busy, idle, computation, exposed communication)
  over all steps and the GEMM table's dtypes of the two MI300X traces in
  ``tracelens-reference-csvs/``. On the checkpointing trace TraceLens draws the recomputed
  forward apart (its ``is_recompute`` rows), so its idle time holds the time when only
  recomputed kernels run; the line says how much that is.

Where a trace holds attention, a line says how much is eager, SDPA math or fused.

The diagnosis uses only the trace (no live system, no process switches): what a user would
get from ``gpudiag diagnose --trace FILE`` on a machine other than the one traced.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FIXTURES = REPO / "tests" / "fixtures" / "traces"
# HTA's temporal breakdown of every fixture it reads, per rank (hta_reference.py --temporal).
HTA_TEMPORAL = REPO / "tests" / "analysis" / "trace" / "data" / "hta_temporal.json"
TRACELENS = {
    "tracelens-mi300-Qwen_Qwen1.5-0.5B-Chat.json.gz": "mi300-Qwen__",
    "tracelens-mi300-resnet_act_checkpoint.json.gz": "mi300-resnet_act_checkpoint_recompute__",
}


def trace_paths(root: Path) -> list[Path]:
    """Every trace file and every folder of ranks directly under ``root``."""
    out = []
    for p in sorted(root.iterdir()):
        is_ranks = p.is_dir() and any(p.glob("*.json*"))
        if is_ranks or p.name.endswith((".json", ".json.gz")):
            out.append(p)
    return out


def _gpu(report: Any) -> str:
    devices = report.device_properties
    dev = devices[0] if devices else None
    if dev is None:
        return "?"
    cc = dev.compute_capability
    name = dev.name or "(unnamed)"
    return f"{name} cc{cc[0]}.{cc[1]}" if cc else name


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def _hta_agreement(name: str, report: Any, temporal: dict[str, Any]) -> str | None:
    """The ledger's busy and idle time against HTA's temporal breakdown, rank by rank, as a
    share of each rank's window. With one step HTA takes the whole capture and the ledger the
    step's own GPU work: those ranks are named, not compared."""
    rows = temporal.get(name)
    if rows is None:
        return None
    if isinstance(rows, str):
        return f"HTA temporal: HTA could not read the trace ({rows[:80]})"
    worst_busy = worst_idle = 0.0
    compared, one_step = 0, []
    for ref in rows:
        rank = int(ref["rank"])
        led = report.ledger(rank)
        if len(report.rank(rank).steps) == 1:
            one_step.append(
                f"rank {rank} {led.window_us / 1e3:.2f} of {ref['span_us'] / 1e3:.2f} ms"
            )
            continue
        w = led.window_us or 1.0
        busy = ref["compute_us"] + ref["non_compute_us"]
        worst_busy = max(worst_busy, abs(led.busy_us - busy) / w)
        worst_idle = max(worst_idle, abs(led.idle_us - ref["idle_us"]) / w)
        compared += 1
    text = "HTA temporal vs the ledger:"
    if compared:
        text += (
            f" busy within {worst_busy:.2%} and idle within {worst_idle:.2%} of the window "
            f"({compared} rank(s))"
        )
    if one_step:
        text += (
            " one-step window (the step's own GPU work) inside HTA's whole capture: "
            + ", ".join(one_step[:3])
            + ("..." if len(one_step) > 3 else "")
        )
    return text


def _tracelens_agreement(name: str, path: Path) -> str | None:
    """TraceLens' gpu_timeline covers every step (the last one too): compared with gpudiag's
    breakdown over the same steps (``include_last_step=True``). Its computation time is split
    into recompute and the rest when recompute detection is on: the two are summed here."""
    prefix = TRACELENS.get(name)
    if prefix is None:
        return None
    import gpudiag as gd

    folder = FIXTURES / "tracelens-reference-csvs"
    with open(folder / f"{prefix}gpu_timeline.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    ref: dict[str, float] = {}
    plain: dict[str, float] = {}  # the rows of the timeline that are not recompute's
    for r in rows:
        key = r["type"]
        if r.get("is_recompute") != "True":
            plain[key] = float(r["time ms"]) * 1e3
        if key == "total_time" and r.get("is_recompute") == "True":
            continue  # the recompute rows' total is their own span, not the trace's
        ref[key] = ref.get(key, 0.0) + float(r["time ms"]) * 1e3
    report = gd.analyze_trace(path, include_last_step=True)
    b = report.time_breakdown()
    led = report.ledger()
    w = led.window_us or 1.0
    recomputed = "is_recompute" in rows[0]
    ledger_text = (
        f"TraceLens timeline vs the ledger (all steps): window {w / 1e3:.2f} vs "
        f"{plain['total_time'] / 1e3:.2f} ms, busy {led.busy_us / 1e3:.2f} vs "
        f"{plain['busy_time'] / 1e3:.2f} ms ({abs(led.busy_us - plain['busy_time']) / w:.2%} of "
        f"the window), idle {led.idle_us / 1e3:.2f} vs {plain['idle_time'] / 1e3:.2f} ms "
        f"({abs(led.idle_us - plain['idle_time']) / w:.2%})"
        + (
            "; TraceLens' idle holds the time only recomputed kernels run (its is_recompute "
            "rows), which the ledger counts busy"
            if recomputed
            else ""
        )
    )
    total = ref["total_time"]
    ours_total = b["span_us"] or 0.0
    text = (
        f"TraceLens timeline (all steps): total {ours_total / 1e3:.2f} vs {total / 1e3:.2f} ms, "
        f"computation {(b['compute_us'] or 0.0) / 1e3:.2f} vs "
        f"{ref['computation_time'] / 1e3:.2f} ms, "
        f"communication not overlapped by compute {(b['communication_us'] or 0.0) / 1e3:.2f} vs "
        f"exposed {ref['exposed_comm_time'] / 1e3:.2f} ms"
    )
    gemm = folder / f"{prefix}GEMM.csv"
    if gemm.exists():
        with open(gemm, newline="") as fh:
            dtypes = {r["param: dtype_A_B"] for r in csv.DictReader(fh)}
        ours = {g.dtype for g in gd.analyze_trace(path).gemm_shapes() if g.gpu_us}
        text += f"; GEMM dtypes {sorted(map(str, ours))} vs TraceLens {sorted(dtypes)}"
    return ledger_text + "\n   " + text


def run(path: Path, top: int, refs: dict[str, Any]) -> list[str]:
    import gpudiag as gd
    from gpudiag.rules import EvidenceBundle, run_rules

    t0 = time.perf_counter()
    report = gd.analyze_trace(path)
    diagnosis = run_rules(EvidenceBundle(trace=report, env={}))
    elapsed = time.perf_counter() - t0
    b = report.time_breakdown()
    kernel_us = (b["compute_us"] or 0.0) + (b["communication_us"] or 0.0)
    comm = (b["communication_us"] or 0.0) / kernel_us if kernel_us else None
    lines = [
        f"## {path.name}  [{_gpu(report)}; {len(report.ranks)} rank(s); "
        f"{elapsed:.1f} s to analyse]",
        f"   tensor-core share {_pct(report.tensor_core_share)}, "
        f"communication share of kernel time {_pct(comm)}",
    ]
    att = report.attention()
    if att.found:
        lines.append(
            f"   attention: {att.eager_calls} eager ({att.eager_us / 1e3:.1f} ms), "
            f"{att.math_calls} SDPA math, {att.fused_calls} fused "
            f"({', '.join(att.fused_backends) or '-'}, {att.fused_us / 1e3:.1f} ms)"
            + (
                f", {att.unlaunched_kernels} fused-attention kernels no recorded operator "
                f"launched ({', '.join(att.unlaunched_libraries)}, "
                f"{att.unlaunched_us / 1e3:.1f} ms)"
                if att.unlaunched_kernels
                else ""
            )
        )
    led = report.ledger()
    if led.window_us > 0:
        total = sum(r.us for r in led.rows)
        lines.append(
            f"   ledger: {led.window_us / 1e3:.2f} ms window ({led.window[:90]}), rows sum to "
            f"it: {'yes' if abs(total - led.window_us) <= 1e-6 * led.window_us else 'NO'}, "
            f"unexplained {100 * led.unexplained_us / led.window_us:.1f}%"
        )
        lines += [
            f"      {100 * r.us / led.window_us:5.1f}% {r.us / 1e3:10.2f} ms  {r.kind:<4}  "
            + r.label
            for r in led.rows
        ]
    else:
        lines.append("   ledger: no GPU time to account for")
    for i, f in enumerate(diagnosis.findings[:top], 1):
        gain = "n/a" if f.estimated_gain is None else f"{100 * f.estimated_gain:.2f}%"
        claims = f" (claims {', '.join(f.claims)})" if f.claims else ""
        lines.append(f"   {i}. {f.id} [{f.severity.value}] gain {gain}{claims}: {f.message[:110]}")
    if not diagnosis.findings:
        lines.append("   (no findings)")
    for agreement in (
        _hta_agreement(path.name, report, refs),
        _tracelens_agreement(path.name, path),
    ):
        if agreement:
            lines.append("   " + agreement)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, default=FIXTURES)
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--only", default="", help="only traces whose name contains this")
    args = parser.parse_args(argv)
    refs = json.loads(HTA_TEMPORAL.read_text())["fixtures"] if HTA_TEMPORAL.exists() else {}
    for path in trace_paths(args.fixtures):
        if args.only and args.only not in path.name:
            continue
        try:
            print("\n".join(run(path, args.top, refs)), flush=True)
        except Exception as exc:  # a benchmark reports a trace it cannot read and goes on
            print(f"## {path.name}: {type(exc).__name__}: {exc}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
