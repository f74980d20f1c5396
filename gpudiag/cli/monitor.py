"""Watch GPUs live in the terminal (the host when there is none; --replay plays a recording)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any, TextIO

import numpy as np

from gpudiag._report import jsonable
from gpudiag._values import arg_float
from gpudiag.commands.monitor import add_arguments as _add_shared_arguments
from gpudiag.commands.monitor import start
from gpudiag.errors import GpuDiagError
from gpudiag.monitoring import Monitor
from gpudiag.monitoring.metrics import DEFAULT_GPU_METRICS, DEFAULT_HOST_METRICS, metric_spec
from gpudiag.monitoring.sampler import format_value

CLEAR = "\x1b[H\x1b[2J"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_shared_arguments(parser)
    parser.add_argument(
        "--duration",
        type=arg_float(0, 10 * 86_400, low_open=True),
        metavar="S",
        help="stop after S seconds (default: until Ctrl-C; 5 s with --json)",
    )
    parser.add_argument(
        "--refresh",
        type=arg_float(),
        default=1.0,
        metavar="S",
        help="seconds between table redraws",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the summary and the samples as JSON at the end"
    )


def _columns(m: Monitor) -> list[str]:
    present = {s.metric for s in m.series}
    host = all(d.kind == "host" for d in m.devices)
    return [k for k in (DEFAULT_HOST_METRICS if host else DEFAULT_GPU_METRICS) if k in present]


def render_table(m: Monitor) -> str:
    """The latest sample as a text table: one row per device, the headline metrics as columns,
    then why any of them is N/A."""
    latest = m.ring.latest()
    columns = _columns(m)
    header = ["device", *(metric_spec(c).label for c in columns)]
    rows: list[list[str]] = []
    na = m.na_reasons()
    notes = m.notes_by_series()
    reasons: dict[str, str] = {}
    rough = False
    values = latest[1] if latest is not None else np.full(len(m.series), math.nan)
    for device in m.devices:
        row = [device.label]
        for metric in columns:
            idx = [
                i for i, s in enumerate(m.series) if s.device == device.id and s.metric == metric
            ]
            cells = [float(values[i]) for i in idx if math.isfinite(values[i])]
            unit = m.unit(m.series[idx[0]]) if idx else ""
            if not cells:
                row.append("N/A")
                for i in idx:
                    if m.series[i] in na:
                        reasons.setdefault(metric_spec(metric).label, na[m.series[i]][1])
            elif len(cells) == 1:
                # "~": an estimate from a proxy counter (see the note under the table).
                mark = "~" if any("rough" in notes.get(m.series[i], "") for i in idx) else ""
                rough = rough or bool(mark)
                row.append(mark + format_value(cells[0], unit))
            else:
                row.append(f"{format_value(sum(cells) / len(cells), unit)} avg")
        rows.append(row)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [m.status_line()]
    lines += ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    for device_id, event in m.throttled_since().items():
        since = time.strftime("%H:%M:%S", time.localtime(event.since))
        lines.append(f"throttled since {since}: {device_id} ({', '.join(event.reasons)})")
    if rough:
        lines.append("~ rough: memory-controller utilization x peak (no DRAM-active counter)")
    for label, reason in reasons.items():
        lines.append(f"N/A {label}: {reason}")
    return "\n".join(lines)


def samples_json(m: Monitor) -> dict[str, Any]:
    t, v = m.ring.last()
    values = [[None if not math.isfinite(x) else float(x) for x in row] for row in v.tolist()]
    return {
        "time": t.tolist(),
        "series": [s.to_list() for s in m.series],
        "units": [m.unit(s) for s in m.series],
        "values": values,
    }


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    stream = out or sys.stdout
    if args.refresh <= 0:
        raise GpuDiagError("--refresh must be a positive number of seconds")
    duration = args.duration if args.duration is not None else (5.0 if args.json else None)
    m = start(args, display=False)
    live = stream.isatty() and not args.json
    started = time.monotonic()
    try:
        while m.running:
            left = None if duration is None else duration - (time.monotonic() - started)
            if left is not None and left <= 0:
                break
            time.sleep(args.refresh if left is None else min(args.refresh, left))
            if not args.json:
                table = render_table(m)
                stream.write((CLEAR + table if live else table + "\n") + "\n")
                stream.flush()
    except KeyboardInterrupt:
        pass  # Ctrl-C ends the watch; the summary still follows
    finally:
        m.stop()
    summary = m.summary()
    if args.json:
        payload = {"monitor": m.to_dict(), "summary": summary.to_dict(), "samples": samples_json(m)}
        stream.write(json.dumps(jsonable(payload)) + "\n")
    else:
        stream.write(repr(summary) + "\n")
    return 0 if m.error is None else 1
