"""A cell under %%gpudiag compare / doctor / memory that calls sys.exit, is interrupted, fails
after a chdir, or does not compile: reported as what it is, never SystemExit out of the magic,
and the notebook's state (objects, working directory, sys.argv, environment) restored."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch

LINES = {
    "compare": "compare --fix precision.bf16 --budget 2 --min-rounds 2",
    "doctor": "doctor --no-widget --no-scaling --steps 1",
    "memory": "memory",
}
STEP = "loss = model(x).pow(2).mean()\nloss.backward(); opt.step(); opt.zero_grad()\n"


@pytest.fixture
def ip(ipython_shell: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.chdir(tmp_path)
    ns = ipython_shell.user_ns
    ns["model"] = torch.nn.Linear(8, 8)
    ns["opt"] = torch.optim.SGD(ns["model"].parameters(), lr=0.1)
    ns["x"] = torch.randn(4, 8)
    before = (
        os.getcwd(),
        list(sys.argv),
        {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"},
        {k: v.clone() for k, v in ns["model"].state_dict().items()},
    )
    yield ipython_shell
    assert os.getcwd() == before[0]
    assert sys.argv == before[1]
    assert {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"} == before[2]
    after = ns["model"].state_dict()
    assert all(torch.equal(after[k], v) for k, v in before[3].items())
    for name in ("model", "opt", "x", "loss"):
        ns.pop(name, None)


@pytest.mark.parametrize("magic", list(LINES))
def test_sys_exit_in_the_cell_is_reported_not_raised(
    magic: str, ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    cell = STEP + "import sys, os\nos.chdir('/')\nsys.argv.append('--x')\nsys.exit(2)\n"
    assert ip.run_cell_magic("gpudiag", LINES[magic], cell) is None  # no SystemExit out
    out = capsys.readouterr().out
    assert "sys.exit(2)" in out
    assert out.startswith("gpudiag: ") or "\ngpudiag: " in out


@pytest.mark.parametrize("magic", ["compare", "memory"])
def test_keyboard_interrupt_is_raised_as_what_it_is_with_the_state_restored(
    magic: str, ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    cell = STEP + "import os\nos.environ['GPUDIAG_LEAK'] = '1'\nraise KeyboardInterrupt\n"
    with pytest.raises(KeyboardInterrupt):
        ip.run_cell_magic("gpudiag", LINES[magic], cell)
    assert "interrupted (KeyboardInterrupt)" in capsys.readouterr().out


def test_a_cell_that_fails_after_a_chdir_leaves_the_notebook_where_it_was(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    cell = STEP + "import os\nos.chdir('/')\nraise RuntimeError('my cell broke')\n"
    assert ip.run_cell_magic("gpudiag", LINES["memory"], cell) is None
    assert "RuntimeError: my cell broke" in capsys.readouterr().out


@pytest.mark.parametrize("magic", list(LINES))
def test_a_cell_that_does_not_compile_is_a_gpudiag_message(
    magic: str, ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ip.run_cell_magic("gpudiag", LINES[magic], "x = = 1\n") is None
    assert "the cell does not compile (SyntaxError on line 1" in capsys.readouterr().out
