"""`gpudiag record` on this machine (a CPU host here), the recordings committed under
tests/fixtures/recorded/ replayed file by file, and `make gpu-check`'s table without a GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gpudiag as gd
from gpudiag.cli.gpu_check import FAILED, NOT_APPLICABLE, PASSED, CheckRow, table
from gpudiag.cli.record import FORMAT, MANIFEST, OK, load_manifest, record, replay_recording
from gpudiag.errors import GpuDiagError, ReplayError
from gpudiag.probe.replay import ReplayBackend
from tests.conftest import FIXTURES, REPO

RECORDINGS = sorted(p.parent for p in (FIXTURES / "recorded").glob(f"*/{MANIFEST}"))
NO_GPU = shutil.which("nvidia-smi") is None and not gd.inspect().has_gpu


@pytest.mark.skipif(not NO_GPU, reason="this machine has an NVIDIA GPU: the GPU tests cover it")
def test_record_a_cpu_host_says_so_and_replays(tmp_path: Path) -> None:
    out = tmp_path / "host"
    manifest = record(out, monitor_s=0.5, bench=False, argv=["host"], say=lambda _: None)
    assert manifest["format"] == FORMAT
    provenance = manifest["provenance"]
    assert provenance["has_gpu"] is False
    assert "no NVIDIA GPU" in provenance["note"]
    assert provenance["torch"] == gd.inspect().host.torch.version.value
    assert provenance["command"] == "gpudiag record host"
    by_file = {f["file"]: f for f in manifest["files"]}
    for name in ("nvidia-smi-q-x.xml", "nvidia-smi.txt", "topo-m.txt"):
        assert by_file[name]["status"] == "n/a"
        assert "nvidia-smi is not on PATH" in by_file[name]["reason"]
        assert not (out / name).exists()
    assert "needs a CUDA GPU" in by_file["memory-snapshot.pickle"]["reason"]
    recorded = [f["file"] for f in manifest["files"] if f["status"] == OK]
    assert sorted(recorded) == ["monitor.jsonl", "snapshot.json", "traces/gpt.pt.trace.json.gz"]
    for name in recorded:
        assert (out / name).stat().st_size == by_file[name]["bytes"] > 0
    assert sorted(replay_recording(out)) == sorted(recorded)
    snapshot = gd.inspect(replay=out / "snapshot.json")
    assert snapshot.is_recording
    assert not snapshot.gpus
    assert json.loads((out / MANIFEST).read_text()) == manifest


def test_record_refuses_a_folder_with_files(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(GpuDiagError, match="not empty"):
        record(tmp_path, say=lambda _: None)
    assert (tmp_path / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not valid JSON"),
        ('{"format": "other"}', "not a gpudiag recording"),
        (json.dumps({"format": FORMAT, "version": 99}), "version 99"),
    ],
)
def test_bad_manifest_is_a_replay_error(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / MANIFEST).write_text(content)
    with pytest.raises(ReplayError, match=message):
        load_manifest(tmp_path)
    with pytest.raises(ReplayError, match="no recording"):
        load_manifest(tmp_path / "missing")


def test_at_least_one_recording_is_committed() -> None:
    assert RECORDINGS, "tests/fixtures/recorded/ holds no recording"


@pytest.mark.parametrize("folder", RECORDINGS, ids=lambda p: p.name)
def test_committed_recording_replays(folder: Path) -> None:
    manifest = load_manifest(folder)
    provenance = manifest["provenance"]
    for key in ("date", "command", "torch", "gpus", "driver", "cuda_driver", "has_gpu"):
        assert key in provenance, key
    entries = manifest["files"]
    recorded = {f["file"] for f in entries if f["status"] == OK}
    on_disk = {
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.name not in (MANIFEST, "SOURCES.md")
    }
    assert on_disk == recorded  # nothing unlisted, nothing missing
    for entry in entries:
        assert entry["command"]
        assert entry["status"] == OK or entry["reason"]  # an absent file says why
    assert sorted(replay_recording(folder)) == sorted(recorded)
    snapshot = ReplayBackend.from_file(folder / "snapshot.json")
    assert [g.name.value for g in snapshot.gpu_infos()] == provenance["gpus"]
    assert bool(provenance["gpus"]) is provenance["has_gpu"]
    if "nvidia-smi-q-x.xml" in recorded:
        xml = ReplayBackend.from_file(folder / "nvidia-smi-q-x.xml")
        assert [i.uuid.value for i in xml.gpu_infos()] == [
            i.uuid.value for i in snapshot.gpu_infos()
        ]
        assert xml.driver().driver_version.value == provenance["driver"]
    if "nvidia-smi-q.txt" in recorded and "nvidia-smi-q-x.xml" in recorded:
        text = ReplayBackend.from_file(folder / "nvidia-smi-q.txt")
        assert [i.uuid.value for i in text.gpu_infos()] == [i.uuid.value for i in xml.gpu_infos()]
    if "bench.json" in recorded:
        bench = json.loads((folder / "bench.json").read_text())
        assert set(bench) == {"matmul", "bandwidth", "attention"}
        assert bench["matmul"]["rows"]


def test_table_counts_each_result() -> None:
    rows = [
        CheckRow("NVML vs nvidia-smi", PASSED, "1 GPU(s), 8 static fields equal", 1.25),
        CheckRow("MIG", NOT_APPLICABLE, "N/A: MIG is off on every GPU", 0.0),
        CheckRow("matmul [bf16]", FAILED, "x" * 300, 3.0),
    ]
    text = table(rows)
    lines = text.splitlines()
    assert lines[0].startswith("GPU path")
    assert "passed" in lines[2]
    assert "1.2" in lines[2]
    assert lines[4].endswith("...")
    assert lines[-1] == "1 passed, 1 failed, 1 not applicable"


@pytest.mark.skipif(not NO_GPU, reason="this machine has an NVIDIA GPU: the tests would run")
def test_gpu_check_without_cuda_marks_every_gpu_test_not_applicable(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "gpudiag.cli.gpu_check", "--no-end-to-end", "--json", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(out.read_text())
    collected = len(list((REPO / "tests" / "gpu").glob("test_*.py")))
    assert collected >= 3
    assert len(rows) >= 20
    assert {r["result"] for r in rows} == {NOT_APPLICABLE}
    assert {r["figure"] for r in rows} == {"needs a CUDA GPU"}
    assert f"0 passed, 0 failed, {len(rows)} not applicable" in done.stdout


@pytest.mark.skipif(not NO_GPU, reason="this machine has an NVIDIA GPU: the GPU tests cover it")
def test_record_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpudiag.cli import main

    out = tmp_path / "rec"
    code = main(["record", str(out), "--no-bench", "--no-traces", "--monitor-seconds", "0.5"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "wrote 2 files and manifest.json" in printed
    assert "note: no NVIDIA GPU" in printed
    command = load_manifest(out)["provenance"]["command"]
    assert command == f"gpudiag record {out} --monitor-seconds 0.5 --no-bench --no-traces"
    assert main(["record", str(tmp_path / "x"), "--monitor-seconds", "0"]) == 1


def test_record_keeps_nvidia_smi_output_verbatim_and_replays_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in `nvidia-smi` first on PATH plays recorded output for each command (A100 XML,
    # 8x H100 text and topology): what `gpudiag record` does with a real tool's output.
    played = {
        "-q -x": FIXTURES / "nvidia-smi-xml" / "a100-sxm4-v12.xml",
        "-q": FIXTURES / "nvidia-smi-text" / "h100-sxm-x8.nvidia-smi-q.txt",
        "": FIXTURES / "nvidia-smi-text" / "h100-sxm-x8.nvidia-smi.txt",
        "topo -m": FIXTURES / "topo-matrix" / "dgx-h100-8x.txt",
        "topo -p2p r": FIXTURES / "topo-matrix" / "p2p-h100-8x.txt",
    }
    cases = "".join(f'  "{args}") exec cat "{path}";;\n' for args, path in played.items())
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text(f'#!/bin/sh\ncase "$*" in\n{cases}esac\nexit 3\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    out = tmp_path / "rec"
    manifest = record(out, monitor_s=0.3, bench=False, traces=False, say=lambda _: None)
    by_command = {f["command"]: f for f in manifest["files"]}
    for args, source in played.items():
        entry = by_command[f"nvidia-smi {args}".strip()]
        assert entry["status"] == OK, entry
        assert (out / entry["file"]).read_bytes() == source.read_bytes()
    replayed = replay_recording(out)
    for name in ("nvidia-smi-q-x.xml", "nvidia-smi-q.txt", "nvidia-smi.txt", "topo-m.txt"):
        assert name in replayed
    assert "topo-p2p-r.txt" in replayed
