"""gd.compare(..., nproc=N) reaches the multi-rank trial (a layer above experiment) through a
hand-off the package facade registers, never through an upward import."""

from __future__ import annotations

import subprocess
import sys

import pytest

import gpudiag as gd
from gpudiag import _handoff


def test_the_nproc_handoff_is_the_distributed_launcher() -> None:
    from gpudiag.distributed.compare import compare_distributed
    from gpudiag.experiment import distributed

    assert distributed.compare_distributed is compare_distributed
    assert "nproc" in distributed.compare_distributed.__code__.co_varnames


def test_experiment_loads_the_launcher_only_when_a_trial_asks_for_it() -> None:
    code = (
        "import sys\n"
        "import gpudiag.experiment.compare\n"
        "import gpudiag.experiment.distributed as d\n"
        "print('gpudiag.distributed.compare' in sys.modules)\n"
        "d.compare_distributed\n"
        "print('gpudiag.distributed.compare' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


def test_an_unregistered_handoff_is_a_gpudiag_error() -> None:
    with pytest.raises(gd.GpuDiagError, match="nothing is registered to handle 'nowhere'"):
        _handoff.get("nowhere")


def test_a_registered_callable_is_returned_as_is() -> None:
    def target() -> str:
        return "ran"

    _handoff.register("test.target", target)
    try:
        assert _handoff.get("test.target")() == "ran"
    finally:
        _handoff._handoffs.pop("test.target")


def test_an_unknown_attribute_of_the_handoff_module_is_an_attribute_error() -> None:
    from gpudiag.experiment import distributed

    with pytest.raises(AttributeError, match="no attribute 'launch'"):
        distributed.launch  # noqa: B018
