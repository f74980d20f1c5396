"""CPU precision advice follows the measured bf16/fp32 matmul speed, not the CPU's flags."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gpudiag.bench import cpu_bf16
from gpudiag.bench.cpu_bf16 import Bf16Speed, cpu_bf16_speed
from gpudiag.rules import EvidenceBundle, Severity, run_rules
from gpudiag.workloads import mlp

RULE = "precision.cpu_bf16"


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Inject the process's cached measurement (no timing in these tests)."""

    def inject(ratio: float | None, reason: str = "") -> None:
        speed = Bf16Speed(ratio, fp32_ms=3.0, bf16_ms=3.0 / ratio if ratio else None, threads=1)
        if ratio is None:
            speed = Bf16Speed(None, threads=1, reason=reason)
        monkeypatch.setattr(cpu_bf16, "_MEASURED", speed)

    return inject


def _advice(system: Any) -> Any:
    workload = mlp.build(batch_size=8, in_features=16, hidden=32)
    return run_rules(EvidenceBundle(system=system, workload=workload, env={}), only=[RULE])


@pytest.mark.parametrize("ratio", [0.6, 1.0, 1.2])
def test_bf16_measured_slower_or_no_faster_gets_no_speed_claim(
    bf16_cpu: Any, measured: Any, ratio: float
) -> None:
    measured(ratio)
    diagnosis = _advice(bf16_cpu)
    (finding,) = diagnosis.findings
    assert finding.id == "precision.cpu_bf16_not_faster"
    assert finding.severity is Severity.INFO
    assert finding.fix is None  # nothing recommends bf16
    assert not diagnosis.recommended()
    assert f"measured {ratio:.2f}x the speed of fp32" in finding.message
    assert "faster than fp32:" not in finding.message
    speed = next(e for e in finding.evidence if e.name == "bf16 / fp32 matmul speed")
    assert speed.value == ratio
    assert speed.source.startswith("measured: 512x512x512 matmul")


@pytest.mark.parametrize(
    ("ratio", "words"), [(1.6, "measured 1.6x faster"), (2.6, "measured several times faster")]
)
def test_bf16_measured_faster_recommends_autocast(
    bf16_cpu: Any, measured: Any, ratio: float, words: str
) -> None:
    measured(ratio)
    (finding,) = _advice(bf16_cpu).findings
    assert finding.id == "precision.cpu_fp32_with_bf16"
    assert finding.severity is Severity.MEDIUM
    assert words in finding.message
    assert str(finding.fix) == "precision.bf16"
    assert any(e.value == ratio and e.unit == "x" for e in finding.evidence)


def test_a_measurement_that_failed_is_said_not_guessed(bf16_cpu: Any, measured: Any) -> None:
    measured(None, reason="bf16 matmul cannot run here: no kernel")
    (finding,) = _advice(bf16_cpu).findings
    assert finding.id == "precision.cpu_bf16_not_faster"
    assert "could not be measured (bf16 matmul cannot run here: no kernel)" in finding.message


def test_a_cpu_without_bf16_instructions_is_not_measured(
    make_cpu_system: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail() -> None:
        raise AssertionError("measured on a CPU without bf16 instructions")

    monkeypatch.setattr(cpu_bf16, "measure_bf16_speed", fail)
    monkeypatch.setattr(cpu_bf16, "_MEASURED", None)
    assert not _advice(make_cpu_system("avx2", "avx512f")).findings


def test_the_real_measurement_runs_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Bf16Speed] = []
    real = cpu_bf16.measure_bf16_speed

    def counted() -> Bf16Speed:
        calls.append(real())
        return calls[-1]

    monkeypatch.setattr(cpu_bf16, "measure_bf16_speed", counted)
    monkeypatch.setattr(cpu_bf16, "_MEASURED", None)
    threads = torch.get_num_threads()
    first = cpu_bf16_speed()
    assert cpu_bf16_speed() is first  # cached
    assert len(calls) == 1
    assert torch.get_num_threads() == threads  # the measurement's one thread was given back
    if first.measured:
        assert (first.ratio or 0.0) > 0
        assert (first.fp32_ms or 0.0) > 0
        assert "bf16 matmuls measured" in str(first)
    else:  # a torch without a bf16 CPU kernel: the reason is kept
        assert first.reason
    again = cpu_bf16_speed(refresh=True)
    assert len(calls) == 2
    assert cpu_bf16_speed() is again


def test_inspect_and_compare_say_instructions_not_fast(bf16_cpu: Any, fake_clock: Any) -> None:
    from gpudiag.experiment.compare import compare
    from gpudiag.experiment.workload import Workload

    text = repr(bf16_cpu)
    assert "(bf16 instructions: yes, speed not measured)" in text
    assert "fast bf16" not in text

    def step() -> float:
        fake_clock.advance(0.01)
        return 1.0

    comparison = compare(
        Workload.from_step(step),
        ["attention.backend=math"],
        system=bf16_cpu,
        clock=fake_clock,
        progress=False,
        measure_memory=False,
        steps_per_sample=1,
    )
    assert "2 logical cores with bf16 instructions" in comparison.hardware
    assert comparison.system["cpu_bf16_instructions"] is True


def test_a_workloads_ratio_is_its_matmul_time_in_fp32_over_bf16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast, slow = (512, 512, 512), (10, 256, 64)
    monkeypatch.setattr(
        cpu_bf16,
        "_BY_SHAPE",
        {fast: Bf16Speed(2.0, shape=fast, threads=1), slow: Bf16Speed(0.5, shape=slow, threads=1)},
    )
    # 3 ms of fp32 at 2x and 1 ms at 0.5x: 4 ms in fp32, 1.5 + 2 ms in bf16.
    speed = cpu_bf16.workload_bf16_speed([(fast, 3.0), (slow, 1.0)], covered=0.9)
    assert speed.ratio == pytest.approx(4 / 3.5)
    assert not speed.fast
    assert "512x512 @ 512x512, 10x64 @ 64x256, 90% of its fp32 matmul time" in speed.source
    failed = Bf16Speed(None, shape=slow, reason="bf16 matmul cannot run here: no kernel")
    monkeypatch.setitem(cpu_bf16._BY_SHAPE, slow, failed)
    assert cpu_bf16.workload_bf16_speed([(fast, 3.0), (slow, 1.0)]).reason == failed.reason


def test_advice_on_a_traced_step_times_its_own_matmuls(
    bf16_cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The README's model: 64 -> 256 -> 10. A large square product is fast in bf16 here; the
    # step's own small products are not, and gd.compare measures precision.bf16 slower on it.
    timed: list[tuple[int, int, int] | None] = []

    def fake(*_: Any, shape: tuple[int, int, int] | None = None) -> Bf16Speed:
        timed.append(shape)
        return Bf16Speed(2.6 if shape is None else 0.5, fp32_ms=1.0, bf16_ms=1.0, shape=shape)

    monkeypatch.setattr(cpu_bf16, "measure_bf16_speed", fake)
    monkeypatch.setattr(cpu_bf16, "_MEASURED", None)
    monkeypatch.setattr(cpu_bf16, "_BY_SHAPE", {})
    from gpudiag.doctor import diagnose

    workload = mlp.build(batch_size=64, in_features=64, hidden=256)
    diagnosis = diagnose(workload, system=bf16_cpu, steps=1, scaling=False, progress=False)
    (finding,) = [f for f in diagnosis.findings if f.id.startswith("precision.cpu_")]
    assert finding.id == "precision.cpu_bf16_not_faster"
    assert "the step's own matmuls in bf16 measured 0.50x" in finding.message
    assert timed
    assert None not in timed  # never the square product
    speed = next(e for e in finding.evidence if e.name == "bf16 / fp32 matmul speed")
    assert speed.source.startswith("measured: the step's own matmuls (")
