"""Builds the multi-GB Kineto traces the scale benchmarks read, from a real fixture trace.

    python benchmarks/big_traces.py [--copies 50 160] [--gzip] [--folder benchmarks/big-traces]

Each trace is a real one (``hta-trace_diff-control.json.gz``: 109,123 events of rank 3 of an
8-GPU A100 job) replicated end to end ``--copies`` times: every copy is shifted past the last
one in time, with fresh correlation / external ids and step numbers, so the result reads as one
long run (what ``make_big_trace`` writes). 50 copies are 5.46 M events and 1.55 GB of JSON; 160
copies are 17.5 M events and 4.97 GB. The files go to ``benchmarks/big-traces/`` (git ignores
it) as ``control-x50.json`` etc.; an existing file of the right name is kept.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import time
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "traces"
DEFAULT_SOURCE = FIXTURES / "hta-trace_diff-control.json.gz"
DEFAULT_FOLDER = REPO / "benchmarks" / "big-traces"
_STEP = re.compile(r"ProfilerStep#(\d+)")
_ID_KEYS = ("correlation", "External id", "external id")


def make_big_trace(source: Path, copies: int, out: Path) -> int:
    """Write ``source`` with its events repeated ``copies`` times (gzipped when ``out`` ends
    in ``.gz``); return the event count."""
    with gzip.open(source, "rt") as fh:
        doc = json.load(fh)
    events = doc.pop("traceEvents")
    fixed = [e for e in events if e.get("ph") == "M" or e.get("cat") == "Trace"]
    timed = [e for e in events if not (e.get("ph") == "M" or e.get("cat") == "Trace")]
    timed = [e for e in timed if isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + e.get("dur", 0) for e in timed)
    span = t1 - t0 + 1000
    ids = [e["id"] for e in timed if isinstance(e.get("id"), int)]
    for e in timed:
        args = e.get("args", {})
        ids += [args[k] for k in _ID_KEYS if isinstance(args.get(k), int)]
    id_span = max(ids, default=0) + 1
    steps = [int(m.group(1)) for e in timed if (m := _STEP.match(e.get("name", "")))]
    step_span = max(steps) - min(steps) + 1 if steps else 0
    count = len(fixed)
    tmp = out.with_name(out.name + ".part")
    opened: IO[str] = (
        gzip.open(tmp, "wt", compresslevel=6)  # noqa: SIM115 - the with below closes it
        if out.name.endswith(".gz")
        else open(tmp, "w", encoding="utf-8")  # noqa: SIM115
    )
    with opened as fh:
        fh.write(json.dumps(doc)[:-1] + ', "traceEvents": [\n')
        fh.write(",\n".join(json.dumps(e) for e in fixed))
        for k in range(copies):
            for e in timed:
                e2 = dict(e)
                e2["ts"] = e["ts"] + k * span
                if isinstance(e2.get("id"), int):
                    e2["id"] += k * id_span
                if "args" in e:
                    args = dict(e["args"])
                    for key in _ID_KEYS:
                        if isinstance(args.get(key), int) and args[key] > 0:
                            args[key] += k * id_span
                    if "external ts" in args:
                        args["external ts"] += k * span
                    e2["args"] = args
                m = _STEP.match(e2.get("name", ""))
                if m and k:
                    e2["name"] = f"ProfilerStep#{int(m.group(1)) + k * step_span}"
                fh.write(",\n" + json.dumps(e2))
                count += 1
        fh.write("\n]}\n")
    tmp.replace(out)
    return count


def big_trace(copies: int, *, gz: bool = False, folder: Path = DEFAULT_FOLDER) -> Path:
    """The path of the ``copies``-fold trace, built first when it is not there yet."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"control-x{copies}.json{'.gz' if gz else ''}"
    if not out.exists():
        t = time.perf_counter()
        n = make_big_trace(DEFAULT_SOURCE, copies, out)
        print(
            f"built {out} in {time.perf_counter() - t:.0f} s: {n:,} events, "
            f"{out.stat().st_size / 1e9:.2f} GB",
            flush=True,
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, nargs="+", default=[50, 160])
    parser.add_argument("--gzip", action="store_true", help="write .json.gz instead")
    parser.add_argument("--folder", type=Path, default=DEFAULT_FOLDER)
    args = parser.parse_args(argv)
    for copies in args.copies:
        path = big_trace(copies, gz=args.gzip, folder=args.folder)
        print(f"{path}: {path.stat().st_size / 1e9:.2f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
