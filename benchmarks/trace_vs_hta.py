"""gpudiag vs Holistic Trace Analysis on a ~1 M-event trace: time and peak memory.

    python benchmarks/trace_vs_hta.py [--copies 10] [--source FIXTURE] [--repeat 1]
                                      [--peer-python .venv-peers/bin/python] [--keep]

Builds a large Kineto trace by replicating every step of a real A100 trace
(``hta-trace_diff-control.json.gz``, 109 k events, rank 3 of 8) ``--copies`` times, shifted
in time and with fresh correlation/external ids and step numbers, and writes it gzipped to a
temporary folder (deleted afterwards unless ``--keep``; never committed). Then each tool runs
in a fresh process, one after the other:

* gpudiag: ``analyze_trace(path)`` (``gd.analyze_trace``: decode + every analysis of the
  report), then the time breakdown, kernel table and idle breakdown are read;
* HTA: ``TraceAnalysis(trace_dir=...)`` (load) + ``get_temporal_breakdown`` +
  ``get_gpu_kernel_breakdown`` + ``get_idle_time_breakdown``, in the peer virtualenv
  ``.venv-peers`` (created from ``benchmarks/requirements-peers.txt`` on first use).

Peak memory is each process's peak RSS (``wait4`` rusage); time is the process's wall time
from start to exit, imports included. Targets: gpudiag >= 5x faster and <= 1/3 of HTA's peak
memory, with compute and idle time agreeing within 1 %.

Measured on the 2-core, 24 GiB development machine (shared with other jobs; Python 3.11,
HTA 0.5.0 with pandas 3.1.1), 10 copies = 1,090,843 events (16.5 MB gzipped, ~310 MB of JSON):

    tool        wall s  peak RSS MB    compute us       idle us
    gpudiag        3.9          224       2766784       1440991
    HTA           39.6         1623       2766784       1440991

    speed-up (best wall time): 10.1x   target >= 5x   ok
    peak memory ratio: 0.14   target <= 0.33   ok
    compute and idle time within 1 %: yes
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from big_traces import DEFAULT_SOURCE, REPO, make_big_trace

PEER_VENV = REPO / ".venv-peers"
PEER_REQUIREMENTS = REPO / "benchmarks" / "requirements-peers.txt"


GPUDIAG_CHILD = """
import json, sys, time
t0 = time.perf_counter()
from gpudiag.analysis.trace import analyze_trace
r = analyze_trace(sys.argv[1])
b = r.time_breakdown()
kernels = r.kernels()
idle = r.idle_breakdown()
print(json.dumps({"analysis_s": time.perf_counter() - t0, "compute_us": b["compute_us"],
    "idle_us": b["idle_us"], "span_us": b["span_us"], "kernels": len(kernels),
    "host_wait_us": sum(s.host_wait_us for s in idle)}))
"""

HTA_CHILD = """
import json, logging, os, sys, tempfile, time
os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
t0 = time.perf_counter()
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
folder = tempfile.mkdtemp()
os.symlink(os.path.abspath(sys.argv[1]), os.path.join(folder, os.path.basename(sys.argv[1])))
ta = TraceAnalysis(trace_dir=folder)
tb = ta.get_temporal_breakdown(visualize=False).iloc[0]
kinds, kernels = ta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True,
    num_kernels=10**9, duration_ratio=1.0)
idle, _ = ta.get_idle_time_breakdown(ranks=list(ta.t.traces), visualize=False)
print(json.dumps({"analysis_s": time.perf_counter() - t0,
    "compute_us": float(tb["compute_time(us)"]), "idle_us": float(tb["idle_time(us)"]),
    "span_us": float(tb["kernel_time(us)"]), "kernels": int(len(kernels)),
    "host_wait_us": float(idle[idle.idle_category == "host_wait"].idle_time.sum())}))
"""


def run_child(python: str, code: str, trace: Path) -> dict[str, Any]:
    """Run ``code`` in a fresh process; its JSON line plus wall time and peak RSS."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [python, "-c", code, str(trace)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    out = proc.stdout.read() if proc.stdout else ""
    err = proc.stderr.read() if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{python} failed ({proc.returncode}):\n{err[-3000:]}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["wall_s"] = wall
    result["peak_rss_mb"] = usage.ru_maxrss / 1024  # KiB on Linux
    return result


def peer_python(explicit: str | None) -> str:
    if explicit:
        return explicit
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {PEER_VENV.name} from {PEER_REQUIREMENTS.relative_to(REPO)} ...")
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "-r", str(PEER_REQUIREMENTS)],
            check=True,
        )
    return str(python)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--peer-python", default=None, help="a python with HTA installed")
    parser.add_argument("--keep", action="store_true", help="keep the generated trace")
    args = parser.parse_args(argv)

    hta_python = peer_python(args.peer_python)
    folder = Path(tempfile.mkdtemp(prefix="gpudiag-bench-"))
    trace = folder / "big.pt.trace.json.gz"
    t = time.perf_counter()
    n = make_big_trace(args.source, args.copies, trace)
    print(
        f"built {trace} in {time.perf_counter() - t:.0f} s: {n:,} events, "
        f"{trace.stat().st_size / 1e6:.1f} MB gzipped"
    )
    rows: list[tuple[str, dict[str, Any]]] = []
    try:
        for _ in range(args.repeat):
            rows.append(("gpudiag", run_child(sys.executable, GPUDIAG_CHILD, trace)))
            rows.append(("HTA", run_child(hta_python, HTA_CHILD, trace)))
    finally:
        if args.keep:
            print(f"kept {trace}")
        else:
            shutil.rmtree(folder, ignore_errors=True)

    print()
    print(f"{'tool':<9}{'wall s':>9}{'peak RSS MB':>13}{'compute us':>14}{'idle us':>14}")
    for tool, r in rows:
        print(
            f"{tool:<9}{r['wall_s']:>9.1f}{r['peak_rss_mb']:>13.0f}"
            f"{r['compute_us']:>14.0f}{r['idle_us']:>14.0f}"
        )
    ours = [r for tool, r in rows if tool == "gpudiag"]
    theirs = [r for tool, r in rows if tool == "HTA"]
    best = min(r["wall_s"] for r in ours), min(r["wall_s"] for r in theirs)
    mem = max(r["peak_rss_mb"] for r in ours), max(r["peak_rss_mb"] for r in theirs)
    speedup, mem_ratio = best[1] / best[0], mem[0] / mem[1]
    agree = all(
        abs(ours[0][k] - theirs[0][k]) <= 0.01 * abs(theirs[0][k])
        for k in ("compute_us", "idle_us")
    )
    print()
    print(
        f"speed-up (best wall time): {speedup:.1f}x   target >= 5x   "
        f"{'ok' if speedup >= 5 else 'MISSED'}"
    )
    print(
        f"peak memory ratio: {mem_ratio:.2f}   target <= 0.33   "
        f"{'ok' if mem_ratio <= 1 / 3 else 'MISSED'}"
    )
    print(f"compute and idle time within 1 %: {'yes' if agree else 'NO'}")
    return 0 if speedup >= 5 and mem_ratio <= 1 / 3 and agree else 1


if __name__ == "__main__":
    sys.exit(main())
