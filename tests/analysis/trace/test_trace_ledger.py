"""The time ledger on real traces: every microsecond of the window on one row, rows that add up
to the window, and busy / idle time that agree with TraceLens' gpu_timeline and Holistic Trace
Analysis' temporal breakdown (tests/fixtures/traces and its SOURCES.md)."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gpudiag.analysis.trace import TraceReport, analyze_trace
from gpudiag.analysis.trace.intervals import length, merge
from gpudiag.analysis.trace.ledger import (
    BUSY,
    COMM_EXPOSED,
    DATALOADER_IDLE,
    IDLE,
    MEMCPY,
    SYNC_IDLE,
    UNEXPLAINED,
    WARMUP_IDLE,
    Ledger,
    rows_sum_to_window,
)
from gpudiag.analysis.trace.load import load_trace
from gpudiag.analysis.trace.model import Kind
from gpudiag.analysis.trace.window import analysis_window, find_steps

Report = Callable[[str], TraceReport]

QWEN = "tracelens-mi300-Qwen_Qwen1.5-0.5B-Chat.json.gz"
RESNET_CKPT = "tracelens-mi300-resnet_act_checkpoint.json.gz"
SGLANG = "tracelens-inference-sglang_Qwen3-8B_prefilldecode.json.gz"
ALEXNET = "hta-critical_path-alexnet-benchmark_result_2869224_1695835535_trace.json.gz"
RESNET_W0 = "kineto-resnet50_num_workers_0-worker0.1623143089861.pt.trace.json.gz"
DLRM_A100 = "hta-negative_queue_length_values_check-rank0.json.gz"
CSVS = "tracelens-reference-csvs"
HTA_TEMPORAL = Path(__file__).parent / "data" / "hta_temporal.json"
WITHIN = 0.01  # of the window


def _all_traces(fixtures: Path) -> list[str]:
    root = fixtures / "traces"
    return sorted(
        p.name
        for p in root.iterdir()
        if (p.is_dir() and any(p.glob("*.json*"))) or p.name.endswith((".json", ".json.gz"))
    )


ALL = _all_traces(Path(__file__).resolve().parents[2] / "fixtures")


@pytest.mark.parametrize("name", ALL)
def test_rows_add_up_to_the_window_on_every_real_trace(report_of: Report, name: str) -> None:
    report = report_of(name)
    pooled = report.ledger()
    for ledger in (*pooled.ranks, pooled):
        assert ledger.window_us > 0
        assert rows_sum_to_window(ledger), (name, ledger.window_us, ledger.rows)
        assert all(r.us > 0 and r.kind in (BUSY, IDLE) for r in ledger.rows)
        assert [r.us for r in ledger.rows] == sorted((r.us for r in ledger.rows), reverse=True)
        assert len({r.bucket for r in ledger.rows}) == len(ledger.rows)  # one row per bucket
    json.dumps(pooled.to_dict())  # JSON-safe, as --json prints it


def _window_work(report: TraceReport, path: Path, include_last_step: bool = False) -> np.ndarray:
    """[start, end) of the window's kernels, memcpy and memset, read from the file itself."""
    trace = load_trace(path)
    ev = trace.events
    window = analysis_window(ev, find_steps(ev), include_last_step=include_last_step)
    work = window.gpu & np.isin(ev.kind, np.array([Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET]))
    return np.stack((ev.ts[work], ev.ts[work] + ev.dur[work]))


@pytest.mark.parametrize("name", [QWEN, RESNET_W0, DLRM_A100, SGLANG])
def test_busy_time_is_the_union_of_the_window_s_gpu_work(
    report_of: Report, traces_dir: Path, name: str
) -> None:
    ledger = report_of(name).ledger()
    spans = _window_work(report_of(name), traces_dir / name)
    assert ledger.busy_us == pytest.approx(length(merge(spans[0], spans[1])), rel=1e-9)
    assert ledger.window_us == pytest.approx(float(spans[1].max() - spans[0].min()), rel=1e-9)


def _tracelens(traces_dir: Path, prefix: str) -> dict[tuple[str, str], float]:
    with open(traces_dir / CSVS / f"{prefix}gpu_timeline.csv", newline="") as fh:
        return {
            (r["type"], r.get("is_recompute") or "False"): float(r["time ms"]) * 1e3
            for r in csv.DictReader(fh)
        }


def test_qwen_one_step_agrees_with_tracelens_gpu_timeline(
    report_of: Report, traces_dir: Path
) -> None:
    # Issue 21, class 8: on a one-step trace the window is the step's own GPU work (33.13 ms,
    # TraceLens' total and the GPU-side ProfilerStep#6 annotation), not the capture (47.09 ms,
    # with 463 kernels queued before the step).
    ledger = report_of(QWEN).ledger()
    ref = _tracelens(traces_dir, "mi300-Qwen__")
    window = ref[("total_time", "False")]
    assert ledger.window_us == pytest.approx(window, abs=WITHIN * window)
    assert ledger.busy_us == pytest.approx(ref[("busy_time", "False")], abs=WITHIN * window)
    assert ledger.idle_us == pytest.approx(ref[("idle_time", "False")], abs=WITHIN * window)
    annotation = load_trace(traces_dir / QWEN).events
    steps = np.flatnonzero(annotation.kind == Kind.GPU_ANNOTATION)
    (gpu_step,) = [r for r in steps if annotation.names[annotation.name[r]] == "ProfilerStep#6"]
    assert ledger.window_us == pytest.approx(float(annotation.dur[gpu_step]), rel=1e-6)


def _recompute_mask(path: Path, include_last_step: bool) -> tuple[np.ndarray, np.ndarray]:
    """The window's GPU work and which of it activation checkpointing recomputed: launched
    inside torch.utils.checkpoint's recompute_fn frame (TraceLens' is_recompute rows)."""
    trace = load_trace(path)
    ev = trace.events
    window = analysis_window(ev, find_steps(ev), include_last_step=include_last_step)
    rows = np.flatnonzero(
        window.gpu & np.isin(ev.kind, np.array([Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET]))
    )
    runtime = np.flatnonzero((ev.kind == Kind.RUNTIME) & (ev.correlation >= 0))
    launch_of = dict(zip(ev.correlation[runtime].tolist(), runtime.tolist(), strict=True))
    launch_ts = np.array([ev.ts[launch_of[c]] for c in ev.correlation[rows].tolist()])
    frames = np.flatnonzero(
        np.isin(ev.name, [i for i, n in enumerate(ev.names) if n.endswith("): recompute_fn")])
    )
    fs, fe = merge(ev.ts[frames], ev.ts[frames] + ev.dur[frames])
    i = np.searchsorted(fs, launch_ts, side="right") - 1
    recompute = (i >= 0) & (launch_ts < fe[np.maximum(i, 0)])
    return np.stack((ev.ts[rows], ev.ts[rows] + ev.dur[rows])), recompute


def test_checkpointing_trace_agrees_with_tracelens_once_recompute_is_split_as_it_splits(
    traces_dir: Path,
) -> None:
    # TraceLens' gpu_timeline for this trace covers every step (the last one too), and with its
    # recompute detection on it draws the recomputed forward apart (is_recompute rows): its
    # idle_time counts the 1.2 ms when only recomputed kernels run. The ledger counts that
    # time busy; taken out again, the two agree within 1 % of the window.
    report = analyze_trace(traces_dir / RESNET_CKPT, include_last_step=True)
    ledger = report.ledger()
    ref = _tracelens(traces_dir, "mi300-resnet_act_checkpoint_recompute__")
    window = ref[("total_time", "False")]
    assert ledger.window_us == pytest.approx(window, abs=WITHIN * window)
    spans, recompute = _recompute_mask(traces_dir / RESNET_CKPT, include_last_step=True)
    assert recompute.any()
    not_recomputed = length(merge(spans[0][~recompute], spans[1][~recompute]))
    recompute_only = ledger.busy_us - not_recomputed
    assert recompute_only > 0.01 * window  # what TraceLens' non-recompute timeline calls idle
    assert not_recomputed == pytest.approx(ref[("busy_time", "False")], abs=WITHIN * window)
    assert ledger.idle_us + recompute_only == pytest.approx(
        ref[("idle_time", "False")], abs=WITHIN * window
    )
    computation = ledger.busy_us - ledger.us(COMM_EXPOSED, MEMCPY)
    tracelens_computation = ref[("computation_time", "False")] + ref[("computation_time", "True")]
    assert computation == pytest.approx(tracelens_computation, abs=WITHIN * window)


def _hta() -> dict[str, list[dict[str, float]] | str]:
    """HTA 0.5.0's temporal breakdown of every fixture (benchmarks/hta_reference.py
    --temporal), per rank; a string where HTA could not read the trace."""
    found: dict[str, list[dict[str, float]] | str] = json.loads(HTA_TEMPORAL.read_text())[
        "fixtures"
    ]
    return found


def test_hta_reads_most_fixtures() -> None:
    refs = _hta()
    assert sum(isinstance(v, list) for v in refs.values()) >= 17
    assert set(refs) == set(ALL)


@pytest.mark.parametrize("name", [n for n, v in sorted(_hta().items()) if isinstance(v, list)])
def test_busy_and_idle_agree_with_hta_temporal_breakdown(report_of: Report, name: str) -> None:
    # Where the windows are the same (several steps, the last left out; or no steps, the whole
    # capture) busy and idle agree within 1 % of the window. HTA counts the GPU's cuda_sync
    # events as busy and into its span; the ledger counts kernels, memcpy and memset only (as
    # TraceLens does): on AlexNet a sync event 75 ms past the last kernel makes 0.6 %. With one
    # step HTA takes the whole capture; the ledger takes the step's own GPU work (class 8), a
    # part of it.
    report = report_of(name)
    rows = _hta()[name]
    assert isinstance(rows, list)
    for ref in rows:
        ledger = report.ledger(int(ref["rank"]))
        if len(report.rank(int(ref["rank"])).steps) == 1:
            assert ledger.window_us <= ref["span_us"] + 1e-6
            continue
        busy = ref["compute_us"] + ref["non_compute_us"]
        assert ledger.busy_us == pytest.approx(busy, abs=WITHIN * ledger.window_us)
        assert ledger.idle_us == pytest.approx(ref["idle_us"], abs=WITHIN * ledger.window_us)


def test_most_real_traces_leave_under_5_percent_unexplained(report_of: Report) -> None:
    shares = {n: report_of(n).ledger().share(UNEXPLAINED) for n in ALL}
    assert sum(s < 0.05 for s in shares.values()) >= 0.8 * len(shares), shares


def test_a_host_copy_with_nothing_queued_is_the_sync_row(report_of: Report) -> None:
    # Issue 21, class 2: SGLang blocks 493 ms in a host copy (hipMemcpyWithStream in
    # aten::copy_) while the GPU has nothing queued. That idle time is the wait's, not nobody's.
    ledger = report_of(SGLANG).ledger()
    row = ledger.row(SYNC_IDLE)
    assert row is not None
    assert ledger.share(SYNC_IDLE) > 0.45
    assert row.host_events[0][0].startswith("hipMemcpyWithStream in aten::copy_")


def test_a_warm_up_capture_puts_its_time_on_the_warm_up_row(report_of: Report) -> None:
    # Issue 21, class 1: the AlexNet capture is the benchmark's warm-up (its annotation says
    # so, cudaFree / cudaMalloc initialise): the GPU idles 99 % of it.
    ledger = report_of(ALEXNET).ledger()
    assert ledger.rows[0].bucket == WARMUP_IDLE
    assert ledger.share(WARMUP_IDLE) > 0.95
    behind = dict(ledger.rows[0].host_events)
    assert any("warmup" in name for name in behind)
    assert "cudaFree" in behind


def test_the_dataloader_row_needs_no_profiler_steps(traces_dir: Path, tmp_path: Path) -> None:
    # Issue 21, class 3: the DataLoader's wait is found from its own events: with the
    # ProfilerStep ranges taken out of the real trace, the whole capture is the window and the
    # DataLoader still holds its share of it.
    import gzip

    data = json.loads(gzip.decompress((traces_dir / RESNET_W0).read_bytes()))
    data["traceEvents"] = [
        e for e in data["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    path = tmp_path / "resnet50_without_steps.json"
    path.write_text(json.dumps(data))
    report = analyze_trace(path)
    assert not report.steps()
    ledger = report.ledger()
    assert "no ProfilerStep" in ledger.window
    assert ledger.share(DATALOADER_IDLE) > 0.2


def test_pooled_ledger_sums_the_ranks(report_of: Report) -> None:
    report = report_of("param-dlrm-8rank-v100")
    pooled = report.ledger()
    assert len(pooled.ranks) == 8
    assert pooled.window_us == pytest.approx(sum(r.window_us for r in pooled.ranks))
    for row in pooled.rows:
        parts = [r.us(row.bucket) for r in pooled.ranks]
        assert row.us == pytest.approx(sum(parts))
    one = report.ledger(3)
    assert one.rank == 3
    assert one.window_us == pytest.approx(pooled.ranks[3].window_us)


def test_ledger_text_and_figure_say_the_same(report_of: Report) -> None:
    ledger = report_of(RESNET_W0).ledger()
    lines = ledger.lines()
    assert "where the time goes" in lines[0]
    assert ledger.rows[0].label in lines[1]
    figure = ledger.plot()
    (bars,) = figure.data
    assert list(bars.y)[::-1] == [r.label for r in ledger.rows]
    assert sum(bars.x) == pytest.approx(100.0)


def test_a_trace_without_gpu_work_has_an_empty_ledger(traces_dir: Path) -> None:
    cpu = traces_dir.parent / "recorded" / "cpu-host-epyc-2core" / "traces" / "gpt.pt.trace.json.gz"
    ledger = analyze_trace(cpu).ledger()
    assert isinstance(ledger, Ledger)
    assert ledger.window_us == 0
    assert ledger.rows == ()


def test_a_kernel_s_first_launch_that_loads_its_module_is_warm_up(report_of: Report) -> None:
    # The MI250 toy trace profiles its first step: one hipLaunchKernel takes 6.5 ms loading
    # the kernel's code object while the GPU idles. A later long launch (the launch queue full,
    # 37 ms in a step of the A100 DLRM trace) is not warm-up.
    toy = report_of("hta-amd_trace-mi250_minitoy_train_ROCm6_2_kineto.json.gz").ledger()
    assert toy.rows[0].bucket == WARMUP_IDLE
    assert toy.rows[0].host_events[0][0] == "hipLaunchKernel"
    assert toy.share(WARMUP_IDLE) > 0.7
    assert report_of(DLRM_A100).ledger().us(WARMUP_IDLE) == 0.0
