"""One name per command in the terminal and the notebook (``doctor``); ``diagnose`` stays an
alias in both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpudiag.cli import build_parser, main
from gpudiag.commands import aliases_of, canonical


def test_the_alias_names_the_same_command() -> None:
    assert canonical("diagnose") == "doctor"
    assert canonical("bench") == "bench"
    assert aliases_of("doctor") == ("diagnose",)


def test_the_terminal_lists_doctor_with_its_alias() -> None:
    text = build_parser().format_help()
    assert "doctor (diagnose)" in text
    assert "\n    diagnose " not in text  # not a second command


def test_gpudiag_doctor_and_gpudiag_diagnose_give_one_report(
    fixtures_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    xml = str(fixtures_dir / "nvidia-smi-xml" / "tesla-t4.xml")
    reports = []
    for name in ("doctor", "diagnose"):
        assert main([name, "--replay", xml, "--json"]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    assert [f["id"] for f in reports[0]["findings"]] == [f["id"] for f in reports[1]["findings"]]
    assert any(f["id"] == "hw.pcie_width_degraded" for f in reports[0]["findings"])


def test_the_magic_takes_the_alias(ipython_shell: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ipython_shell.run_line_magic("gpudiag", "diagnose --help")
    out = capsys.readouterr().out
    assert "usage: %gpudiag doctor" in out


def test_a_name_with_a_module_of_its_own_never_gets_two_parsers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys
    import types

    import gpudiag.cli as cli

    doctor = types.ModuleType("gpudiag.cli.doctor")
    doctor.__doc__ = "A doctor of its own."
    doctor.add_arguments = lambda parser: None  # type: ignore[attr-defined]
    doctor.run = lambda args: 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpudiag.cli.doctor", doctor)
    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, "doctor"))
    lines = build_parser().format_help().splitlines()
    assert any(line.split()[:1] == ["diagnose"] for line in lines)
    assert any(line.split()[:2] == ["doctor", "A"] for line in lines)
