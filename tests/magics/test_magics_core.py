"""`%load_ext gpudiag` in a real in-process IPython shell: dispatcher, help, inspect."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from gpudiag.cli import main
from gpudiag.probe.system import SystemReport
from tests.conftest import FIXTURES


@pytest.fixture
def ip(ipython_shell: Any) -> Any:
    return ipython_shell


def test_help_lists_subcommands(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("gpudiag", "help")
    out = capsys.readouterr().out
    assert "inspect" in out
    assert "%gpudiag" in out


def test_question_mark_doc_explains_subcommands(ip: Any) -> None:
    magic = ip.find_line_magic("gpudiag")
    assert "inspect" in (magic.__doc__ or "")


def test_inspect_returns_the_report(ip: Any) -> None:
    report = ip.run_line_magic("gpudiag", "inspect")
    assert isinstance(report, SystemReport)
    assert not report.is_recording


def test_inspect_replay(ip: Any) -> None:
    path = FIXTURES / "nvidia-smi-xml" / "tesla-t4.xml"
    report = ip.run_line_magic("gpudiag", f"inspect --replay {path}")
    assert report.is_recording
    assert report.gpus[0].name == "Tesla T4"


def test_inspect_replay_with_its_topology(ip: Any) -> None:
    xml = FIXTURES / "nvidia-smi-xml" / "dual_2080-v13.xml"
    topo = FIXTURES / "topo-matrix" / "2gpu-pcie.txt"
    report = ip.run_line_magic("gpudiag", f"inspect --replay {xml} --topology {topo}")
    assert report.topology is not None
    assert "PHB" in report.topology.summary()


def test_unknown_subcommand_is_explained_not_raised(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ip.run_line_magic("gpudiag", "frobnicate") is None
    assert "unknown subcommand 'frobnicate'" in capsys.readouterr().out


def test_bad_option_prints_usage(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert ip.run_line_magic("gpudiag", "inspect --nope") is None
    assert "unrecognized arguments" in capsys.readouterr().out


def test_user_error_is_printed_not_raised(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert ip.run_line_magic("gpudiag", "inspect --replay /no/such/file.xml") is None
    assert "cannot read recording" in capsys.readouterr().out


def test_help_for_one_subcommand(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("gpudiag", "help inspect")
    assert "--replay" in capsys.readouterr().out


def test_help_reads_as_plain_sentences(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("gpudiag", "help")
    out = capsys.readouterr().out
    assert "``" not in out
    # inspect's docstring runs over two lines: its summary is a whole sentence, not cut at ","
    inspect_line = next(line for line in out.splitlines() if line.strip().startswith("inspect"))
    assert inspect_line.rstrip().endswith(".")
    assert all(len(line) <= 112 for line in out.splitlines())
    ip.run_line_magic("gpudiag", "help doctor")
    assert "``" not in capsys.readouterr().out


def test_summary_line_keeps_whole_sentences() -> None:
    from gpudiag.magics import summary_line

    doc = "Report the host (``--replay FILE`` for a recorded machine,\n``--topology FILE`` too)."
    assert summary_line(doc, width=40) == "Report the host."
    assert summary_line(doc, width=200) == (
        "Report the host (--replay FILE for a recorded machine, --topology FILE too)."
    )
    assert summary_line("One line.\n\nMore details.") == "One line."


def _options(add_arguments: Any) -> set[str]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return {o for a in parser._actions for o in a.option_strings} - {"-h", "--help"}


def test_inspect_json_is_the_terminals_json(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path = FIXTURES / "nvidia-smi-xml" / "tesla-t4.xml"
    as_dict = ip.run_line_magic("gpudiag", f"inspect --json --replay {path}")
    capsys.readouterr()
    assert main(["inspect", "--json", "--replay", str(path)]) == 0
    terminal = json.loads(capsys.readouterr().out)
    assert isinstance(as_dict, dict)
    assert set(as_dict) == set(terminal)
    assert as_dict["source"] == terminal["source"] == "recording"
    names = [[g["info"]["name"]["value"] for g in d["gpus"]] for d in (as_dict, terminal)]
    assert names == [["Tesla T4"], ["Tesla T4"]]


def test_inspect_and_monitor_take_one_set_of_options_in_both_front_ends() -> None:
    from gpudiag.cli import monitor as cli_monitor
    from gpudiag.commands import inspect as cli_inspect
    from gpudiag.magics import inspect as magic_inspect
    from gpudiag.magics import monitor as magic_monitor

    assert _options(cli_inspect.add_arguments) == _options(magic_inspect.add_arguments)
    assert _options(cli_inspect.add_arguments) == {"--json", "--replay", "--topology"}
    shared = {"--interval", "--replay", "--exporter", "--endpoint", "--devices"}
    shared |= {"--prometheus", "--selector"}
    assert _options(cli_monitor.add_arguments) == shared | {"--duration", "--refresh", "--json"}
    assert _options(magic_monitor.add_arguments) == shared | {"--history"}
