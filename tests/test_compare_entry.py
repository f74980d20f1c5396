"""gd.compare (gpudiag.trials) is the one entry above both trials: one process
(gpudiag.experiment.compare) or N ranks (gpudiag.distributed.compare), never an upward import."""

from __future__ import annotations

import subprocess
import sys

import pytest

import gpudiag as gd
from gpudiag import workloads


def test_gd_compare_is_the_entry_that_picks_the_trial() -> None:
    from gpudiag.trials import compare

    assert gd.compare is compare
    assert "nproc" in compare.__code__.co_varnames


def test_experiment_never_loads_the_multi_rank_trial() -> None:
    code = (
        "import sys\n"
        "import gpudiag.experiment.compare\n"
        "import gpudiag.trials\n"
        "print('gpudiag.distributed.compare' in sys.modules)\n"
        "from gpudiag.distributed.compare import compare_distributed\n"
        "print('gpudiag.distributed.compare' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


def test_an_unknown_argument_is_a_gpudiag_error_in_one_process() -> None:
    with pytest.raises(gd.GpuDiagError, match="unknown argument"):
        gd.compare(workloads.get("mlp"), ["precision.bf16"], bogus=1)


def test_the_protocol_numbers_are_checked_before_the_ranks_start() -> None:
    with pytest.raises(gd.ArgumentError, match="min_rounds"):
        gd.compare("mlp", ["fsdp.wrap"], nproc=2, min_rounds=0)


def test_the_experiment_package_names_what_trials_build_on() -> None:
    from gpudiag import experiment
    from gpudiag.analysis.verdict import VerdictPlan, judge
    from gpudiag.experiment.comparison import ArmResult, Comparison
    from gpudiag.experiment.runner import Arm

    assert experiment.Arm is Arm
    assert experiment.Comparison is Comparison
    assert experiment.ArmResult is ArmResult
    assert experiment.VerdictPlan is VerdictPlan
    assert experiment.judge is judge
    with pytest.raises(AttributeError, match="no attribute 'nowhere'"):
        experiment.nowhere  # noqa: B018
