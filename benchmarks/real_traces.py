"""gpudiag's judgement on every real trace in the fixtures: top findings and reference agreement.

    python benchmarks/real_traces.py [--fixtures DIR] [--top 3] [--only SUBSTRING]

Runs ``gd.analyze_trace`` and ``gd.diagnose(trace=...)`` over each trace file and multi-rank
folder under ``tests/fixtures/traces`` and prints, per trace: the GPU, the top findings (id,
severity, estimated gain over the run), the tensor-core share of compute-kernel time, the
communication share of kernel time, and how gpudiag's time breakdown agrees with the
reference answers that come with the fixtures:

- HTA: Holistic Trace Analysis' temporal breakdown (compute and idle time), recorded by
  ``benchmarks/hta_reference.py`` into ``tests/analysis/trace/data/hta_reference.json``;
- TraceLens: the ``gpu_timeline.csv`` (total, computation, exposed communication) over all
  steps and the GEMM table's dtypes of the two MI300X traces in ``tracelens-reference-csvs/``.

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
HTA_REFERENCE = REPO / "tests" / "analysis" / "trace" / "data" / "hta_reference.json"
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


def _hta_agreement(name: str, report: Any, refs: dict[str, Any]) -> str | None:
    ref = refs.get(name)
    if ref is None:
        return None
    t = ref["temporal"]
    b = report.time_breakdown()
    parts = []
    for key in ("compute_us", "idle_us"):
        ours, theirs = b[key] or 0.0, t[key]
        diff = abs(ours - theirs) / theirs if theirs else 0.0
        parts.append(f"{key[:-3]} {diff:.2%} off")
    return "HTA temporal: " + ", ".join(parts)


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
    for r in rows:
        key = r["type"]
        if key == "total_time" and r.get("is_recompute") == "True":
            continue  # the recompute rows' total is their own span, not the trace's
        ref[key] = ref.get(key, 0.0) + float(r["time ms"]) * 1e3
    b = gd.analyze_trace(path, include_last_step=True).time_breakdown()
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
    return text


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
    for i, f in enumerate(diagnosis.findings[:top], 1):
        gain = "n/a" if f.estimated_gain is None else f"{100 * f.estimated_gain:.2f}%"
        lines.append(f"   {i}. {f.id} [{f.severity.value}] gain {gain}: {f.message[:110]}")
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
    refs = json.loads(HTA_REFERENCE.read_text())["fixtures"] if HTA_REFERENCE.exists() else {}
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
