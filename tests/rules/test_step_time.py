"""The diagnosis (and its card) gives the step's own time, measured without the profiler, and
says the profiled step's time is something else."""

from __future__ import annotations

from typing import Any

import pytest

from gpudiag._progress import Progress
from gpudiag.doctor import diagnose
from gpudiag.experiment.batch_scaling import BatchScaling
from gpudiag.workloads import mlp
from tests.conftest import FIXTURES

TRACE = FIXTURES / "traces" / "hta-trace_diff-control.json.gz"


@pytest.fixture
def cpu(make_cpu_system: Any) -> Any:
    """A CPU without bf16 instructions: no bf16 micro-benchmark runs in these diagnoses."""
    return make_cpu_system("avx2", "avx512f")


def _workload() -> Any:
    return mlp.build(batch_size=8, in_features=16, hidden=32)


def test_without_batch_scaling_the_step_is_timed_without_the_profiler(cpu: Any) -> None:
    events: list[Progress] = []
    diagnosis = diagnose(
        _workload(), system=cpu, steps=1, env={}, scaling=False, progress=events.append
    )
    timed = diagnosis.step_time
    assert timed is not None
    assert timed.seconds is not None
    assert timed.seconds > 0
    assert timed.source.startswith("without the profiler (median of 3 steps after a warm-up; IQR ")
    assert timed.source.endswith("% of the median)")
    assert timed.profiled_s is not None
    assert timed.profiled_s > 0
    text = repr(diagnosis).splitlines()[1]
    assert text.startswith("  step time ")
    assert "without the profiler" in text
    assert "a profiled step took" in text
    assert "the profiler's overhead included" in text
    assert "step time" in [e.stage for e in events]  # the timing reports progress too
    assert diagnosis.to_dict()["step_time"]["seconds"] == timed.seconds


def test_with_batch_scaling_its_rounds_give_the_step_time(cpu: Any) -> None:
    scaling = BatchScaling(8, 32, 0.236, 0.5, rounds=((0.236, 0.5), (0.24, 0.51), (0.23, 0.49)))
    diagnosis = diagnose(_workload(), system=cpu, steps=1, env={}, scaling=scaling, progress=False)
    timed = diagnosis.step_time
    assert timed is not None
    assert timed.seconds == 0.236
    assert "median of 3 interleaved rounds at batch 8" in timed.source
    assert timed.source.endswith("from the batch scaling; IQR 2% of the median)")
    assert "step time 236.0 ms, without the profiler" in repr(diagnosis)


def test_a_batch_scaling_stopped_after_one_round_is_no_step_time(cpu: Any) -> None:
    # The batch scaling stops after one round once its fixed share is small: that one sample
    # was shown as "median of 1 interleaved rounds" and read 14 ms, then 1.4 s, under load.
    scaling = BatchScaling(8, 32, 9.5, 0.5, rounds=((9.5, 0.5),))
    diagnosis = diagnose(_workload(), system=cpu, steps=1, env={}, scaling=scaling, progress=False)
    timed = diagnosis.step_time
    assert timed is not None
    assert timed.seconds is not None
    assert timed.seconds < 9.5  # the step's own timings, not the round's
    assert timed.source.startswith("without the profiler (median of 3 steps after a warm-up; IQR ")
    assert "median of 1 " not in repr(diagnosis)
    # With no step of its own to time (a trace was given), the one round is said to be one.
    alone = diagnose(trace=TRACE, system=cpu, scaling=scaling, progress=False).step_time
    assert alone is not None
    assert alone.seconds == 9.5
    assert alone.source == (
        "without the profiler (one round at batch 8, from the batch scaling: one sample, its "
        "spread unknown)"
    )


def test_a_trace_alone_has_only_profiled_steps(cpu: Any) -> None:
    diagnosis = diagnose(trace=TRACE, system=cpu, progress=False)
    timed = diagnosis.step_time
    assert timed is not None
    assert timed.seconds is None
    assert timed.text().startswith(
        "step time not measured without the profiler (only profiled steps were given)"
    )


def test_the_card_says_which_step_time_it_shows(cpu: Any) -> None:
    from gpudiag.magics.doctor import doctor_view

    scaling = BatchScaling(8, 32, 0.236, 0.5, rounds=((0.236, 0.5),) * 3)
    diagnosis = diagnose(_workload(), system=cpu, steps=1, env={}, scaling=scaling, progress=False)
    card = doctor_view(diagnosis)
    texts = [getattr(w, "value", "") for w in card.children]
    assert any("step time 236.0 ms, without the profiler" in t for t in texts)
    figure = next(w for w in card.children if hasattr(w, "layout") and hasattr(w, "data"))
    assert "profiled step(s)" in figure.layout.title.text
    assert "under the profiler" in figure.layout.title.text
