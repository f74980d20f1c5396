"""Record what this machine is, for the tests: nvidia-smi, topology, snapshot, traces, bench.

``gpudiag record OUT_DIR`` writes each file with a ``manifest.json`` that gives its provenance
(GPU, driver, CUDA, torch, date, the command that made it). What this machine cannot give (no
GPU: no ``nvidia-smi``, no memory snapshot) is listed as N/A with the reason, so a recording
of a CPU host says it is one. Copy the folder into ``tests/fixtures/recorded/`` and every file
becomes a CI test (``tests/cli/test_record.py`` replays them all; see CONTRIBUTING.md).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpudiag._values import arg_float
from gpudiag.errors import GpuDiagError, ReplayError

MANIFEST = "manifest.json"
FORMAT = "gpudiag.recording"
VERSION = 1
OK, NOT_AVAILABLE, FAILED = "ok", "n/a", "failed"

# kinds of file -> how a test replays them (replay_recording below)
KINDS = ("nvidia-smi", "topology", "snapshot", "monitor", "trace", "bench", "memory-snapshot")


@dataclass(frozen=True)
class RecordedFile:
    """One entry of the manifest: a file (or why there is none) and the command behind it."""

    kind: str
    file: str
    command: str
    status: str
    reason: str = ""
    bytes: int = 0
    seconds: float = 0.0


class _Recorder:
    def __init__(self, out: Path, say: Callable[[str], None]) -> None:
        self.out = out
        self.say = say
        self.entries: list[RecordedFile] = []

    def add(self, kind: str, file: str, command: str, make: Callable[[Path], str | None]) -> None:
        """``make(path)`` writes the file and returns None, or returns why it could not."""
        path = self.out / file
        path.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        try:
            reason = make(path)
            status = OK if reason is None else NOT_AVAILABLE
        except Exception as exc:  # a recording keeps what it can; the manifest says what failed
            reason, status = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}", FAILED
        if status != OK and path.exists():
            path.unlink()
        size = path.stat().st_size if status == OK else 0
        entry = RecordedFile(
            kind, file, command, status, reason or "", size, round(time.perf_counter() - start, 2)
        )
        self.entries.append(entry)
        self.say(f"  {status:6} {file:32} {reason or f'{size:,} bytes'}")


def _smi(args: tuple[str, ...]) -> Callable[[Path], str | None]:
    def make(path: Path) -> str | None:
        from gpudiag.probe.capture import nvidia_smi

        reading = nvidia_smi(*args)
        if not reading.ok:
            return reading.reason
        path.write_text(str(reading.value))
        return None

    return make


def _demo_step(name: str, device: str, size: dict[str, Any]) -> Callable[[], Any]:
    """One training step of a demo workload (forward, loss, backward, optimizer)."""
    from gpudiag import workloads
    from gpudiag.step import Step

    training = Step.of(workloads.get(name, device=device, **size))
    training.new_optimizer()

    def step() -> None:
        training.run()

    step.__name__ = f"record_{name}"
    return step


# Demo sizes: a GPU gets a step that keeps it busy; a CPU host a tiny one (a small recording).
_GPU_DEMOS = {
    "gpt": {"seq_len": 1024, "batch_size": 8, "d_model": 512, "n_layer": 4, "n_head": 8},
    "mlp": {},
}
_CPU_DEMOS = {
    "gpt": {"seq_len": 64, "batch_size": 2, "d_model": 64, "n_layer": 2, "n_head": 2},
}


def _trace(name: str, device: str, size: dict[str, Any]) -> Callable[[Path], str | None]:
    def make(path: Path) -> str | None:
        import gpudiag as gd

        step = _demo_step(name, device, size)
        # No Python stacks: they would carry this machine's file paths into the recording.
        report = gd.profile(
            step, steps=2, warmup=1, trace_dir=path.parent, with_stack=False, progress=False
        )
        Path(report.rank().path).replace(path)
        return None

    return make


def _provenance(report: Any, argv: list[str]) -> dict[str, Any]:
    from gpudiag._version import __version__

    host, torch_info = report.host, report.host.torch
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["gpudiag", "record", *argv]),
        "gpudiag": __version__,
        "has_gpu": report.has_gpu,
        "gpus": [g.name for g in report.gpus],
        "no_gpu_reason": report.no_gpu_reason,
        "driver": report.driver.driver_version.get(None),
        "cuda_driver": report.driver.cuda_driver_version.get(None),
        "torch": torch_info.version.get(None),
        "torch_cuda": torch_info.cuda_build.get(None),
        "python": host.python,
        "os": host.os,
        "cpu": host.cpu_model.get(None),
        "logical_cores": host.logical_cores.get(None),
    }


def record(
    out_dir: str | Path,
    *,
    monitor_s: float = 3.0,
    bench: bool = True,
    traces: bool = True,
    argv: list[str] | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Write the recording into ``out_dir`` (new or empty) and return its manifest."""
    import gpudiag as gd
    from gpudiag.probe import cuda

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise GpuDiagError(
            f"{out} exists and is not a folder: gpudiag record writes a folder of files; name a "
            "new one (nothing was written)"
        )
    if out.exists() and any(out.iterdir()):
        raise GpuDiagError(f"{out} is not empty: record into a new folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GpuDiagError(f"cannot create the folder {out}: {exc.strerror or exc}") from None
    report = gd.inspect()
    on_gpu = cuda.available()
    device = "cuda" if on_gpu else "cpu"
    say(f"gpudiag record: {', '.join(g.name for g in report.gpus) or report.no_gpu_reason}")
    rec = _Recorder(out, say)
    for file, args in (
        ("nvidia-smi-q-x.xml", ("-q", "-x")),
        ("nvidia-smi-q.txt", ("-q",)),
        ("nvidia-smi.txt", ()),
    ):
        rec.add("nvidia-smi", file, shlex.join(["nvidia-smi", *args]), _smi(args))
    rec.add("topology", "topo-m.txt", "nvidia-smi topo -m", _smi(("topo", "-m")))
    rec.add("topology", "topo-p2p-r.txt", "nvidia-smi topo -p2p r", _smi(("topo", "-p2p", "r")))

    def snapshot(path: Path) -> None:
        path.write_text(json.dumps(report.to_dict(), indent=1) + "\n")

    rec.add("snapshot", "snapshot.json", "gpudiag inspect --json", snapshot)

    def monitor(path: Path) -> None:
        m = gd.monitor(interval=0.1, display=False)
        try:
            time.sleep(monitor_s)
        finally:
            m.stop()
        m.save(path, label="gpudiag record")

    rec.add("monitor", "monitor.jsonl", f"gd.monitor(interval=0.1) for {monitor_s:g} s", monitor)
    if traces:
        for name, size in (_GPU_DEMOS if on_gpu else _CPU_DEMOS).items():
            command = f"gd.profile(demo {name} training step on {device}, steps=2, warmup=1)"
            rec.add("trace", f"traces/{name}.pt.trace.json.gz", command, _trace(name, device, size))
    if bench:
        rec.add("bench", "bench.json", _BENCH_COMMAND, lambda p: _bench(p, on_gpu))

    def memory(path: Path) -> str | None:
        from gpudiag.probe.capture import cuda_memory_snapshot

        def two_steps() -> None:
            step = _demo_step("gpt", device, _GPU_DEMOS["gpt"])
            step()
            step()

        reading = cuda_memory_snapshot(path, two_steps)
        return None if reading.ok else reading.reason

    rec.add("memory-snapshot", "memory-snapshot.pickle", "torch.cuda.memory._dump_snapshot", memory)
    provenance = _provenance(report, list(argv) if argv is not None else [str(out_dir)])
    if not report.has_gpu:
        provenance["note"] = (
            "no NVIDIA GPU on this machine: this recording holds the host (CPU, memory, torch), "
            "CPU traces and CPU benchmarks; the GPU files are N/A with the reason"
        )
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "provenance": provenance,
        "files": [asdict(e) for e in rec.entries],
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


_BENCH_COMMAND = "gd.bench.matmul / bandwidth / attention (short runs, see bench.json)"


def _bench(path: Path, on_gpu: bool) -> None:
    import gpudiag as gd

    results: dict[str, Any]
    if on_gpu:
        results = {
            "matmul": gd.bench.matmul(sizes=[4096, 8192], progress=False, max_time_s=1.0),
            "bandwidth": gd.bench.bandwidth(progress=False, max_time_s=1.0),
            "attention": gd.bench.attention(seq_lens=[1024, 4096], progress=False, max_time_s=1.0),
        }
    else:
        results = {
            "matmul": gd.bench.matmul(sizes=[256, 512], progress=False, max_time_s=0.5),
            "bandwidth": gd.bench.bandwidth(sizes=[16 << 20], progress=False, max_time_s=0.5),
            "attention": gd.bench.attention(
                seq_lens=[256], backends=["flash", "math"], progress=False, max_time_s=0.5
            ),
        }
    path.write_text(json.dumps({k: v.to_dict() for k, v in results.items()}, indent=1) + "\n")


# --- reading a recording back ------------------------------------------------------------


def load_manifest(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except OSError as exc:
        raise ReplayError(f"no recording at {folder}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ReplayError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ReplayError(f"{path} is not a gpudiag recording manifest")
    if manifest.get("version") != VERSION:
        raise ReplayError(
            f"recording version {manifest.get('version')!r} is not supported "
            f"(this gpudiag reads {VERSION}); upgrade gpudiag"
        )
    return manifest


def _recorded(manifest: dict[str, Any], kind: str) -> Iterator[dict[str, Any]]:
    for entry in manifest.get("files", []):
        if entry.get("kind") == kind and entry.get("status") == OK:
            yield entry


def replay_recording(folder: str | Path) -> list[str]:
    """Load every recorded file through gpudiag's replay paths; the files replayed.

    Raises ReplayError (or the loader's own GpuDiagError) on the first file that does not load.
    """
    import gpudiag as gd
    from gpudiag.probe.replay import ReplayBackend
    from gpudiag.probe.session_replay import SessionRecording
    from gpudiag.probe.topology import load_topology

    root = Path(folder)
    manifest = load_manifest(root)
    done: list[str] = []
    for entry in [*_recorded(manifest, "nvidia-smi"), *_recorded(manifest, "snapshot")]:
        backend = ReplayBackend.from_file(root / entry["file"])
        if backend.gpu_count().get(0) < 1 and entry["kind"] == "nvidia-smi":
            raise ReplayError(f"{entry['file']} holds no GPU")
        done.append(entry["file"])
    topology = [root / e["file"] for e in _recorded(manifest, "topology")]
    if topology:
        load_topology(*topology)
        done.extend(p.name for p in topology)
    for entry in _recorded(manifest, "monitor"):
        session = SessionRecording.load(root / entry["file"])
        if len(session.t) == 0:
            raise ReplayError(f"{entry['file']} holds no samples")
        done.append(entry["file"])
    for entry in _recorded(manifest, "trace"):
        gd.analyze_trace(root / entry["file"], progress=False)
        done.append(entry["file"])
    for entry in _recorded(manifest, "bench"):
        data = json.loads((root / entry["file"]).read_text())
        if not isinstance(data, dict) or "matmul" not in data:
            raise ReplayError(f"{entry['file']} holds no bench results")
        done.append(entry["file"])
    for entry in _recorded(manifest, "memory-snapshot"):
        if (root / entry["file"]).stat().st_size == 0:
            raise ReplayError(f"{entry['file']} is empty")
        done.append(entry["file"])
    return done


# --- command line ------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", metavar="OUT_DIR", help="a new (or empty) folder to write")
    parser.add_argument(
        "--monitor-seconds",
        type=arg_float(),
        default=3.0,
        help="length of the monitor session",
    )
    parser.add_argument("--no-bench", action="store_true", help="skip the benchmarks")
    parser.add_argument("--no-traces", action="store_true", help="skip the profiler traces")


def run(args: argparse.Namespace) -> int:
    if args.monitor_seconds <= 0 or args.monitor_seconds > 600:
        raise GpuDiagError("--monitor-seconds must be between 0 and 600")
    manifest = record(
        args.out_dir,
        monitor_s=args.monitor_seconds,
        bench=not args.no_bench,
        traces=not args.no_traces,
        argv=[
            str(args.out_dir),
            *(
                ["--monitor-seconds", f"{args.monitor_seconds:g}"]
                if args.monitor_seconds != 3
                else []
            ),
            *(["--no-bench"] if args.no_bench else []),
            *(["--no-traces"] if args.no_traces else []),
        ],
    )
    files = manifest["files"]
    failed = [f for f in files if f["status"] == FAILED]
    ok_count = sum(f["status"] == OK for f in files)
    print(f"wrote {ok_count} files and {MANIFEST} to {args.out_dir}")
    note = manifest["provenance"].get("note")
    if note:
        print(f"note: {note}")
    return 1 if failed else 0
