"""A failing rank is reported by its own error (the first failure), and no rank outlives the call.

The real multi-rank cases start torchrun with 2 gloo ranks; after each, the processes that carry
the job's marker (gpudiag.probe.jobs) are counted with psutil: none may be left.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import gpudiag as gd
from gpudiag._rank_exit import ERRORS_DIR, RankFailure, first_failure, rank_failures
from gpudiag.errors import DistributedError
from gpudiag.probe import jobs

LOST_PEER = (
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
    "[127.0.0.1]:4242"
)


def _write(folder: Path, rank: int, when: float, kind: str, message: str) -> None:
    data = {"rank": str(rank), "time": when, "type": kind, "message": message}
    (folder / f"rank-{rank}.json").write_text(json.dumps(data))


def test_the_ranks_own_error_comes_first_even_when_it_was_written_last(tmp_path: Path) -> None:
    # Under load the survivor may write its "connection closed" before the crashed rank's
    # own error reaches the disk: the cause still comes first.
    _write(tmp_path, 0, 100.0, "DistBackendError", f"Gloo connectFullMesh failed with {LOST_PEER}")
    _write(tmp_path, 1, 100.5, "ValueError", "boom from rank 1's own workload")
    failures = rank_failures(tmp_path)
    assert [f.rank for f in failures] == ["1", "0"]
    text = first_failure(failures, "")
    assert text.startswith(
        "rank 1: ValueError: boom from rank 1's own workload (the first failure)"
    )
    assert "then rank 0: DistBackendError" in text


def test_among_causes_the_earliest_is_first_and_signals_are_named(tmp_path: Path) -> None:
    _write(tmp_path, 0, 5.0, "RuntimeError", "second")
    _write(tmp_path, 1, 4.0, "KeyError", "'arms'")
    (tmp_path / "rank-x.json").write_text("{not json")  # a torn file is skipped
    assert [f.rank for f in rank_failures(tmp_path)] == ["1", "0"]
    torchrun_says = "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 77)\n"
    only_lost = [RankFailure("0", 1.0, "RuntimeError", LOST_PEER)]
    assert first_failure(only_lost, torchrun_says).startswith("rank 1 was killed by SIGKILL")
    assert first_failure([], "RuntimeError: x\nValueError: y") == "RuntimeError: x | ValueError: y"


def _compare(spec: str, timeout_s: float) -> None:
    gd.compare(
        spec,
        fixes=["fsdp.wrap"],
        nproc=2,
        rounds=1,
        steps_per_round=1,
        memory_steps=1,
        timeout_s=timeout_s,
    )


@pytest.fixture
def job_tags(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = jobs.uuid.uuid4

    class _Id:
        def __init__(self) -> None:
            self.hex = real().hex
            seen.append(self.hex)

    monkeypatch.setattr(jobs.uuid, "uuid4", _Id)
    monkeypatch.delenv(ERRORS_DIR, raising=False)
    return seen


@pytest.mark.slow
def test_a_rank_that_crashes_is_reported_by_its_own_error(job_tags: list[str]) -> None:
    with pytest.raises(DistributedError) as info:
        _compare("tests.distributed.wl_factory:rank1_crashes", 300)
    text = str(info.value)
    assert text.startswith("the 2-rank trial failed: rank 1: ValueError: boom from rank 1's own")
    assert "(the first failure)" in text
    assert [p for tag in job_tags for p in jobs.job_processes(tag)] == []


@pytest.mark.slow
def test_a_rank_that_hangs_ends_at_the_timeout_with_every_rank(job_tags: list[str]) -> None:
    t0 = time.perf_counter()
    with pytest.raises(DistributedError, match=r"did not finish within its 20 s timeout"):
        _compare("tests.distributed.wl_factory:rank1_hangs", 20)
    assert time.perf_counter() - t0 < 120
    assert [p for tag in job_tags for p in jobs.job_processes(tag)] == []
