"""CPU precision advice follows the measured bf16/fp32 matmul speed and its interval, not the
CPU's flags; a trial of precision.bf16 on the workload itself replaces the micro-benchmark."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from gpudiag import _measured
from gpudiag.bench import cpu_bf16
from gpudiag.bench.cpu_bf16 import Bf16Speed, cpu_bf16_speed
from gpudiag.rules import EvidenceBundle, Severity, run_rules
from gpudiag.workloads import mlp

RULE = "precision.cpu_bf16"


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Inject the process's cached measurement (no timing in these tests)."""

    def inject(
        ratio: float | None, reason: str = "", interval: tuple[float, float] | None = None
    ) -> None:
        low, high = interval or ((ratio * 0.97, ratio * 1.03) if ratio else (None, None))
        speed = Bf16Speed(
            ratio,
            fp32_ms=3.0,
            bf16_ms=3.0 / ratio if ratio else None,
            threads=1,
            low=low,
            high=high,
        )
        if ratio is None:
            speed = Bf16Speed(None, threads=1, reason=reason)
        monkeypatch.setitem(_measured._facts, cpu_bf16.FACT, speed)

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
    assert f"measured {ratio:.2f}x the speed of fp32 here (99% CI" in finding.message
    assert "faster than fp32" not in finding.message
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
    monkeypatch.delitem(_measured._facts, cpu_bf16.FACT, raising=False)
    assert not _advice(make_cpu_system("avx2", "avx512f")).findings


def test_the_real_measurement_runs_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Bf16Speed] = []
    real = cpu_bf16.measure_bf16_speed

    def counted() -> Bf16Speed:
        calls.append(real())
        return calls[-1]

    monkeypatch.setattr(cpu_bf16, "measure_bf16_speed", counted)
    monkeypatch.delitem(_measured._facts, cpu_bf16.FACT, raising=False)
    threads = torch.get_num_threads()
    first = cpu_bf16_speed()
    assert cpu_bf16_speed() is first  # cached
    assert _measured.fact(cpu_bf16.FACT) is first  # where inspect reads it
    assert len(calls) == 1
    assert torch.get_num_threads() == threads  # the measurement's one thread was given back
    if first.measured:
        assert (first.ratio or 0.0) > 0
        assert (first.fp32_ms or 0.0) > 0
        assert first.low is not None
        assert first.high is not None
        assert first.low <= (first.ratio or 0.0) <= first.high
        assert len(first.rounds) == cpu_bf16.ROUNDS
        assert first.answer in ("faster", "slower", "undecided")
        assert f"bf16 matmuls measured {first.ratio:.2f}x" in str(first)
        assert f"(99% CI {first.low:.2f}-{first.high:.2f}x): {first.answer}" in str(first)
    else:  # a torch without a bf16 CPU kernel: the reason is kept
        assert first.reason
    again = cpu_bf16_speed(refresh=True)
    assert len(calls) == 2
    assert cpu_bf16_speed() is again


def test_inspect_and_compare_say_instructions_not_fast(
    bf16_cpu: Any, fake_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpudiag.experiment.compare import compare
    from gpudiag.step import Workload

    monkeypatch.delitem(_measured._facts, cpu_bf16.FACT, raising=False)  # nothing measured yet
    monkeypatch.delitem(_measured._facts, cpu_bf16.WORKLOAD_FACT, raising=False)
    text = repr(bf16_cpu)
    assert "(bf16 instructions: yes, speed not measured: gd.bench.cpu_bf16_speed())" in text
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
    rounds_fast, rounds_slow = (1.9, 2.0, 2.1) * 5, (0.49, 0.5, 0.51) * 5
    monkeypatch.setattr(
        cpu_bf16,
        "_BY_SHAPE",
        {
            fast: Bf16Speed(2.0, fp32_ms=3.0, shape=fast, threads=1, rounds=rounds_fast),
            slow: Bf16Speed(0.5, fp32_ms=0.5, shape=slow, threads=1, rounds=rounds_slow),
        },
    )
    # One 3 ms product at 2x and two 0.5 ms ones at 0.5x: 4 ms in fp32, 1.5 + 2 ms in bf16.
    speed = cpu_bf16.workload_bf16_speed([(fast, 1), (slow, 2)], covered=0.9)
    assert speed.ratio == pytest.approx(4 / 3.5, rel=0.01)
    assert speed.low is not None
    assert speed.high is not None
    assert speed.low < 4 / 3.5 < speed.high  # the rounds' spread, combined the same way
    assert speed.answer == "faster"
    assert "512x512 @ 512x512, 10x64 @ 64x256, 90% of its fp32 matmul FLOPs" in speed.source
    alone = {shape: dataclasses.replace(s, rounds=()) for shape, s in cpu_bf16._BY_SHAPE.items()}
    monkeypatch.setattr(cpu_bf16, "_BY_SHAPE", alone)
    no_rounds = cpu_bf16.workload_bf16_speed([(fast, 1), (slow, 2)])
    assert no_rounds.ratio == pytest.approx(4 / 3.5)
    assert no_rounds.answer == "undecided"  # a ratio without its rounds has no interval
    failed = Bf16Speed(None, shape=slow, reason="bf16 matmul cannot run here: no kernel")
    monkeypatch.setitem(cpu_bf16._BY_SHAPE, slow, failed)
    assert cpu_bf16.workload_bf16_speed([(fast, 1), (slow, 2)]).reason == failed.reason


def test_the_step_s_matmuls_are_chosen_by_flops_not_by_noisy_host_time() -> None:
    from types import SimpleNamespace

    from gpudiag.analysis.trace.shapes import GemmDims
    from gpudiag.rules.precision import _fp32_matmuls

    def gemm(m: int, n: int, k: int, count: int, cpu_us: float, name: str = "aten::mm") -> Any:
        return SimpleNamespace(
            name=name, dtype="fp32", in_attention=False, count=count, cpu_us=cpu_us,
            dims=GemmDims(m, n, k),
        )  # fmt: skip

    shapes = [
        gemm(32, 512, 256, 2, 900.0),
        gemm(512, 256, 32, 2, 10.0),  # a busy host made this one look fast
        gemm(32, 256, 512, 2, 50.0),
        gemm(32, 512, 256, 2, 400.0, name="aten::addmm"),  # the same product again
        gemm(32, 10, 512, 2, 5000.0),  # small, however long the host took
    ]
    trace = SimpleNamespace(gemm_shapes=lambda: shapes)
    chosen, covered = _fp32_matmuls(trace)  # type: ignore[arg-type]
    assert chosen == [((32, 512, 256), 4), ((32, 256, 512), 2), ((512, 256, 32), 2)]
    # 8 products of 32x512x256 multiply-adds against 2 of 32x10x512
    assert covered == pytest.approx(8 / (8 + 2 * 32 * 10 * 512 / (32 * 512 * 256)))


def test_advice_on_a_traced_step_times_its_own_matmuls(
    bf16_cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The README's model: 64 -> 256 -> 10. A large square product is fast in bf16 here; the
    # step's own small products are not, and gd.compare measures precision.bf16 slower on it.
    timed: list[tuple[int, int, int] | None] = []

    def fake(*_: Any, shape: tuple[int, int, int] | None = None) -> Bf16Speed:
        timed.append(shape)
        ratio = 2.6 if shape is None else 0.5
        rounds = (ratio * 0.98, ratio, ratio * 1.02) * 5
        return Bf16Speed(
            ratio, fp32_ms=1.0, bf16_ms=1.0, shape=shape, low=ratio, high=ratio, rounds=rounds
        )

    monkeypatch.setattr(cpu_bf16, "measure_bf16_speed", fake)
    monkeypatch.delitem(_measured._facts, cpu_bf16.FACT, raising=False)
    monkeypatch.delitem(_measured._facts, cpu_bf16.WORKLOAD_FACT, raising=False)
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
    # One answer per process: gd.inspect afterwards shows the measurement the advice read
    # (it used to say "speed not measured"), and says which products it timed.
    own = _measured.fact(cpu_bf16.WORKLOAD_FACT)
    assert own is not None
    assert own.source == speed.source
    text = repr(bf16_cpu)
    assert "speed not measured" not in text
    assert f"{own} [the diagnosed step's own products" in text
    assert bf16_cpu.to_dict()["measured"]["workload_bf16_speed"]["ratio"] == own.ratio
    # The square product, measured after, is shown beside it, each labelled by its product.
    square = cpu_bf16_speed()
    assert square.source.startswith("measured: 512x512x512 matmul")
    lines = repr(bf16_cpu).splitlines()
    assert f"         {square}" in lines
    assert any(line.startswith(f"         {own} [") for line in lines)


@pytest.mark.parametrize(
    ("low", "high", "answer"),
    [(1.3, 1.6, "faster"), (0.5, 0.9, "slower"), (0.9, 1.2, "undecided"), (1.02, 1.1, "undecided")],
)
def test_the_machine_fact_is_a_three_way_answer_from_its_interval(
    low: float, high: float, answer: str
) -> None:
    speed = Bf16Speed((low + high) / 2, low=low, high=high, threads=1)
    assert speed.answer == answer
    assert f"(99% CI {low:.2f}-{high:.2f}x): {answer}" in str(speed)
    assert speed.to_dict()["answer"] == answer
    # What a notebook or terminal shows: the sentence, not the dataclass's fields.
    from IPython.lib.pretty import pretty

    assert repr(speed) == str(speed) == pretty(speed)
    html = speed._repr_html_()
    assert f"{speed.ratio:.2f}x fp32 (99% CI {low:.2f}-{high:.2f}x)" in html
    assert ("bf16 is " + answer if answer != "undecided" else "undecided") in html
    assert "Bf16Speed(" not in html
    assert Bf16Speed(3.0).answer == "undecided"  # one ratio, no interval: not an answer
    assert Bf16Speed(None, reason="no kernel").answer == "not measured"
    assert repr(Bf16Speed(None, reason="no kernel")) == "bf16 matmul speed not measured: no kernel"
    assert "no kernel" in Bf16Speed(None, reason="no kernel")._repr_html_()


def _scripted(monkeypatch: pytest.MonkeyPatch, fp32_ms: list[float], bf16_ms: list[float]) -> None:
    """measure_bf16_speed's timings replaced by these (one per round and arm, in order)."""
    times = iter(t / 1e3 for pair in zip(fp32_ms, bf16_ms, strict=True) for t in pair)

    def timed(*_: Any, **__: Any) -> Any:
        return type("Timed", (), {"min_s": next(times)})()

    monkeypatch.setattr(cpu_bf16, "measure", timed)


def test_noise_makes_the_answer_undecided_rather_than_flip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import random

    definite = []
    for seed in range(100):
        rng = random.Random(seed)
        # A busy host, bf16 no faster than fp32: each bf16 call lands anywhere from twice as
        # fast to twice as slow. One ratio per run would say faster half the time, slower the
        # other half; the interval leaves nearly every run undecided.
        bf16 = [2 ** rng.uniform(-1.0, 1.0) for _ in range(cpu_bf16.ROUNDS)]
        _scripted(monkeypatch, [1.0] * cpu_bf16.ROUNDS, bf16)
        speed = cpu_bf16.measure_bf16_speed(shape=(8, 8, 8))
        assert speed.low is not None
        assert speed.high is not None
        assert speed.low <= (speed.ratio or 0.0) <= speed.high
        if speed.answer != "undecided":
            definite.append(speed.answer)
    assert len(definite) <= 3  # the 99 % interval's false claims (2 of these 100 runs)
    # The same host quiet: every round says 2x, so does the answer.
    _scripted(monkeypatch, [1.0] * cpu_bf16.ROUNDS, [0.5, 0.49, 0.51] * 5)
    quiet = cpu_bf16.measure_bf16_speed(shape=(8, 8, 8))
    assert quiet.answer == "faster"
    assert quiet.ratio == pytest.approx(2.0)
    assert quiet.low == pytest.approx(2.0, rel=0.03)


def test_an_interval_across_the_threshold_offers_a_trial_not_a_claim(
    bf16_cpu: Any, measured: Any
) -> None:
    measured(1.3, interval=(1.1, 1.5))
    (finding,) = _advice(bf16_cpu).findings
    assert finding.id == "precision.cpu_bf16_undecided"
    assert finding.severity is Severity.LOW
    assert "undecided" in finding.message
    assert "(99% CI 1.10-1.50x)" in finding.message
    assert str(finding.fix) == "precision.bf16"  # the trial decides it


def test_inspect_reads_the_same_measured_answer(bf16_cpu: Any, measured: Any) -> None:
    measured(4.2, interval=(4.1, 4.4))
    speed = _measured.fact(cpu_bf16.FACT)
    assert bf16_cpu.cpu_bf16_speed is speed
    text = repr(bf16_cpu)
    assert str(speed) in text
    assert "speed not measured" not in text
    assert str(speed) in bf16_cpu._repr_html_().replace("&#x27;", "'")
    assert bf16_cpu.to_dict()["measured"]["cpu_bf16_speed"]["answer"] == "faster"
    from dataclasses import replace

    recording = replace(bf16_cpu, source="recording")
    assert recording.cpu_bf16_speed is None  # a recorded CPU is not this one


def _bf16_slower_workload() -> Any:
    """A step on a real fp32 model that the fake clock times twice as long under autocast."""
    from gpudiag.step import Workload

    model = torch.nn.Linear(8, 8)
    clock = _Clock()

    def step() -> float:
        clock.now += 0.02 if torch.is_autocast_enabled("cpu") else 0.01
        clock.now += 0.0001 * clock.rng.random()
        return float(model(torch.ones(2, 8)).sum().detach())

    return Workload.from_step(step, model=model), clock


class _Clock:
    def __init__(self) -> None:
        import random

        self.now = 0.0
        self.rng = random.Random(0)

    def __call__(self) -> float:
        return self.now


def _compare(workload: Any, clock: Any, system: Any) -> Any:
    from gpudiag.experiment.compare import compare

    return compare(
        workload,
        ["precision.bf16"],
        system=system,
        clock=clock,
        progress=False,
        measure_memory=False,
        steps_per_sample=1,
    )


def test_a_trial_on_the_workload_replaces_the_micro_benchmark(
    bf16_cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    workload, clock = _bf16_slower_workload()
    comparison = _compare(workload, clock, bf16_cpu)
    assert comparison.verdict("precision.bf16") == "slower"

    def fail(*_: Any, **__: Any) -> None:
        raise AssertionError("the micro-benchmark ran although the step was measured")

    monkeypatch.setattr(cpu_bf16, "measure_bf16_speed", fail)
    monkeypatch.delitem(_measured._facts, cpu_bf16.FACT, raising=False)
    diagnosis = run_rules(EvidenceBundle(system=bf16_cpu, workload=workload, env={}), only=[RULE])
    (finding,) = diagnosis.findings
    assert finding.id == "precision.cpu_bf16_not_faster"
    assert f"measured slower on this step ({comparison.speedup('precision.bf16')})" in (
        finding.message
    )
    trial = next(e for e in finding.evidence if e.name == "precision.bf16 on this step")
    assert trial.source.startswith("gd.compare on this workload in this process")
    assert not diagnosis.recommended()
    # Another model is another question: the trial does not answer for it.
    other, _ = _bf16_slower_workload()
    assert _measured.trial(other.model, other.describe(), "precision.bf16") is None


def test_a_diagnosis_shown_after_a_trial_reads_the_trial(bf16_cpu: Any, measured: Any) -> None:
    measured(2.0, interval=(1.9, 2.1))
    workload, clock = _bf16_slower_workload()
    diagnosis = run_rules(EvidenceBundle(system=bf16_cpu, workload=workload, env={}), only=[RULE])
    (before,) = diagnosis.findings
    assert before.id == "precision.cpu_fp32_with_bf16"  # the micro-benchmark's prediction
    assert [f.id for f in diagnosis.recommended()] == ["precision.bf16"]
    comparison = _compare(workload, clock, bf16_cpu)
    verdict = f"bf16 autocast measured slower on this step ({comparison.speedup()})"
    assert verdict in repr(diagnosis)
    assert "bf16 autocast should speed up" not in repr(diagnosis)
    assert verdict in diagnosis._repr_html_()
    assert diagnosis.to_dict()["findings"][0]["id"] == "precision.cpu_bf16_not_faster"
    assert not diagnosis.recommended()
    assert diagnosis.findings == (before,)  # what the rules found stays as it was
    # The doctor card built now shows the same answer, and no Try button for bf16.
    from gpudiag.ui.diagnosis import DiagnosisView

    card = DiagnosisView(diagnosis)
    assert verdict in card.cards[0].value
    assert not card.buttons
