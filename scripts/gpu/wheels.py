"""The wheel folder that travels to a GPU machine without network (``make gpu-wheels``).

The GPU machine's Python (3.12, CUDA PyTorch) lacks some of gpudiag's dependencies and has no
network. This script resolves what it lacks once, for CPython 3.12 on manylinux x86_64, into
``scripts/gpu/wheels.lock.json`` (committed), and fills the ignored folder ``.gpu-wheels/``
from that lock: one wheel per missing distribution, the spare wheels in ``spare/`` (packages
the machine has, carried in case its version is older than a carried wheel needs) and
gpudiag's own wheel. ``scripts/gpu/check_offline.sh`` installs them there with ``--no-index``.

    python scripts/gpu/wheels.py lock        # resolve again (needs an index), rewrite the lock
    python scripts/gpu/wheels.py download    # fill .gpu-wheels/ from the lock (needs an index)
    python scripts/gpu/wheels.py check       # the folder against the lock, and what travels
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "scripts" / "gpu"
LOCK = HERE / "wheels.lock.json"
IMAGE = HERE / "image-packages.txt"
FOLDER = REPO / ".gpu-wheels"
SPARE = "spare"

PYTHON_VERSION = "3.12"
# torch's own wheels need glibc 2.28, so the machine that runs torch 2.11 has at least that.
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_12_x86_64",
    "manylinux2010_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)
# The environment markers are evaluated in: the GPU machine's Python.
MARKER_ENV = {
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "platform_system": "Linux",
    "python_full_version": "3.12.3",
    "python_version": PYTHON_VERSION,
    "sys_platform": "linux",
    "extra": "",
}
# Never carried: they would shadow the machine's CUDA build of torch and its libraries.
NEVER = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*)$")
TRAVEL_LIMIT = 64 << 20  # what may travel to the machine: the working tree and the folder
WHEEL_LIMIT = 32 << 20  # the folder's own share, so the repository keeps room to grow


def normalize(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages(path: Path = IMAGE) -> set[str]:
    """The distributions the GPU machine's image holds (image-packages.txt)."""
    lines = path.read_text().splitlines()
    return {normalize(line.strip()) for line in lines if line.strip() and not line.startswith("#")}


def runtime_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """``[project] dependencies`` of pyproject.toml, as written."""
    import tomllib

    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def requirement_name(requirement: str) -> str:
    from packaging.requirements import Requirement

    return normalize(Requirement(requirement).name)


def applies(requirement: str) -> bool:
    """Whether a Requires-Dist line applies on the GPU machine (no extra, Linux, CPython 3.12)."""
    from packaging.requirements import Requirement

    marker = Requirement(requirement).marker
    return marker is None or marker.evaluate(MARKER_ENV)


def missing_direct(image: set[str] | None = None) -> list[str]:
    """The runtime requirements of gpudiag that the GPU machine's image lacks."""
    image = image_packages() if image is None else image
    return [r for r in runtime_requirements() if requirement_name(r) not in image]


def _platform_args() -> list[str]:
    args = ["--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp"]
    args += ["--abi", "cp" + PYTHON_VERSION.replace(".", ""), "--abi", "abi3", "--abi", "none"]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    return args


def _pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", *args]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def resolve(requirements: list[str]) -> dict[str, Any]:
    """pip's resolution report for ``requirements`` on the GPU machine's Python (a dry run)."""
    with tempfile.TemporaryDirectory(prefix="gpudiag-lock-") as tmp:
        report = Path(tmp) / "report.json"
        target = str(Path(tmp) / "target")  # never written: a dry run
        _pip(
            "install", "--dry-run", "--ignore-installed", "--quiet", "--target", target,
            "--report", str(report), *_platform_args(), *requirements,
        )  # fmt: skip
        return dict(json.loads(report.read_text()))


def closure(report: dict[str, Any], roots: list[str]) -> dict[str, dict[str, Any]]:
    """Every distribution ``roots`` need on the GPU machine: name -> version, requirements.

    pip evaluates environment markers for the Python that runs it; walking the resolved
    metadata again with the GPU machine's markers keeps exactly what that Python needs.
    """
    resolved = {}
    for item in report["install"]:
        meta = item["metadata"]
        resolved[normalize(meta["name"])] = {
            "version": meta["version"],
            "requires": sorted(r for r in meta.get("requires_dist", []) if applies(r)),
        }
    needed: dict[str, dict[str, Any]] = {}
    todo = [requirement_name(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        if name not in resolved:
            raise SystemExit(f"{name} is needed but pip did not resolve it: resolve on Python 3.12")
        needed[name] = resolved[name]
        todo += [requirement_name(r) for r in resolved[name]["requires"]]
    return dict(sorted(needed.items()))


def make_lock() -> dict[str, Any]:
    image = image_packages()
    direct = missing_direct(image)
    needed = closure(resolve(direct), direct)
    carry = {n: d["version"] for n, d in needed.items() if n not in image}
    spare = {n: d["version"] for n, d in needed.items() if n in image and not NEVER.match(n)}
    bad = sorted(n for n in carry if NEVER.match(n))
    if bad:
        raise SystemExit(f"would carry {', '.join(bad)}: never replace the machine's torch stack")
    return {
        "about": "Wheels the GPU machine's Python lacks (scripts/gpu/wheels.py lock)",
        "python": PYTHON_VERSION,
        "platforms": list(PLATFORMS),
        "direct": direct,
        "carry": carry,
        "spare": spare,
        "requires": {n: d["requires"] for n, d in needed.items()},
    }


def read_lock(path: Path = LOCK) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def _wheel_name(path: Path) -> tuple[str, str]:
    from packaging.utils import parse_wheel_filename

    name, version, _, _ = parse_wheel_filename(path.name)
    return normalize(name), str(version)


def fits_the_machine(path: Path) -> bool:
    """Whether a wheel installs on CPython 3.12, manylinux x86_64 with glibc >= 2.28."""
    from packaging.tags import compatible_tags, cpython_tags
    from packaging.utils import parse_wheel_filename

    platforms = [*PLATFORMS, "any"]
    supported = {
        *cpython_tags((3, 12), platforms=platforms),
        *compatible_tags((3, 12), "cp312", platforms=platforms),
    }
    return bool(set(parse_wheel_filename(path.name)[3]) & supported)


def wheel_requires(path: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA that apply on the GPU machine."""
    with zipfile.ZipFile(path) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    lines = [v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())
             if k == "Requires-Dist"]  # fmt: skip
    return sorted(r for r in lines if applies(r))


def folder_problems(folder: Path = FOLDER, lock: dict[str, Any] | None = None) -> list[str]:
    """What in ``folder`` disagrees with the lock: missing, extra, other versions, two
    versions of one name, a wheel that does not install on the machine, torch."""
    lock = read_lock() if lock is None else lock
    problems: list[str] = []
    for where, expected in (
        (folder, {**lock["carry"], "gpudiag": None}),
        (folder / SPARE, lock["spare"]),
    ):
        wheels = sorted(where.glob("*.whl"))
        seen: dict[str, str] = {}
        for wheel in wheels:
            name, version = _wheel_name(wheel)
            if name in seen:
                problems.append(f"{where.name}/: two versions of {name} ({seen[name]}, {version})")
            seen[name] = version
            if NEVER.match(name):
                problems.append(f"{wheel.name}: the machine's torch stack must never travel")
            if name not in expected:
                problems.append(f"{wheel.name}: not in the lock")
            elif expected[name] is not None and expected[name] != version:
                problems.append(f"{wheel.name}: the lock says {name}=={expected[name]}")
            if not fits_the_machine(wheel):
                problems.append(f"{wheel.name}: does not install on CPython 3.12 manylinux x86_64")
            if name in lock["requires"] and wheel_requires(wheel) != lock["requires"][name]:
                problems.append(f"{wheel.name}: its requirements differ from the lock's")
        for name in sorted(set(expected) - set(seen)):
            problems.append(f"{where.name}/: no wheel of {name}")
    return problems


def lock_problems(lock: dict[str, Any], image: set[str], direct: list[str]) -> list[str]:
    """What the lock leaves uncovered: a runtime requirement or a requirement of a carried
    wheel that neither the image nor the lock provides, or a version outside its range."""
    from packaging.requirements import Requirement

    have = {**lock["carry"], **lock["spare"]}
    problems = []
    wanted = [(r, "gpudiag") for r in direct]
    wanted += [(r, n) for n, reqs in lock["requires"].items() for r in reqs]
    for text, by in wanted:
        req = Requirement(text)
        name = normalize(req.name)
        if name in have:
            if not req.specifier.contains(have[name], prereleases=True):
                problems.append(f"{by} needs {text}; the lock has {name}=={have[name]}")
        elif name not in image:
            problems.append(f"{by} needs {text}: neither the image nor the lock has {name}")
    return problems


def travelling_bytes(folder: Path = FOLDER) -> tuple[int, int]:
    """(the working tree that travels: tracked and untracked-not-ignored files, the folder)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    tree = sum(
        (REPO / os.fsdecode(p)).stat().st_size
        for p in listed
        if p and (REPO / os.fsdecode(p)).is_file()
    )
    wheels = (
        sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0
    )
    return tree, wheels


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def download(folder: Path = FOLDER) -> None:
    lock = read_lock()
    if folder.exists():
        shutil.rmtree(folder)
    (folder / SPARE).mkdir(parents=True)
    pins = [f"{n}=={v}" for n, v in lock["carry"].items()]
    _pip("download", "--no-deps", "--quiet", "-d", str(folder), *_platform_args(), *pins)
    spare = [f"{n}=={v}" for n, v in lock["spare"].items()]
    if spare:
        _pip(
            "download", "--no-deps", "--quiet", "-d", str(folder / SPARE), *_platform_args(), *spare
        )
    _pip("wheel", "--no-deps", "--quiet", "-w", str(folder), str(REPO))


def report(folder: Path = FOLDER) -> int:
    """Print the folder's contents and sizes; 1 when it disagrees with the lock, the lock with
    pyproject.toml, or when it is too big to travel."""
    lock, image = read_lock(), image_packages()
    direct = missing_direct(image)
    problems = lock_problems(lock, image, direct)
    if lock["direct"] != direct:
        problems.append("pyproject.toml's dependencies changed: make gpu-wheels-lock")
    problems += folder_problems(folder, lock) if folder.is_dir() else [f"no {folder}"]
    for wheel in sorted(folder.rglob("*.whl")):
        print(f"  {_mib(wheel.stat().st_size):>9}  {wheel.relative_to(folder)}")
    tree, wheels = travelling_bytes(folder)
    print(
        f"{folder.name}/: {_mib(wheels)}; with the working tree ({_mib(tree)}) "
        f"{_mib(tree + wheels)} travel, of {_mib(TRAVEL_LIMIT)}"
    )
    if wheels > WHEEL_LIMIT:
        problems.append(f"the folder holds {_mib(wheels)}, more than {_mib(WHEEL_LIMIT)}")
    if tree + wheels > TRAVEL_LIMIT:
        problems.append(f"{_mib(tree + wheels)} would travel, more than {_mib(TRAVEL_LIMIT)}")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["lock", "download", "check"])
    parser.add_argument("--folder", type=Path, default=FOLDER)
    args = parser.parse_args(argv)
    if args.action == "lock":
        lock = make_lock()
        problems = lock_problems(lock, image_packages(), lock["direct"])
        for problem in problems:
            print(f"problem: {problem}", file=sys.stderr)
        LOCK.write_text(json.dumps(lock, indent=1) + "\n")
        counts = f"carry {len(lock['carry'])}, spare {len(lock['spare'])}"
        print(f"wrote {LOCK.relative_to(REPO)}: {counts}")
        return 1 if problems else 0
    if args.action == "download":
        download(args.folder)
    return report(args.folder)


if __name__ == "__main__":
    sys.exit(main())
