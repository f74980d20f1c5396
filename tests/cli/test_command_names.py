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


def test_a_name_is_never_parsed_by_two_commands() -> None:
    from gpudiag.commands import TABLE, Command, check_table

    # A second command named as another's alias is refused when the table is read.
    with pytest.raises(ValueError, match="'diagnose' names both 'doctor' and 'diagnose'"):
        check_table((*TABLE, Command("diagnose", terminal="gpudiag.commands.doctor")))
    # And the terminal has one parser line per command: `diagnose` only as doctor's alias.
    lines = build_parser().format_help().splitlines()
    firsts = [line.split()[0] for line in lines if line.startswith("    ") and line.split()]
    assert firsts.count("doctor") == 1
    assert "diagnose" not in firsts


def test_every_row_of_the_table_serves_the_front_ends_it_names() -> None:
    import importlib

    from gpudiag.commands import TABLE

    for row in TABLE:
        if row.terminal is not None:
            module = importlib.import_module(row.terminal)
            assert callable(module.add_arguments), row.name
            assert callable(module.run), row.name
        if row.notebook is not None:
            module = importlib.import_module(row.notebook)
            assert callable(module.add_arguments), row.name
            assert callable(module.run_cell), row.name
