"""Record Holistic Trace Analysis' numbers on the trace fixtures, for the agreement test.

    .venv-peers/bin/python benchmarks/hta_reference.py [--fixtures DIR] [--write] [--temporal]

Runs in the peer virtualenv (``benchmarks/requirements-peers.txt``), not in the project's:
it imports ``hta`` and never ``gpudiag``. Without ``--write`` it prints the numbers; with it,
it rewrites ``tests/analysis/trace/data/hta_reference.json``, which
``tests/analysis/trace/test_trace_hta_agreement.py`` compares gpudiag against (within 1 %).

What is recorded per fixture (HTA 0.5.0, default ``include_last_profiler_step=False``):
the temporal breakdown (idle / compute / non-compute / kernel time), the kernel-type
breakdown (time per set of overlapping kernel types), the 40 kernels with the most time
(sum, count, mean) and the idle-time breakdown per stream (host wait, kernel wait, other;
``consecutive_kernel_delay=30``).

HTA rounds fractional-microsecond timestamps to whole microseconds (start up, end down),
which shortens each event of a nanosecond-resolution trace by up to 1 us; gpudiag keeps the
recorded precision. The reference is recorded with ``HTA_DISABLE_NS_ROUNDING=1`` so that
both tools measure the same durations.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"

REPO = Path(__file__).resolve().parents[1]
DEFAULT_FIXTURES = REPO / "tests" / "fixtures" / "traces"
OUT = REPO / "tests" / "analysis" / "trace" / "data" / "hta_reference.json"
# HTA's temporal breakdown of every fixture it reads (multi-rank folders too), per rank: what
# the time ledger's busy and idle time are compared with (--temporal).
TEMPORAL_OUT = REPO / "tests" / "analysis" / "trace" / "data" / "hta_temporal.json"
TOP_KERNELS = 40


def _analysis(path: Path):  # -> hta.trace_analysis.TraceAnalysis
    from hta.trace_analysis import TraceAnalysis

    folder = tempfile.mkdtemp(prefix="hta-ref-")
    os.symlink(path.resolve(), os.path.join(folder, path.name))
    return TraceAnalysis(trace_dir=folder)


def reference(path: Path) -> dict:
    ta = _analysis(path)
    rank = sorted(ta.t.traces)[0]
    tb = ta.get_temporal_breakdown(visualize=False).iloc[0]
    kinds, kernels = ta.get_gpu_kernel_breakdown(
        visualize=False, include_memory_kernels=True, num_kernels=10**9, duration_ratio=1.0
    )
    idle, _ = ta.get_idle_time_breakdown(ranks=[rank], visualize=False)
    kernels = kernels[kernels["kernel_type"].isin(["COMPUTATION", "COMMUNICATION"])]
    kernels = kernels.sort_values("sum (us)", ascending=False).head(TOP_KERNELS)
    per_stream: dict[str, dict[str, float]] = {}
    for row in idle.itertuples():
        per_stream.setdefault(str(int(row.stream)), {})[row.idle_category] = float(row.idle_time)
    return {
        "rank": int(rank),
        "temporal": {
            "idle_us": float(tb["idle_time(us)"]),
            "compute_us": float(tb["compute_time(us)"]),
            "non_compute_us": float(tb["non_compute_time(us)"]),
            "span_us": float(tb["kernel_time(us)"]),
        },
        "kernel_types_us": {str(r.kernel_type): float(r.sum) for r in kinds.itertuples()},
        "top_kernels": [
            {
                "name": str(r["name"]),
                "type": str(r["kernel_type"]),
                "sum_us": float(r["sum (us)"]),
                "mean_us": float(r["mean (us)"]),
                "count": round(float(r["sum (us)"]) / float(r["mean (us)"]))
                if float(r["mean (us)"])
                else 0,
            }
            for r in kernels.to_dict("records")
        ],
        "idle_by_stream_us": per_stream,
    }


def temporal(path: Path) -> list[dict[str, float]] | str:
    """HTA's temporal breakdown of a trace file or a folder of ranks, one row per rank, or
    the error HTA raised reading it."""
    from hta.trace_analysis import TraceAnalysis

    try:
        ta = TraceAnalysis(trace_dir=str(path)) if path.is_dir() else _analysis(path)
        tb = ta.get_temporal_breakdown(visualize=False)
    except Exception as exc:  # HTA cannot read every real trace: record why
        return f"{type(exc).__name__}: {str(exc)[:160]}"
    return [
        {
            "rank": int(tb.loc[i, "rank"]),
            "idle_us": float(tb.loc[i, "idle_time(us)"]),
            "compute_us": float(tb.loc[i, "compute_time(us)"]),
            "non_compute_us": float(tb.loc[i, "non_compute_time(us)"]),
            "span_us": float(tb.loc[i, "kernel_time(us)"]),
        }
        for i in tb.index
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, default=DEFAULT_FIXTURES)
    parser.add_argument("--write", action="store_true", help=f"rewrite {OUT.relative_to(REPO)}")
    parser.add_argument(
        "--temporal",
        action="store_true",
        help=f"write HTA's temporal breakdown of every fixture to {TEMPORAL_OUT.relative_to(REPO)}",
    )
    args = parser.parse_args(argv)
    try:
        import hta  # noqa: F401
    except ImportError:
        peer = REPO / ".venv-peers" / "bin" / "python"
        if peer.exists() and Path(sys.executable).resolve() != peer.resolve():
            return subprocess.call([str(peer), __file__, *(argv or sys.argv[1:])])
        print(
            "skipped: HTA is not importable here. Create the peer virtualenv, then rerun:\n"
            "  python3 -m venv .venv-peers && "
            ".venv-peers/bin/pip install -r benchmarks/requirements-peers.txt\n"
            "  .venv-peers/bin/python benchmarks/hta_reference.py --write"
        )
        return 0
    logging.disable(logging.WARNING)
    from importlib.metadata import version

    out = {
        "tool": f"HolisticTraceAnalysis {version('HolisticTraceAnalysis')}",
        "options": "HTA_DISABLE_NS_ROUNDING=1, include_last_profiler_step=False, "
        "consecutive_kernel_delay=30",
        "fixtures": {},
    }
    if args.temporal:
        paths = sorted(args.fixtures.glob("*.json.gz")) + sorted(
            d for d in args.fixtures.iterdir() if d.is_dir() and any(d.glob("*.json*"))
        )
        found = {p.name: temporal(p) for p in paths}
        for name, rows in found.items():
            print(f"{name[:60]:<60} {rows if isinstance(rows, str) else len(rows)} rank(s)")
        TEMPORAL_OUT.write_text(
            json.dumps({"tool": out["tool"], "options": out["options"], "fixtures": found},
                       indent=1, sort_keys=True) + "\n"
        )  # fmt: skip
        print(f"wrote {TEMPORAL_OUT.relative_to(REPO)}")
        return 0
    for path in sorted(args.fixtures.glob("*.json.gz")):
        ref = reference(path)
        out["fixtures"][path.name] = ref
        t = ref["temporal"]
        print(
            f"{path.name[:60]:<60} span {t['span_us']:>12.0f} us  compute {t['compute_us']:>10.0f}"
            f"  non-compute {t['non_compute_us']:>10.0f}  idle {t['idle_us']:>12.0f}"
        )
    if args.write:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
        print(f"wrote {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
