"""gpudiag's trace numbers agree with Holistic Trace Analysis' within 1 % on the fixtures.

The reference numbers are HTA 0.5.0's own output on the same files, recorded by
``benchmarks/hta_reference.py`` (see its docstring for the options). When ``hta`` is
importable, one fixture is also compared against a live HTA run.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpudiag.analysis.trace import TraceReport, analyze_trace

REFERENCE = Path(__file__).parent / "data" / "hta_reference.json"
TOLERANCE = 0.01
# cuda_sync events: HTA puts some in its kernel table (as COMPUTATION); gpudiag counts them
# as "sync" time, not as kernels.
GPU_SYNC_NAMES = {"Stream Wait Event", "Stream Sync", "Context Sync", "Event Sync"}
# Traces with fractional-microsecond timestamps (nanosecond resolution).
NS_RESOLUTION = {"hta-nccl_parser_config-nccl_data.json.gz"}
HTA_TYPES = {"COMPUTATION": "compute", "COMMUNICATION": "communication", "MEMORY": "memory"}


def _reference() -> dict[str, Any]:
    return json.loads(REFERENCE.read_text())["fixtures"]


FIXTURES = sorted(_reference())


def close(ours: float, theirs: float, *, floor: float = 1.0) -> bool:
    """Within 1 % of HTA's value (``floor`` us of slack for values near zero)."""
    return abs(ours - theirs) <= max(TOLERANCE * abs(theirs), floor)


@pytest.fixture(scope="module")
def reports(fixtures_dir: Path) -> dict[str, TraceReport]:
    return {name: analyze_trace(fixtures_dir / "traces" / name) for name in FIXTURES}


@pytest.mark.parametrize("name", FIXTURES)
def test_temporal_breakdown_matches_hta(reports: dict[str, TraceReport], name: str) -> None:
    ref = _reference()[name]["temporal"]
    b = reports[name].time_breakdown()
    assert close(b["span_us"], ref["span_us"])
    assert close(b["compute_us"], ref["compute_us"])
    assert close(b["idle_us"], ref["idle_us"])
    non_compute = b["communication_us"] + b["memory_us"] + b["sync_us"]
    assert close(non_compute, ref["non_compute_us"])


@pytest.mark.parametrize("name", FIXTURES)
def test_kernel_type_breakdown_matches_hta(reports: dict[str, TraceReport], name: str) -> None:
    ours = reports[name].rank().busy_by_category_set
    for label, theirs in _reference()[name]["kernel_types_us"].items():
        key = "+".join(HTA_TYPES[part] for part in label.split(" overlapping "))
        if name in NS_RESOLUTION:
            # HTA truncates every overlap segment to whole microseconds (astype(int)), so on
            # a trace with fractional timestamps its figures can only come out lower.
            assert ours.get(key, 0.0) >= theirs - 1.0, (label, ours.get(key), theirs)
        else:
            assert close(ours.get(key, 0.0), theirs), (label, ours.get(key), theirs)


@pytest.mark.parametrize("name", FIXTURES)
def test_kernel_breakdown_matches_hta(reports: dict[str, TraceReport], name: str) -> None:
    ours = {k.name: k for k in reports[name].kernels()}
    compared = 0
    for ref in _reference()[name]["top_kernels"]:
        if ref["name"] in GPU_SYNC_NAMES:
            assert ref["name"] not in ours
            continue
        k = ours[ref["name"]]
        assert close(k.total_us, ref["sum_us"]), ref["name"]
        assert k.count == ref["count"], ref["name"]
        assert close(k.mean_us, ref["mean_us"], floor=0.01), ref["name"]
        assert k.category == HTA_TYPES[ref["type"]]
        compared += 1
    assert compared >= min(10, len(ours))


@pytest.mark.parametrize("name", FIXTURES)
def test_idle_time_breakdown_matches_hta(reports: dict[str, TraceReport], name: str) -> None:
    ref = _reference()[name]["idle_by_stream_us"]
    ours = {str(s.stream): s for s in reports[name].idle_breakdown()}
    assert set(ours) == set(ref)
    for stream, cats in ref.items():
        s = ours[stream]
        assert close(s.host_wait_us, cats.get("host_wait", 0.0)), stream
        assert close(s.kernel_wait_us, cats.get("kernel_wait", 0.0)), stream
        assert close(s.other_us, cats.get("other", 0.0)), stream


def test_live_hta_agrees_when_installed(fixtures_dir: Path, tmp_path: Path) -> None:
    hta = pytest.importorskip("hta.trace_analysis")
    name = "kineto-resnet50_num_workers_4-worker0.1623213129365.pt.trace.json.gz"
    shutil.copy(fixtures_dir / "traces" / name, tmp_path / name)
    os.environ.setdefault("HTA_DISABLE_NS_ROUNDING", "1")
    logging.disable(logging.WARNING)
    try:
        ta = hta.TraceAnalysis(trace_dir=str(tmp_path))
        theirs = ta.get_temporal_breakdown(visualize=False).iloc[0]
    finally:
        logging.disable(logging.NOTSET)
    ours = analyze_trace(tmp_path / name).time_breakdown()
    assert close(ours["compute_us"], float(theirs["compute_time(us)"]))
    assert close(ours["idle_us"], float(theirs["idle_time(us)"]))
