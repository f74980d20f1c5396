"""`torchrun -m gpudiag doctor|inspect`: two real gloo processes, real collectives, one report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _torchrun(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "gpudiag",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


@pytest.mark.slow
def test_doctor_merges_two_gloo_ranks_into_one_json_document() -> None:
    proc = _torchrun(
        "doctor", "--json", "--set", "seq_len=64", "--steps", "2", "--sizes", "64K", "1M"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)  # rank 0 alone prints, and prints one document
    assert doc["format"] == "gpudiag-distributed-doctor"
    assert doc["world_size"] == 2
    assert doc["backend"] == "gloo"
    ranks = doc["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert len({r["pid"] for r in ranks}) == 2
    for r in ranks:
        assert r["error"] == ""
        assert r["device"] == "cpu"
        assert r["backend"] == "gloo"
        assert len(r["step_s"]) == 2
        assert all(t > 0 for t in r["step_s"])
        assert r["top_ops"]
        assert r["top_ops"][0]["self_ms"] > 0
        assert "gpt" in r["workload"]
    coll = doc["collective"]
    assert coll["op"] == "all_reduce"
    assert coll["world_size"] == 2
    assert not coll["error"]
    assert [row["size_bytes"] for row in coll["rows"]] == [64 << 10, 1 << 20]
    assert all(row["wrong"] == 0 and row["busbw_gbps"] > 0 for row in coll["rows"])
    assert doc["measured_busbw_gbps"] > 0
    assert doc["expected_busbw"]["busbw_gbps"] is None  # CPU ranks: said why, no figure
    assert isinstance(doc["stragglers"], list)


@pytest.mark.slow
def test_a_notebook_starts_the_doctor_job_and_reads_the_report_back() -> None:
    from gpudiag.distributed.run import doctor_job

    report = doctor_job(2, overrides={"seq_len": 32}, steps=1, profile=False, sizes=[4096])
    assert report.world_size == 2
    assert report.backend == "gloo"
    assert [r.rank for r in report.ranks] == [0, 1]
    assert report.collective is not None
    assert report.collective.sizes == (4096,)
    assert report.measured_busbw_gbps is not None
    assert "2 ranks on 1 host" in repr(report)


@pytest.mark.slow
def test_inspect_under_torchrun_gives_every_rank_its_own_report() -> None:
    proc = _torchrun("inspect", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["command"] == "inspect"
    assert doc["world_size"] == 2
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for r in doc["ranks"]:
        assert r["exit_code"] == 0
        assert r["result"]["host"]["hostname"] == r["host"]


def test_doctor_outside_torchrun_is_one_rank_and_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpudiag.cli import main

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    code = main(["doctor", "--json", "--set", "seq_len=32", "--steps", "1", "--no-profile"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert doc["world_size"] == 1
    assert doc["collective"] is None
    assert len(doc["ranks"][0]["step_s"]) == 1
    assert "not a torchrun job" in doc["notes"][0]
    assert main(["doctor", "--workload", "nope", "--steps", "1", "--no-profile"]) == 1
    assert "unknown workload 'nope'" in capsys.readouterr().out
    assert main(["doctor", "--threshold", "-1"]) == 1
    assert "--threshold is a fraction" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["doctor", "--set", "no-equals-sign"])


@pytest.mark.slow
def test_bench_allreduce_under_torchrun_prints_the_job_wide_result_once() -> None:
    proc = _torchrun("bench", "allreduce", "--sizes", "64K", "--repeats", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("=== ranks 0 on ") == 1
    assert ", 1 on " in proc.stdout
    assert proc.stdout.count("CollectiveResult: all_reduce over 2 ranks") == 1
