"""``gpudiag doctor`` is one command: gd.diagnose in one process, the rank doctor under torchrun
(or when a rank option asks for it); options of the two situations are not mixed."""

from __future__ import annotations

import argparse

import pytest

from gpudiag.cli import build_parser, main
from gpudiag.commands import doctor as command


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["doctor", *argv])


@pytest.fixture
def one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def under_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")


@pytest.mark.usefixtures("one_process")
def test_one_process_is_diagnose_unless_a_rank_option_asks() -> None:
    assert command.on_every_rank(_args("--replay", "x.xml", "--json")) is False
    assert command.on_every_rank(_args("--workload", "mlp", "--steps", "2")) is False
    assert command.on_every_rank(_args("--no-collective")) is True
    assert command.on_every_rank(_args("--set", "seq_len=32")) is True


@pytest.mark.usefixtures("under_torchrun")
def test_under_torchrun_it_is_the_rank_doctor() -> None:
    assert command.on_every_rank(_args("--json")) is True
    assert command.on_every_rank(_args("--workload", "mlp")) is True


@pytest.mark.usefixtures("under_torchrun")
def test_one_process_options_under_torchrun_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["doctor", "--replay", "x.xml"]) == 1
    err = capsys.readouterr().err
    assert "--replay diagnoses one process; under torchrun" in err


@pytest.mark.usefixtures("one_process")
def test_mixing_the_two_situations_names_both(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "--trace", "t.json", "--code", "c.py", "--sizes", "64K"]) == 1
    err = capsys.readouterr().err
    assert "--trace, --code diagnose one process; with --sizes" in err


@pytest.mark.usefixtures("one_process")
def test_each_situation_gets_its_own_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def fake_doctor(**kwargs: object) -> None:
        seen.update(kwargs)

    import gpudiag.distributed.run as run

    monkeypatch.setattr(run, "doctor", fake_doctor)
    assert main(["doctor", "--no-profile"]) == 0
    assert (seen["workload"], seen["steps"], seen["threshold"]) == ("gpt", 5, 0.10)
    assert seen["overrides"] == {"seq_len": 256}
    assert seen["profile"] is False
