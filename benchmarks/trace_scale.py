"""gd.analyze_trace on multi-GB traces: time, CPU time and peak memory, beside the I/O floor.

    python benchmarks/trace_scale.py [--copies 50 160] [--repeat 1] [--before OLD_CHECKOUT]
                                     [--gzip]

The traces are a real A100 trace (``hta-trace_diff-control.json.gz``, 109 k events) replicated
end to end (``benchmarks/big_traces.py`` builds them into ``benchmarks/big-traces/``, ignored by
git): 50 copies are 1.56 GB of JSON and 5.45 M events, 160 copies 4.97 GB and 17.5 M events.
For each trace, in turn and in fresh processes:

* I/O floor: the file's bytes read in 8 MB blocks and dropped (gunzipped too with ``--gzip``):
  no tool that reads the file can be faster;
* gpudiag: ``analyze_trace(path, progress=False)`` (decode + every analysis of the report);
* before (with ``--before DIR``): the same in a checkout of an older gpudiag (its root folder),
  the way the numbers before a change are taken.

Wall time is from process start to exit, imports included; CPU time is user + system; peak RSS
is the process's high-water mark (``wait4`` rusage), all read from the child's rusage. The
machine is shared: the load average before and after is printed, and the figures to compare
are those of one run (one table). Targets: the 1.56 GB trace in at most 8 s and 400 MB; any
size in bounded memory.

Measured on the 2-core, 24 GiB development machine (Python 3.11, msgspec 0.22), ``--before``
the checkout this file was added to (af1baaa). In a quiet moment (load average 0.5-1.7 on 2
cores), gpudiag at c3f98e8:

    trace                     GB       tool   wall s   CPU s  peak RSS MB
    control-x50.json        1.56  I/O floor      1.2     0.9          nan
    control-x50.json        1.56     before     21.5    21.3          940
    control-x50.json        1.56    gpudiag      9.1     9.2          452
    control-x160.json       5.00  I/O floor      3.8     1.8          nan
    control-x160.json       5.00    gpudiag     35.1    34.4         1323

The 5 GB trace before, in a busy moment (load average 11-13, so wall time is 3.4x the CPU
time): 454.8 s wall, 134.3 s CPU, 2916 MB (gpudiag at 4b85fba in the same run: 152.0 s,
44.2 s CPU, 1336 MB). Both reports agree on every figure the table checks (events, compute
and idle time). Memory grows with the events kept (about 72 bytes each at the peak, the
interpreter included, 38 in the columns), not with the file's bytes (290 bytes an event here).

Later, ``--copies 50 --repeat 2 --before`` da89219 (where this round began), on a busy
machine (load average 7-9.5 on 2 cores, so wall time is 2-3x the CPU time), gpudiag at
3fdb97f:

    trace                     GB       tool   wall s   CPU s  peak RSS MB
    control-x50.json        1.56     before     18.7     9.0          455
    control-x50.json        1.56    gpudiag     21.4     9.1          391
    control-x50.json        1.56     before     29.7     9.9          457
    control-x50.json        1.56    gpudiag     28.5     9.6          392

The 400 MB target is met (narrower id columns, intermediates freed earlier). The 8 s target
is not: the CPU time alone is about 9 s, of which decoding the JSON into msgspec structs and
moving their fields into columns is about two thirds (cProfile).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from big_traces import DEFAULT_FOLDER, big_trace

FLOOR_CHILD = """
import sys, zlib
path = sys.argv[1]
n = 0
with open(path, "rb") as fh:
    first = fh.read(8 << 20)
    if first[:2] == b"\\x1f\\x8b":
        inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
        data = first
        while data:
            n += len(inflater.decompress(data))
            data = fh.read(8 << 20)
    else:
        data = first
        while data:
            n += len(data)
            data = fh.read(8 << 20)
print('{"text_bytes": %d}' % n)
"""

GPUDIAG_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import gpudiag
from gpudiag.analysis.trace import analyze_trace
kw = {} if len(sys.argv) < 3 else {"progress": False}
r = analyze_trace(sys.argv[1], **kw)
b = r.time_breakdown()
print(json.dumps({"events": r.ranks[0].events, "compute_us": b["compute_us"],
    "idle_us": b["idle_us"], "kernels": len(r.kernels()), "gpudiag": gpudiag.__file__}))
"""


def measured(code: str, args: list[str], pythonpath: str | None = None) -> dict[str, Any]:
    """Run ``code`` in a fresh process: its JSON line, wall time, CPU time and peak RSS (its
    own ``wait4`` rusage)."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        # Not in the checkout: "python -c" puts the working folder first on sys.path, which
        # would shadow the older gpudiag given by PYTHONPATH.
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdout=out,
            stderr=err,
            cwd=tempfile.gettempdir(),
            env=env,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"child failed ({proc.returncode}):\n{err.read()[-3000:]!r}")
        result: dict[str, Any] = json.loads(out.read().decode().strip().splitlines()[-1])
    result["wall_s"] = wall
    result["cpu_s"] = usage.ru_utime + usage.ru_stime
    result["peak_rss_mb"] = usage.ru_maxrss / 1024  # KiB on Linux
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, nargs="+", default=[50, 160])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--before", type=Path, default=None, help="root of an older checkout")
    parser.add_argument("--gzip", action="store_true", help="the .json.gz traces instead")
    parser.add_argument("--folder", type=Path, default=DEFAULT_FOLDER)
    args = parser.parse_args(argv)
    traces = [big_trace(c, gz=args.gzip, folder=args.folder) for c in args.copies]
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    rows: list[tuple[str, str, dict[str, Any]]] = []
    for _ in range(args.repeat):
        for trace in traces:
            rows.append((trace.name, "I/O floor", measured(FLOOR_CHILD, [str(trace)])))
            if args.before is not None:
                rows.append(
                    (trace.name, "before", measured(GPUDIAG_CHILD, [str(trace)], str(args.before)))
                )
            rows.append((trace.name, "gpudiag", measured(GPUDIAG_CHILD, [str(trace), "quiet"])))
            print(f"  done {trace.name}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    print()
    print(f"{'trace':<22}{'GB':>6}{'tool':>11}{'wall s':>9}{'CPU s':>8}{'peak RSS MB':>13}")
    for name, tool, r in rows:
        size = (args.folder / name).stat().st_size / 1e9
        print(
            f"{name:<22}{size:>6.2f}{tool:>11}{r['wall_s']:>9.1f}{r['cpu_s']:>8.1f}"
            f"{r['peak_rss_mb'] if tool != 'I/O floor' else float('nan'):>13.0f}"
        )
    for tool in ("before", "gpudiag"):
        where = {r["gpudiag"] for _, t, r in rows if t == tool}
        if where:
            print(f"{tool}: gpudiag from {', '.join(sorted(where))}")
    ours = [r for _, tool, r in rows if tool == "gpudiag"]
    same = {(r["events"], r["compute_us"], r["idle_us"]) for r in ours[: len(traces)]}
    print(f"\nresults per trace: {sorted(same)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
