"""`gpudiag inspect` in a terminal: exit code 0 without a GPU, every recording replays."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.cli import main
from tests.conftest import FIXTURES

XML_FILES = sorted((FIXTURES / "nvidia-smi-xml").glob("*.xml"))


def test_inspect_on_this_machine_exits_zero_and_says_why_no_gpu() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "inspect"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "Host" in proc.stdout
    assert "no NVIDIA GPU" in proc.stdout


@pytest.mark.parametrize("path", XML_FILES, ids=lambda p: p.stem)
def test_inspect_replays_each_recording(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--replay", str(path)]) == 0
    out = capsys.readouterr().out
    assert "RECORDING" in out
    assert path.name in out
    assert "GPU 0" in out


def test_inspect_json_is_a_replayable_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", "--json", "--replay", str(XML_FILES[0])]) == 0
    snapshot = tmp_path / "snap.json"
    snapshot.write_text(capsys.readouterr().out)
    assert json.loads(snapshot.read_text())["format"] == "gpudiag.snapshot"
    assert main(["inspect", "--replay", str(snapshot)]) == 0
    assert "RECORDING snap.json" in capsys.readouterr().out


def test_bad_replay_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text("<nvidia_smi_log><gpu>")
    assert main(["inspect", "--replay", str(bad)]) == 1
    assert "gpudiag: error: not valid XML" in capsys.readouterr().err


def test_no_subcommand_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "inspect" in capsys.readouterr().out
