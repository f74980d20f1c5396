"""Fuzz every public entry point that reads user data: the real fixtures, mutated.

Each reader gets files (or values) made from the recorded real data by truncation, byte flips
and NUL bytes, numbers replaced by Unicode digits, huge, negative and non-finite ones, deep
nesting, and special files (``/dev/zero``, a folder, an empty file). Every call must return or
raise a ``GpuDiagError`` (an argparse type: ``ArgumentTypeError``, which argparse reports), and
finish within its deadline; anything else is listed. The seed is fixed and the number of cases
per reader small, so the whole file stays within a few tens of seconds on a loaded machine.
(Trace and memory-snapshot readers are fuzzed with their own tests.)
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpudiag._deadline import deadline
from gpudiag.errors import GpuDiagError, StepTimeoutError
from tests.conftest import FIXTURES

SEED = 20_260_527
CASES_PER_READER = 12
CALL_DEADLINE_S = 10.0

NUMBER = re.compile(rb"[0-9]+(?:\.[0-9]+)?")
REPLACEMENTS = [
    "²".encode(), "٣".encode(), "\uff11\uff12".encode(), b"1" * 400, b"nan", b"Infinity", b"-1",
    b"1e400", b"0", b"-0.0", b"9" * 20,
]  # fmt: skip


def mutations(data: bytes, rng: random.Random, *, nest: tuple[bytes, bytes]) -> Iterator[bytes]:
    """Hostile variants of one real file."""
    cut = rng.randrange(1, max(2, len(data)))
    yield data[:cut]  # truncated
    flipped = bytearray(data)
    for _ in range(8):
        flipped[rng.randrange(len(flipped))] = rng.randrange(256)
    yield bytes(flipped)
    pos = rng.randrange(len(data))
    yield data[:pos] + b"\0" + data[pos:]
    numbers = list(NUMBER.finditer(data))
    for _ in range(6):
        if not numbers:
            break
        match = rng.choice(numbers)
        yield data[: match.start()] + rng.choice(REPLACEMENTS) + data[match.end() :]
    open_, close = nest
    depth = 20_000
    pos = rng.randrange(len(data))
    yield data[:pos] + open_ * depth + close * depth + data[pos:]


SPECIAL = ["/dev/zero", "FOLDER", "EMPTY"]


def _files(tmp_path: Path, sources: list[Path], nest: tuple[bytes, bytes]) -> list[Path]:
    rng = random.Random(SEED)
    out: list[Path] = []
    (tmp_path / "folder").mkdir()
    (tmp_path / "empty").write_bytes(b"")
    out += [Path("/dev/zero"), tmp_path / "folder", tmp_path / "empty"]
    for source in sources:
        data = source.read_bytes()
        for i, variant in enumerate(mutations(data, rng, nest=nest)):
            path = tmp_path / f"{source.stem}.{i}{source.suffix}"
            path.write_bytes(variant)
            out.append(path)
    rng.shuffle(out)
    return out[: CASES_PER_READER + 3]


def _run_all(name: str, calls: list[tuple[str, Callable[[], Any]]]) -> list[str]:
    """Each call under a deadline; what ended in anything but success or a gpudiag error."""
    problems = []
    for label, call in calls:
        try:
            with deadline(CALL_DEADLINE_S, f"{name} on {label}"):
                call()
        except StepTimeoutError as exc:
            problems.append(f"{label}: hang: {exc}")
        except (GpuDiagError, argparse.ArgumentTypeError):
            pass
        except Exception as exc:
            problems.append(f"{label}: {type(exc).__name__}: {str(exc)[:120]}")
    return problems


def _pick(folder: str, pattern: str, n: int = 2) -> list[Path]:
    return sorted((FIXTURES / folder).glob(pattern))[:n]


def test_replay_recordings(tmp_path: Path) -> None:
    from gpudiag.probe.replay import ReplayBackend

    sources = [
        *_pick("nvidia-smi-xml", "*.xml", 2),
        *_pick("nvidia-smi-text", "*.txt", 2),
        *_pick("recorded", "*/snapshot.json", 1),
    ]
    files = _files(tmp_path, sources, (b"<gpu>", b"</gpu>"))
    calls = [(p.name, lambda p=p: ReplayBackend.from_file(p)) for p in files]
    assert _run_all("ReplayBackend.from_file", calls) == []


def test_topologies(tmp_path: Path) -> None:
    from gpudiag.probe.nccl_topo import parse_nccl_topo_xml
    from gpudiag.probe.topology import load_topology

    (tmp_path / "m").mkdir()
    matrices = _files(tmp_path / "m", _pick("topo-matrix", "*.txt", 3), (b"[", b"]"))
    (tmp_path / "x").mkdir()
    xmls = _files(tmp_path / "x", _pick("nccl-topo-xml", "*topo.xml", 2), (b"<pci>", b"</pci>"))
    calls = [(p.name, lambda p=p: load_topology(p)) for p in matrices]
    calls += [(p.name, lambda p=p: parse_nccl_topo_xml(p)) for p in xmls]
    assert _run_all("topology readers", calls) == []


def test_nccl_tests_logs(tmp_path: Path) -> None:
    from gpudiag.analysis.nccl import parse_nccl_tests_all

    files = _files(tmp_path, _pick("nccl-tests", "*nccl_all*.log", 2), (b"[", b"]"))
    calls = [(p.name, lambda p=p: parse_nccl_tests_all(p)) for p in files]
    assert _run_all("parse_nccl_tests_all", calls) == []


def test_monitor_sessions(tmp_path: Path) -> None:
    from gpudiag.probe.session_replay import SessionRecording

    files = _files(tmp_path, _pick("recorded", "*/monitor.jsonl", 1), (b"[", b"]"))
    calls = [(p.name, lambda p=p: SessionRecording.load(p)) for p in files]
    assert _run_all("SessionRecording.load", calls) == []


def _config_variants(rng: random.Random) -> Iterator[Any]:
    base = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 9}
    hostile: list[Any] = [
        float("nan"), float("inf"), -float("inf"), 1e300, 10**30, -3, 0, 2.5, "²", "٣", "four",
        [64], {"a": 1}, None, True, "", "9" * 40,
    ]  # fmt: skip
    for _ in range(CASES_PER_READER):
        cfg = dict(base)
        for key in rng.sample(
            [*base, "max_position_embeddings", "intermediate_size", "num_key_value_heads",
             "head_dim", "num_local_experts", "tie_word_embeddings", "architectures",
             "model_type", "hidden_act"], 2,
        ):  # fmt: skip
            cfg[key] = rng.choice(hostile)
        yield cfg
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    yield {**base, "architectures": deep}
    yield {**base, "hidden_act": deep, "model_type": deep}
    yield deep
    yield "not a config"


def test_model_configs_as_values() -> None:
    import gpudiag as gd

    rng = random.Random(SEED)
    calls: list[tuple[str, Callable[[], Any]]] = []
    for i, cfg in enumerate(_config_variants(rng)):
        calls.append((f"estimate #{i}", lambda c=cfg: gd.estimate_memory(c, seq_len=64)))
        calls.append((f"plan #{i}", lambda c=cfg: gd.plan(c, gpus=8, seq_len=64)))
    assert _run_all("config values", calls) == []


def test_model_configs_as_files(tmp_path: Path) -> None:
    from gpudiag.commands.memory import add_arguments, compute

    base = json.dumps({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4})
    source = tmp_path / "config.json"
    source.write_text(base)
    files = _files(tmp_path, [source], (b"[", b"]"))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    calls = [(p.name, lambda p=p: compute(parser.parse_args(["--config", str(p)]))) for p in files]
    assert _run_all("gpudiag memory --config", calls) == []


def test_recipes(tmp_path: Path) -> None:
    from gpudiag.recipe import Recipe

    source = tmp_path / "recipe.json"
    Recipe.of(["precision.bf16", "nccl.env:NCCL_ALGO=Ring", "batch.size:micro_batch=4"]).save(
        source
    )
    files = _files(tmp_path, [source], (b"[", b"]"))

    def load_and_export(path: Path) -> None:
        recipe = Recipe.load(path)
        recipe.to_env()
        recipe.torchrun_command()
        recipe.to_python()

    calls = [(p.name, lambda p=p: load_and_export(p)) for p in files]
    assert _run_all("Recipe.load", calls) == []


def test_values_from_command_lines_and_the_environment() -> None:
    from gpudiag.analysis.memory_estimate import Parallelism
    from gpudiag.commands.bench import byte_size, matmul_size
    from gpudiag.commands.compare import parse_overrides
    from gpudiag.commands.devices import parse_devices
    from gpudiag.distributed.group import rank_env
    from gpudiag.experiment.memory_report import parse_budget
    from gpudiag.workloads import checked_overrides

    rng = random.Random(SEED)
    words = [
        "²", "٣", "\uff11", "nan", "inf", "-1", "0", "1e400", "9" * 40, "", " ", "abc", "1.5", "2",
        "GPU-1234", "a,b", "64K", "1.2.3", "\0", "fsdp:²", "tp:0", "ddp:4,tp:2",
    ]  # fmt: skip
    calls: list[tuple[str, Callable[[], Any]]] = []
    for _ in range(CASES_PER_READER * 3):
        w = rng.choice(words)
        key = rng.choice(["seq_len", "d_model", "n_layer", "dropout", "lr", "seed"])
        calls += [
            (f"budget {w!r}", lambda w=w: parse_budget(w + rng.choice(["", "GiB", "MB"]))),
            (f"devices {w!r}", lambda w=w: parse_devices(w)),
            (f"parallelism {w!r}", lambda w=w: Parallelism.parse(w)),
            (f"byte_size {w!r}", lambda w=w: byte_size(w)),
            (f"matmul_size {w!r}", lambda w=w: matmul_size(w)),
            (
                f"--set {key}={w!r}",
                lambda w=w, k=key: checked_overrides("gpt", parse_overrides([f"{k}={w}"])),
            ),
            (
                f"RANK={w!r}",
                lambda w=w: rank_env({"RANK": w, "WORLD_SIZE": rng.choice(words)}),
            ),
        ]
    assert _run_all("command-line and environment values", calls) == []


def test_source_code_to_scan() -> None:
    from gpudiag.rules.code import _GLOO as GLOO
    from gpudiag.rules.code import _first, _manual_attention_line

    rng = random.Random(SEED)
    pieces = ["softmax(", "a @ b", ".transpose(-2, -1)", "init_process_group(", "'gloo'", "x"]
    calls: list[tuple[str, Callable[[], Any]]] = []
    for i in range(CASES_PER_READER):
        line = "".join(rng.choice(pieces) for _ in range(20_000))  # one 100 KB+ line
        calls.append((f"line #{i}", lambda t=line: _manual_attention_line(t)))
        calls.append((f"gloo #{i}", lambda t=line: _first(GLOO, t)))
    assert _run_all("code scan", calls) == []


@pytest.mark.parametrize("name", SPECIAL)
def test_special_files_named_anywhere(name: str, tmp_path: Path) -> None:
    from gpudiag.analysis.nccl import parse_nccl_tests_all
    from gpudiag.probe.nccl_topo import parse_nccl_topo_xml
    from gpudiag.probe.replay import ReplayBackend
    from gpudiag.probe.topology import load_topology
    from gpudiag.recipe import Recipe

    path = {"FOLDER": tmp_path, "EMPTY": tmp_path / "empty"}.get(name, Path(name))
    if name == "EMPTY":
        path.write_bytes(b"")
    readers: list[tuple[str, Callable[[], Any]]] = [
        ("replay", lambda: ReplayBackend.from_file(path)),
        ("topology", lambda: load_topology(path)),
        ("nccl topology", lambda: parse_nccl_topo_xml(path)),
        ("nccl-tests", lambda: parse_nccl_tests_all(path)),
        ("recipe", lambda: Recipe.load(path)),
    ]
    assert _run_all(f"readers of {name}", readers) == []
