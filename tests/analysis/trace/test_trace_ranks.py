"""Several ranks of one job: communication overlap per rank and pooled, and two jobs refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudiag.analysis.trace import TraceReport, analyze_trace
from gpudiag.errors import TraceError
from gpudiag.rules.engine import EvidenceBundle, run_rules
from tests.analysis.trace.conftest import A100, A100_CONTROL, V100_TEST, TraceBuilder

DLRM_8_RANKS = "param-dlrm-8rank-v100"

_CACHE: dict[str, TraceReport] = {}


def _report(traces_dir: Path, name: str) -> TraceReport:
    if name not in _CACHE:
        _CACHE[name] = analyze_trace(traces_dir / name)
    return _CACHE[name]


def test_overlap_per_rank_and_pooled_on_the_8_rank_v100_job(traces_dir: Path) -> None:
    report = _report(traces_dir, DLRM_8_RANKS)
    rows = report.communication_by_rank()
    assert [r.rank for r in rows] == list(range(8))
    pooled = report.communication()
    assert pooled is not None
    assert pooled.rank is None
    assert pooled.ranks == 8
    assert pooled.label == "8 ranks pooled"
    assert pooled.total_us == pytest.approx(sum(r.total_us for r in rows))
    assert pooled.exposed_us == pytest.approx(sum(r.exposed_us for r in rows))
    for r in rows:  # exposed = total x (1 - overlap), on every rank
        assert r.overlap is not None
        assert r.total_share is not None
        assert r.total_share * (1 - r.overlap) == pytest.approx(r.exposed_share)
        assert report.communication(r.rank) == r
    # The ranks differ a lot: rank 0's figure is not the job's.
    shares = sorted(r.exposed_share or 0.0 for r in rows)
    assert shares[-1] > 2 * shares[0]
    rank0 = report.communication(0)
    assert rank0 is not None
    assert rank0.exposed_share != pytest.approx(pooled.exposed_share)


def test_exposed_finding_on_8_ranks_is_labelled_pooled(traces_dir: Path) -> None:
    report = _report(traces_dir, DLRM_8_RANKS)
    diagnosis = run_rules(EvidenceBundle(trace=report, env={}), only=["comm.exposed"])
    (finding,) = diagnosis.findings
    pooled = report.communication()
    assert pooled is not None
    values = {e.name: e.value for e in finding.evidence}
    assert values["exposed communication (8 ranks pooled)"] == pytest.approx(
        round(100 * (pooled.exposed_share or 0), 1)
    )
    assert finding.estimated_gain == pytest.approx(pooled.exposed_share)
    assert "8 ranks pooled" in finding.message
    most = max(report.communication_by_rank(), key=lambda r: r.exposed_share or 0.0)
    assert values["exposed communication, most exposed rank"].endswith(f"(rank {most.rank})")


def test_two_unrelated_jobs_are_refused(traces_dir: Path) -> None:
    with pytest.raises(TraceError, match="different jobs"):
        analyze_trace([traces_dir / A100_CONTROL, traces_dir / V100_TEST])


def test_same_world_size_on_different_gpus_is_refused(tmp_path: Path) -> None:
    h100 = {**A100, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9}
    paths = []
    for rank, gpu in enumerate((A100, h100)):
        tb = TraceBuilder()
        tb.launch(ts=0, start=5, dur=100)
        doc_path = tmp_path / f"rank{rank}.json"
        tb.write(doc_path, distributedInfo={"rank": rank, "world_size": 2}, deviceProperties=[gpu])
        paths.append(doc_path)
    with pytest.raises(TraceError, match="different GPU models") as info:
        analyze_trace(paths)
    assert "H100" in str(info.value)
    assert "A100" in str(info.value)


def test_late_rank_on_the_8_rank_v100_job(traces_dir: Path) -> None:
    # Rank 7 starts 5 of the 8 collectives last (7.6 ms after rank 1 at the first all_to_all)
    # with no more GPU work than the others: they wait for its host, not its GPU.
    report = _report(traces_dir, DLRM_8_RANKS)
    diagnosis = run_rules(EvidenceBundle(trace=report, env={}), only=["comm.late_rank"])
    (finding,) = diagnosis.findings
    assert finding.message.startswith("rank 7 starts 5 of 8 collectives last")
    assert "host side" in finding.message
    late = report.collectives().waited_for
    assert late is not None
    assert late.rank == 7
    values = {e.name: e.value for e in finding.evidence}
    assert values["rank 7 later than the others' median start"] == pytest.approx(
        round(late.lateness_us / 1000, 2)
    )
    assert finding.estimated_gain is not None
    assert 0.05 < finding.estimated_gain < 1.0


def test_no_late_rank_on_the_pair_of_128(traces_dir: Path) -> None:
    # Rank 1 starts last at the 4 matched calls, but 27 ms late over a 607 ms step is < 5 %.
    report = _report(traces_dir, "hta-trace_filter-2of128-ranks")
    diagnosis = run_rules(EvidenceBundle(trace=report, env={}), only=["comm.late_rank"])
    assert diagnosis.findings == ()


def test_report_headline_names_exposed_and_total_communication(traces_dir: Path) -> None:
    report = _report(traces_dir, DLRM_8_RANKS)
    pooled = report.communication()
    assert pooled is not None
    text = repr(report)
    assert "communication, no compute alongside (exposed)" in text
    assert f"communication kernels in all, 8 ranks pooled: {pooled.total_us / 1000:.2f} ms" in text
    assert "&lt;" not in text
    assert "communication kernels in all, 8 ranks pooled" in report._repr_html_()


def test_more_gpu_work_is_not_called_waited_for_when_the_collectives_say_otherwise(
    traces_dir: Path,
) -> None:
    # Ranks 1, 3 and 4 run 5 %+ more GPU work than the median, but start 0, 0 and 1 of the 8
    # collectives last: the others do not wait for them at every collective.
    report = _report(traces_dir, DLRM_8_RANKS)
    assert report.stragglers == (1, 3, 4)
    diagnosis = run_rules(EvidenceBundle(trace=report, env={}), only=["steps.stragglers"])
    (finding,) = diagnosis.findings
    assert finding.severity.value == "low"
    assert "seldom wait for them (they start 0, 0, 1 of 8 last" in finding.message
    values = {e.name: e.value for e in finding.evidence}
    assert values["rank 1 started last"] == 0
    assert values["rank 4 started last"] == 1


def test_a_straggler_that_starts_the_collectives_last_stays_medium(tmp_path: Path) -> None:
    paths = []
    for rank, work in enumerate((100.0, 102.0, 140.0, 99.0)):
        tb = TraceBuilder()
        for n, s in enumerate((0, 500, 1000)):
            tb.step(n + 1, s, 500)
            tb.launch(ts=s + 1, start=s + 10, dur=work)
            wait = 150.0 - work  # the others wait in the all-reduce for the slow rank
            tb.launch(ts=s + 2, start=s + 10 + work, dur=wait + 20, name="ncclKernel_AllReduce_x")
        paths.append(
            tb.write(tmp_path / f"rank{rank}.json", distributedInfo={"rank": rank, "world_size": 4})
        )
    report = analyze_trace(paths, include_last_step=True)
    assert report.stragglers == (2,)
    diagnosis = run_rules(EvidenceBundle(trace=report, env={}), only=["steps.stragglers"])
    (finding,) = diagnosis.findings
    assert finding.severity.value == "medium"
    assert finding.message.endswith("(they start 3 of 3 collectives last)")
