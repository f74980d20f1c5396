"""gd.diagnose end to end on the CPU, `gpudiag diagnose` and `%gpudiag doctor`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from gpudiag.cli import main
from gpudiag.doctor import diagnose
from gpudiag.rules import Diagnosis, Finding, Severity
from gpudiag.rules.engine import EvidenceBundle, run_rules
from gpudiag.rules.finding import Evidence, FixRef

RESNET_W0 = "kineto-resnet50_num_workers_0-worker0.1623143089861.pt.trace.json.gz"


def _resnet(fixtures_dir: Path) -> Path:
    return fixtures_dir / "traces" / RESNET_W0


def _t4(fixtures_dir: Path) -> Any:
    from gpudiag.probe.system import inspect

    return inspect(replay=fixtures_dir / "nvidia-smi-xml" / "tesla-t4.xml")


def test_diagnose_trace_path_with_recorded_system(fixtures_dir: Path) -> None:
    diagnosis = diagnose(trace=str(_resnet(fixtures_dir)), system=_t4(fixtures_dir), env={})
    assert isinstance(diagnosis, Diagnosis)
    assert diagnosis.findings[0].id == "input.dataloader_bound"
    assert "hw.pcie_width_degraded" in diagnosis.ids()
    # No "torch switches": this process's settings say nothing about a recorded machine.
    assert diagnosis.sources == ("recording", "trace")
    json.dumps(diagnosis.to_dict())  # JSON-safe
    gains = [f.estimated_gain or 0.0 for f in diagnosis.findings if f.estimated_gain is not None]
    assert gains == sorted(gains, reverse=True)


@pytest.mark.slow
def test_input_bound_workload_top_finding_is_the_dataloader() -> None:
    diagnosis = diagnose("input_bound", steps=2, env={})
    assert diagnosis.findings[0].id == "input.dataloader_bound"
    assert "trace" in diagnosis.sources
    assert "source code" in diagnosis.sources


@pytest.mark.slow
def test_diagnose_profiles_a_copy_of_the_model() -> None:
    import torch

    from gpudiag.workloads import get

    workload = get("mlp")
    before = {k: v.clone() for k, v in workload.model.state_dict().items()}
    # Batch scaling has its own isolation test; here only the profile runs on a copy.
    diagnosis = diagnose(workload, steps=2, env={}, scaling=False)
    after = workload.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert Severity.HIGH not in {f.severity for f in diagnosis.findings}
    # Without a GPU the GPU rules say why they did not run.
    assert any("GPU" in n.missing for n in diagnosis.not_evaluated)


def test_diagnosis_html_is_escaped() -> None:
    finding = Finding(
        "test.escape",
        Severity.LOW,
        "test",
        "<script>alert(1)</script>",
        (Evidence("x", "<b>", source="<src>"),),
    )
    html = Diagnosis((finding,), (), ()).__repr__(), Diagnosis((finding,), (), ())._repr_html_()
    assert "<script>" not in html[1]
    assert "&lt;script&gt;" in html[1]


def test_the_text_report_counts_one_finding_in_the_singular() -> None:
    finding = Finding("test.one", Severity.LOW, "test", "one thing", ())
    assert Diagnosis((finding,), (), (), ("trace",)).lines()[0] == (
        "gpudiag diagnose: 1 finding (trace)"
    )
    two = Diagnosis((finding, dataclasses.replace(finding, id="test.two")), (), (), ("trace",))
    assert two.lines()[0] == "gpudiag diagnose: 2 findings (trace)"


def test_the_html_card_says_how_to_try_a_fix_without_buttons() -> None:
    # gd.diagnose's card in a notebook is HTML with no Try buttons (only %gpudiag doctor's
    # widget card has them): it says how to try the recommended fix instead.
    finding = Finding(
        "precision.fp32", Severity.HIGH, "precision", "fp32", fix=FixRef("precision.bf16")
    )
    tried = Diagnosis((finding,), (), (), ("trace",), workload=object(), trial=lambda *a, **k: a)
    html = tried._repr_html_()
    assert "d.try_fix(&#x27;precision.bf16&#x27;)</code> (d: this diagnosis)" in html
    assert "%gpudiag doctor --workload wl" in html
    # Nothing to try it on (a trace alone), or nothing to try: no hint.
    assert "try_fix" not in Diagnosis((finding,), (), (), ("trace",))._repr_html_()
    info = dataclasses.replace(finding, severity=Severity.INFO)
    none = Diagnosis((info,), (), (), ("trace",), workload=object(), trial=lambda *a, **k: a)
    assert "try_fix" not in none._repr_html_()


def test_recommended_skips_info_and_duplicates(fixtures_dir: Path) -> None:
    from gpudiag.probe.system import inspect

    system = inspect(replay=fixtures_dir / "nvidia-smi-xml" / "dual_a5000-v13.xml")
    diagnosis = run_rules(EvidenceBundle(system=system, env={}))
    fixes = [f.id for f in diagnosis.recommended()]
    assert fixes == sorted(set(fixes), key=fixes.index)
    assert "allocator.config" in fixes
    # Its full GPU's memory is llama-server's: nothing in a training step frees it.
    assert "activation.checkpointing" not in fixes


def test_cli_diagnose_trace_json(fixtures_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    xml = fixtures_dir / "nvidia-smi-xml" / "3090-v13.xml"
    code = main(["diagnose", "--trace", str(_resnet(fixtures_dir)), "--replay", str(xml), "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    ids = [f["id"] for f in data["findings"]]
    assert ids[0] == "input.dataloader_bound"
    assert "hw.power_capped_idle" in ids
    assert data["findings"][0]["fix"]["id"] == "dataloader.tuning"


SHELL_ENV = {"CUDA_LAUNCH_BLOCKING": "1", "NCCL_P2P_DISABLE": "1"}


def _skipped(diagnosis: Diagnosis) -> set[str]:
    return {n.rule for n in diagnosis.not_evaluated}


def test_a_recording_is_not_judged_by_this_shells_environment(
    fixtures_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SHELL_ENV.items():
        monkeypatch.setenv(name, value)
    recorded = diagnose(system=_t4(fixtures_dir), scaling=False, progress=False)
    assert not any(i.startswith("env.") for i in recorded.ids())
    assert {"env.cuda_limiting", "env.nccl", "runtime.tf32"} <= _skipped(recorded)
    # A trace file may come from any machine: neither this shell's variables nor this
    # process's torch switches describe the job that wrote it.
    traced = diagnose(trace=str(_resnet(fixtures_dir)), scaling=False, progress=False)
    assert not any(i.startswith("env.") for i in traced.ids())
    assert {"env.cuda_limiting", "runtime.tf32"} <= _skipped(traced)
    # The job's environment, when the user gives it, is judged.
    given = diagnose(system=_t4(fixtures_dir), env=SHELL_ENV, scaling=False, progress=False)
    assert "env.cuda_launch_blocking" in given.ids()


def test_cli_trace_file_is_not_judged_by_this_shell(
    fixtures_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    assert main(["diagnose", "--json", "--trace", str(_resnet(fixtures_dir))]) == 0
    data = json.loads(capsys.readouterr().out)
    assert not [f["id"] for f in data["findings"] if f["id"].startswith("env.")]
    assert "env.cuda_limiting" in [n["rule"] for n in data["not_evaluated"]]


def test_a_live_check_reads_this_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudiag.probe.backend import NullBackend
    from gpudiag.probe.system import inspect

    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    live = diagnose(
        system=inspect(backend=NullBackend("no GPU in this test")), scaling=False, progress=False
    )
    assert "env.cuda_launch_blocking" in live.ids()


def test_cli_diagnose_text(fixtures_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    xml = fixtures_dir / "nvidia-smi-xml" / "tesla-t4.xml"
    assert main(["diagnose", "--replay", str(xml)]) == 0
    out = capsys.readouterr().out
    assert "hw.pcie_width_degraded" in out
    # Rules that could not run are grouped by what they lack, each named.
    assert "not evaluated (" in out
    lacking_trace = next(line for line in out.splitlines() if "- a profiler trace (" in line)
    assert "input.dataloader" in lacking_trace


def test_cli_diagnose_bad_trace_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["diagnose", "--trace", str(tmp_path / "missing.json")]) == 1
    assert "gpudiag: error:" in capsys.readouterr().err


def test_doctor_magic_with_trace(ipython_shell: Any, fixtures_dir: Path) -> None:
    result = ipython_shell.run_line_magic("gpudiag", f"doctor --trace {_resnet(fixtures_dir)}")
    assert isinstance(result, Diagnosis)
    assert result.findings[0].id == "input.dataloader_bound"


def test_doctor_magic_unknown_workload(
    ipython_shell: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ipython_shell.run_line_magic("gpudiag", "doctor --workload nothing_here") is None
    assert "neither a gd.Workload" in capsys.readouterr().out


@pytest.mark.slow
def test_sdpa_math_path_and_eager_attention_on_cpu() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from gpudiag.workloads import get

    with sdpa_kernel(SDPBackend.MATH):
        sdpa = diagnose(get("gpt", seq_len=1024, attn_implementation="sdpa"), steps=1, env={})
    assert "attention.sdpa_math_fallback" in sdpa.ids()
    # The module still holds the eager path, but the trace shows it did not run.
    assert "code.manual_attention" not in sdpa.ids()
    eager = diagnose(get("gpt", seq_len=256), steps=1, env={})
    assert "code.manual_attention" in eager.ids()
    assert "attention.sdpa_math_fallback" not in eager.ids()


@pytest.mark.slow
def test_cli_diagnose_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "--workload", "input_bound", "--steps", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["findings"][0]["id"] == "input.dataloader_bound"
    assert "trace" in data["sources"]


@pytest.mark.slow
def test_doctor_magic_profiles_the_demo_workload(ipython_shell: Any) -> None:
    view = ipython_shell.run_line_magic("gpudiag", "doctor --steps 1")
    from gpudiag.ui.diagnosis import DiagnosisView

    assert isinstance(view, DiagnosisView)  # the card with Try-it buttons
    result = view.diagnosis
    assert "trace" in result.sources
    assert "source code" in result.sources
    assert view.buttons
    assert all(not b.disabled for b in view.buttons)  # the demo workload is there to try on
    plain = ipython_shell.run_line_magic("gpudiag", "doctor --steps 1 --no-widget")
    assert isinstance(plain, Diagnosis)


def test_try_fix_needs_a_workload(fixtures_dir: Path) -> None:
    from gpudiag.errors import GpuDiagError

    diagnosis = diagnose(trace=_resnet(fixtures_dir), system=_t4(fixtures_dir), env={})
    with pytest.raises(GpuDiagError, match="no workload"):
        diagnosis.try_fix(0)


@pytest.mark.slow
def test_try_fix_runs_compare_on_the_workload(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpudiag.experiment.compare
    from gpudiag.errors import GpuDiagError

    calls: list[tuple[Any, list[Any], dict[str, Any]]] = []

    def fake_compare(workload: Any, fixes: list[Any], **options: Any) -> str:
        calls.append((workload, fixes, options))
        return "comparison"

    diagnosis = diagnose("input_bound", steps=1, env={})
    monkeypatch.setattr(gpudiag.experiment.compare, "compare", fake_compare)
    assert diagnosis.try_fix(0, time_budget_s=5.0) == "comparison"
    workload, fixes, options = calls[0]
    assert workload is diagnosis.workload
    assert [f.id for f in fixes] == [diagnosis.recommended()[0].id] == ["dataloader.tuning"]
    assert options["time_budget_s"] == 5.0
    with pytest.raises(GpuDiagError, match="no recommended fix number 9"):
        diagnosis.try_fix(9)


def test_a_tiny_gain_reads_as_under_one_percent() -> None:
    small = Finding("x", Severity.LOW, "c", "m", estimated_gain=0.003)
    assert "gain: up to under 1% of the run" in repr(small)
    assert "up to 30% of the run" in Finding("y", Severity.LOW, "c", "m", estimated_gain=0.3).html()


def test_cli_diagnose_recorded_machine_with_its_topology(
    fixtures_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    xml = fixtures_dir / "nvidia-smi-xml" / "dual_2080-v13.xml"
    topo = fixtures_dir / "topo-matrix"
    args = ["diagnose", "--replay", str(xml), "--json"]
    assert main(args) == 0
    without = json.loads(capsys.readouterr().out)
    assert any(n["rule"] == "topo.host_path" for n in without["not_evaluated"])
    extra = ["--topology", str(topo / "2gpu-pcie.txt"), "--topology", str(topo / "p2p-l4-2x.txt")]
    assert main(args + extra) == 0
    found = {f["id"] for f in json.loads(capsys.readouterr().out)["findings"]}
    assert "topo.p2p_unsupported" in found


def test_cpu_bf16_advice_is_quiet_when_the_step_already_autocasts(
    bf16_cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from gpudiag import _measured
    from gpudiag.bench import cpu_bf16
    from gpudiag.workloads import mlp

    # bf16 measured faster on every product (injected): the advice then depends on the
    # trace's matmul dtypes alone.
    def measured(*_: Any, shape: Any = None) -> cpu_bf16.Bf16Speed:
        rounds = (1.9, 2.0, 2.1) * 5
        return cpu_bf16.Bf16Speed(
            2.0, 3.0, 1.5, threads=1, shape=shape, low=1.9, high=2.1, rounds=rounds
        )

    monkeypatch.setattr(cpu_bf16, "measure_bf16_speed", measured)
    monkeypatch.delitem(_measured._facts, cpu_bf16.FACT, raising=False)
    monkeypatch.setattr(cpu_bf16, "_BY_SHAPE", {})

    fp32 = mlp.build(batch_size=32, in_features=32, hidden=64)
    found = diagnose(fp32, system=bf16_cpu, steps=1, env={}, scaling=False)
    finding = next(f for f in found.findings if f.id == "precision.cpu_fp32_with_bf16")
    share = next(e for e in finding.evidence if e.name == "matmul time in bf16/fp16")
    assert share.value == 0.0  # read from the trace's matmul input types

    autocast = mlp.build(batch_size=32, in_features=32, hidden=64)
    inner = autocast.loss_fn()

    def loss(model: Any, batch: Any) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return inner(model, batch)

    autocast.loss = loss
    quiet = diagnose(autocast, system=bf16_cpu, steps=1, env={}, scaling=False)
    assert "precision.cpu_fp32_with_bf16" not in quiet.ids()


def test_try_fix_on_a_diagnosis_without_a_trial_runner_says_how_to_get_one() -> None:
    from gpudiag.errors import GpuDiagError

    finding = Finding("x", Severity.HIGH, "c", "m", fix=FixRef("precision.bf16"))
    diagnosis = run_rules(EvidenceBundle(workload=object()), only=())
    by_hand = dataclasses.replace(diagnosis, findings=(finding,))
    with pytest.raises(GpuDiagError, match="no trial runner: make it with gd"):
        by_hand.try_fix(0)
    calls: list[Any] = []

    def trial(*args: Any, **options: Any) -> str:
        calls.append((args, options))
        return "ran"

    tried = dataclasses.replace(by_hand, trial=trial)
    assert tried.try_fix("precision.bf16", time_budget_s=1.0) == "ran"
    (workload, fixes), options = calls[0]
    assert workload is diagnosis.workload
    assert [f.id for f in fixes] == ["precision.bf16"]
    assert options == {"system": None, "time_budget_s": 1.0}


def test_cli_doctor_without_a_workload_says_what_it_checked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["doctor", "--no-scaling"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("no workload or trace given: only the machine was checked")
    assert "--workload gpt" in first


def test_evidence_prints_large_figures_without_an_exponent() -> None:
    assert (
        str(Evidence("memory used", 100846.2, "MiB", "nvml")) == "memory used = 100,846 MiB [nvml]"
    )
    assert str(Evidence("wait", 0.000123, "s")) == "wait = 0.000123 s"
    assert str(Evidence("share", 56.634)) == "share = 56.6"


def test_try_fix_of_an_unrecommended_fix_without_its_size_names_what_to_give() -> None:
    # No batch finding recommends a size: "batch.size" alone would measure a copy of the
    # baseline (it used to, and reported "no significant difference").
    from gpudiag.errors import GpuDiagError

    calls: list[Any] = []

    def trial(*args: Any, **options: Any) -> str:
        calls.append(args)
        return "ran"

    finding = Finding("x", Severity.HIGH, "c", "m", fix=FixRef("precision.bf16"))
    diagnosis = dataclasses.replace(
        run_rules(EvidenceBundle(workload=object()), only=()), findings=(finding,), trial=trial
    )
    for which in ("batch.size", FixRef("batch.size")):
        with pytest.raises(GpuDiagError, match=r"batch\.size needs a size: give batch\.size=N"):
            diagnosis.try_fix(which)
    assert calls == []
    assert diagnosis.try_fix("batch.size=16") == "ran"
    (_, fixes, *_), *_ = calls
    assert fixes[0].params["micro_batch"] == 16
