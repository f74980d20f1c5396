"""Progress of long waits: the callbacks measurements make, and the bar that shows them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gpudiag._progress import (
    Progress,
    ProgressBar,
    closed_on_error,
    disabled_by_env,
    iterate,
    resolve,
)
from gpudiag.experiment.batch_scaling import batch_scaling
from gpudiag.experiment.compare import compare
from gpudiag.profiling import profile
from tests.experiment.test_batch_fixes import clocked_workload
from tests.experiment.test_compare_fake_clock import fake_step


def _recorder() -> tuple[list[tuple[str, int, int, bool]], Any]:
    events: list[tuple[str, int, int, bool]] = []

    def on_progress(p: Progress) -> None:
        events.append((p.stage, p.done, p.total, p.finished))

    return events, on_progress


def test_profile_reports_each_call_then_finishes(tmp_path: Path) -> None:
    events, on_progress = _recorder()
    model = torch.nn.Linear(8, 8)
    profile(
        lambda: model(torch.ones(2, 8)).sum().backward(),
        steps=2,
        warmup=1,
        wait=1,
        trace_dir=tmp_path,
        on_progress=on_progress,
    )
    assert events[:5] == [
        ("profile", 1, 4, False),
        ("profile", 2, 4, False),
        ("profile", 3, 4, False),
        ("profile", 4, 4, False),
        ("profile", 0, 0, True),
        # then the trace is read (its megabytes) and its one rank analysed
    ]
    read = [e for e in events[5:] if e[0].startswith("reading ") and ".json" in e[0]]
    assert read
    assert read[-1][3]  # the read finished
    assert events[-2:] == [("ranks", 1, 1, False), ("ranks", 0, 0, True)]
    assert len(events) == 5 + len(read) + 2


def test_batch_scaling_that_stops_early_still_finishes(fake_clock: Any) -> None:
    events, on_progress = _recorder()
    wl = clocked_workload(fake_clock, batch_size=64)  # per-sample cost dominates: stops
    s = batch_scaling(wl, rounds=3, stop_below=0.5, clock=fake_clock, on_progress=on_progress)
    assert len(s.rounds) == 1
    assert events == [
        ("batch scaling", 0, 3, False),
        ("batch scaling", 1, 3, False),
        ("batch scaling", 0, 0, True),
    ]


def test_compare_reports_rounds_and_finishes_before_the_round_limit(
    fake_clock: Any, bf16_cpu: Any
) -> None:
    events, on_progress = _recorder()
    c = compare(
        fake_step(fake_clock),
        ["precision.bf16"],
        system=bf16_cpu,
        clock=fake_clock,
        progress=on_progress,
        measure_memory=False,
        steps_per_sample=1,
        min_rounds=5,
        max_rounds=100,
    )
    assert c.rounds == 9  # clear at the first planned look, long before 100 rounds
    rounds = [e for e in events if e[0] == "compare"]
    assert rounds[0] == ("compare", 0, 100, False)
    assert [e[1] for e in rounds[1:-1]] == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert rounds[-1] == ("compare", 0, 0, True)
    assert events[-1] == rounds[-1]


def test_an_early_finish_closes_the_bar_complete() -> None:
    bar = ProgressBar("test")
    bar(Progress("compare", 0, 100))
    bar(Progress("compare", 23, 100, note="faster"))
    tqdm_bar = bar.bar
    assert tqdm_bar is not None
    assert tqdm_bar.n == 23
    bar(Progress("compare", finished=True))
    assert tqdm_bar.n == 100  # filled, not a bar stopped at 23 %
    assert bar.closed_complete == [True]
    assert bar.bar is None


def test_a_finished_bar_is_drawn_once_more_on_close_not_twice(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # In a terminal (or a log without carriage returns) a finished bar was drawn three times:
    # on its last report, by a refresh on close, and by tqdm's own close.
    bar = ProgressBar("test")
    bar(Progress("profile", 2, 3))
    bar(Progress("profile", 3, 3))
    bar(Progress("profile", finished=True))
    assert capsys.readouterr().err.count("3/3") == 2
    bar(Progress("compare", 23, 100))
    bar(Progress("compare", finished=True))  # an early verdict: filled once, by the close
    assert capsys.readouterr().err.count("100/100") == 1
    assert bar.closed_complete == [True, True]


def test_bytes_read_are_shown_scaled_not_as_whole_megabytes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bar = ProgressBar("test")
    bar(Progress("reading trace.json", 150_000, 300_000, unit="B"))
    bar(Progress("reading trace.json", finished=True))
    err = capsys.readouterr().err
    assert "146k/293k" in err  # kibibytes, with tqdm's own prefix
    assert "0it" not in err


def test_a_new_stage_completes_the_previous_bar_and_an_error_leaves_it_where_it_stopped() -> None:
    bar = ProgressBar("test")

    def fails() -> None:
        with bar:
            bar(Progress("profile", 1, 4))
            bar(Progress("batch scaling", 1, 3))
            raise RuntimeError("the step failed")

    with pytest.raises(RuntimeError):
        fails()
    assert bar.closed_complete == [True, False]


def test_a_bar_is_closed_incomplete_when_the_run_fails() -> None:
    bar = resolve(True)
    assert isinstance(bar, ProgressBar)
    assert resolve(False) is None

    def fails() -> None:
        with closed_on_error(bar):
            bar(Progress("compare", 3, 10))
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        fails()
    assert bar.closed_complete == [False]


def test_compare_shows_its_preparation_before_the_rounds(fake_clock: Any, bf16_cpu: Any) -> None:
    events, on_progress = _recorder()
    compare(
        fake_step(fake_clock),
        ["precision.bf16"],
        system=bf16_cpu,
        clock=fake_clock,
        progress=on_progress,
        steps_per_sample=1,
    )
    preparing = [e for e in events if e[0] == "compare: preparing"]
    assert [e[1] for e in preparing] == [0, 1, 2]
    assert events.index(preparing[-1]) < events.index(("compare", 0, 100, False))


def test_tqdm_disable_turns_every_bar_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert disabled_by_env({"TQDM_DISABLE": "1"})
    assert disabled_by_env({"TQDM_DISABLE": "True"})
    assert not disabled_by_env({"TQDM_DISABLE": "0"})
    assert not disabled_by_env({})
    monkeypatch.setenv("TQDM_DISABLE", "1")
    bar = ProgressBar("test")
    bar(Progress("profile", 1, 4))
    assert bar.bar is None
    assert not bar.enabled


def test_iterate_reports_each_item_and_finishes() -> None:
    events, on_progress = _recorder()
    assert list(iterate(["a", "b"], "matmul", on_progress)) == ["a", "b"]
    assert events == [
        ("matmul", 0, 2, False),
        ("matmul", 1, 2, False),
        ("matmul", 2, 2, False),
        ("matmul", 0, 0, True),
    ]


def test_first_occupancy_shows_a_bar_while_plotly_loads() -> None:
    """The first ``%gpudiag occupancy`` imports plotly's widget figure (seconds): a bar says so."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from gpudiag.magics.occupancy import _load_plot_library\n"
        "_load_plot_library()\n"
        "assert 'plotly.basewidget' in sys.modules\n"
    )
    import os

    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])  # this checkout's gpudiag
    err = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    ).stderr
    assert err.count("occupancy loading plotly (first use only)") >= 1
    assert "100%" in err


def test_a_bar_can_be_shown_inside_an_output_widget() -> None:
    """A Try-it button's callback has no cell: its bar goes into the card's Output widget."""
    entered: list[str] = []

    class Output:
        def __enter__(self) -> None:
            entered.append("in")

        def __exit__(self, *exc: object) -> None:
            entered.append("out")

    bar = ProgressBar("Try it", output=Output())
    bar(Progress("compare", 0, 10))
    bar(Progress("compare", 4, 10))  # the same bar: no second display
    bar(Progress("compare", finished=True))
    assert entered == ["in", "out"]
    assert bar.closed_complete == [True]


def test_diagnose_reports_its_profile_then_its_batch_scaling() -> None:
    from gpudiag.doctor import diagnose
    from gpudiag.step import Workload

    events, on_progress = _recorder()
    model = torch.nn.Linear(16, 4)
    workload = Workload(
        model,
        batch=lambda n: torch.randn(n, 16),
        loss=lambda m, b: m(b).square().mean(),
        batch_size=4,
    )
    diagnose(workload, steps=2, progress=on_progress)
    stages = [e[0] for e in events]
    assert stages.index("profile") < stages.index("batch scaling")
    assert [e for e in events if e[0] == "profile"][-1] == ("profile", 0, 0, True)
    assert [e for e in events if e[0] == "batch scaling"][-1] == ("batch scaling", 0, 0, True)
    assert ("profile", 3, 3, False) in events  # one warm-up step and the two profiled


def test_in_a_notebook_an_early_verdict_ends_green_and_a_failure_red(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The widget bar tqdm.auto picks in Jupyter: bar_style 'success' when the verdict came at
    23 of 100 rounds (not 'danger', the red bar of an unfinished run), 'danger' on a failure."""
    import tqdm.auto
    import tqdm.notebook

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setattr(tqdm.auto, "tqdm", tqdm.notebook.tqdm)
    early = ProgressBar("test")
    early(Progress("compare", 23, 100))
    widget = early.bar.container.children[1]
    early(Progress("compare", finished=True))
    assert (widget.bar_style, widget.value, widget.max) == ("success", 100, 100)
    failed = ProgressBar("test")
    failed(Progress("compare", 23, 100))
    widget = failed.bar.container.children[1]
    failed.close(complete=False)
    assert widget.bar_style == "danger"


def _notes(events: list[Progress], stage: str) -> list[str]:
    return [e.note for e in events if e.stage == stage and not e.finished]


def test_memory_names_each_step_it_runs_under_a_budget() -> None:
    import gpudiag as gd
    from gpudiag.workloads import mlp

    events: list[Progress] = []
    workload = mlp.build(batch_size=8, in_features=16, hidden=32)
    fix = gd.Fix("batch.size", micro_batch=2, accumulation=4)
    report = gd.memory(workload, fixes=[fix], budget="64MiB", progress=events.append)
    assert report.oom is None
    assert _notes(events, "step") == [
        "a copy of the model and a warm-up step",
        "a step under the 64.00 MiB budget",
        "a profiled step (memory timeline)",
        "the estimate (traced on fake tensors)",
    ]
    assert [(e.done, e.total) for e in events if not e.finished] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    assert events[-1].finished


def test_memory_that_runs_out_still_finishes_its_report() -> None:
    import gpudiag as gd
    from gpudiag.workloads import mlp

    events: list[Progress] = []
    report = gd.memory(mlp.build(batch_size=64), budget="64KiB", progress=events.append)
    assert report.oom is not None  # a result, explained: the bar moves on to the estimate
    assert _notes(events, "step")[-1] == "the estimate (traced on fake tensors)"
    assert events[-1].finished


def test_estimate_and_fit_report_each_traced_or_measured_step() -> None:
    import gpudiag as gd
    from gpudiag.workloads import mlp

    workload = mlp.build(batch_size=8, in_features=16, hidden=32)
    events: list[Progress] = []
    gd.estimate_memory(workload, progress=events.append)
    assert _notes(events, "traced step") == [
        "two steps on fake tensors at batch 8",
        "two steps on fake tensors at batch 4",
    ]
    assert events[-1].finished
    events.clear()
    gd.fit(workload, memory_budget="1GiB", progress=events.append)
    notes = _notes(events, "step")
    assert notes[:2] == ["the estimate at the workload's batch", "a measured step at micro-batch 8"]
    assert "what-if: bf16 autocast" in notes
    assert "what-if: activation checkpointing" in notes
    assert {e.stage for e in events} == {"step"}  # the nested estimates show no bars of their own
    assert events[-1].finished


def test_analyze_trace_reports_reading_and_analysing() -> None:
    import gpudiag as gd
    from tests.conftest import FIXTURES

    events: list[Progress] = []
    trace = FIXTURES / "traces" / "hta-trace_diff-control.json.gz"
    gd.analyze_trace(trace, progress=events.append)
    stages = [e.stage for e in events]
    reading = f"reading {trace.name}"
    assert reading in stages  # the file's bytes as they are read
    assert stages.index(reading) < stages.index("ranks")  # then each rank analysed
    # Counted in whole megabytes, a file under one showed 0/? to the end (and this one 1/1):
    # in bytes, which the bar scales to kB or MB itself, every read counts.
    size = trace.stat().st_size
    read = [e for e in events if e.stage == reading and not e.finished]
    assert read
    assert {(e.total, e.unit) for e in read} == {(size, "B")}
    assert read[-1].done == size
    assert Progress(reading, finished=True) in events
    assert events[-1] == Progress("ranks", finished=True)


def test_diagnose_reports_its_step_timing_and_its_rules(make_cpu_system: Any) -> None:
    from gpudiag.doctor import diagnose
    from gpudiag.workloads import mlp

    events: list[Progress] = []
    workload = mlp.build(batch_size=8, in_features=16, hidden=32)
    diagnose(
        workload, system=make_cpu_system("avx2"), steps=1, scaling=False, progress=events.append
    )
    stages = [e.stage for e in events]
    assert stages.index("profile") < stages.index("step time") < stages.index("rules")
    assert _notes(events, "rules") == ["running the rules"]  # the bf16 timing happens there
    assert events[-1] == Progress("rules", finished=True)


def test_a_wait_on_other_processes_ticks_in_seconds() -> None:
    import time

    from gpudiag._progress import ticking

    events: list[Progress] = []
    with ticking(events.append, "2 ranks", "torchrun", every_s=0.02):
        time.sleep(0.15)
    assert events[0] == Progress("2 ranks", 0, 0, "torchrun", unit="s")
    assert len(events) >= 3  # the start, at least one tick, the finish
    assert all(e.unit == "s" for e in events[:-1])
    assert events[-1].finished
    bar = ProgressBar("doctor", leave=False)

    def failing_job() -> None:
        with ticking(bar, "2 ranks", every_s=0.02):
            time.sleep(0.05)
            raise RuntimeError("a rank failed")

    with pytest.raises(RuntimeError):
        failing_job()
    time.sleep(0.06)
    # Closed once where it stopped; no tick after that opened another bar.
    assert len(bar.closed_complete) == 1
    assert bar.bar is None


def test_the_distributed_doctor_shows_the_wait_on_its_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    from gpudiag.distributed import launch
    from gpudiag.distributed.run import doctor_job
    from gpudiag.errors import DistributedError

    def slow_failure(*_: Any, **__: Any) -> str:
        time.sleep(0.1)
        raise DistributedError("the 2-rank job failed (exit 1): a rank crashed")

    monkeypatch.setattr(launch, "torchrun", slow_failure)
    events: list[Progress] = []
    with pytest.raises(DistributedError):
        doctor_job(2, progress=events.append)
    assert events[0].stage == "2 ranks"
    assert events[0].unit == "s"
    assert not any(e.finished for e in events)  # it failed: not shown as finished


def test_a_delayed_bar_shows_only_stages_that_outlast_the_delay() -> None:
    now = [0.0]
    bar = ProgressBar("t", delay_s=2.0, clock=lambda: now[0])
    bar(Progress("quick", 1, 3))
    now[0] = 1.0
    bar(Progress("quick", 3, 3))
    assert bar.bar is None  # finished within the delay: never drawn
    bar(Progress("slow", 1, 10))  # starts at 1.0
    now[0] = 2.5
    bar(Progress("slow", 2, 10))
    assert bar.bar is None
    now[0] = 3.5
    bar(Progress("slow", 4, 10))
    assert bar.bar is not None
    assert bar.bar.n == 4
    bar(Progress("slow", finished=True))
    assert bar.bar is None
    assert bar.closed_complete == [True]
