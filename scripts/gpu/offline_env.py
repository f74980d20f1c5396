"""Helpers of check_offline.sh on the GPU machine: the standard library only (and ``packaging``
where it is importable, else the spare wheel of it), so they run before anything is installed.

    python3 scripts/gpu/offline_env.py torch-id                 # torch's version and folder
    python3 scripts/gpu/offline_env.py unpack --target DIR W..  # install wheels without pip
    python3 scripts/gpu/offline_env.py spares --site DIR --spare DIR
    python3 scripts/gpu/offline_env.py requirements --site DIR  # what is still unmet
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from importlib import metadata
from pathlib import Path


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def torch_id() -> str:
    """torch's installed version and folder, found without importing it (seconds saved on each
    call; the check's first row imports it for real): the same before and after."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise SystemExit("torch is not installed for this Python")
    folder = Path(spec.origin).resolve().parent
    return f"torch {metadata.version('torch')} at {folder}"


def unpack(target: Path, wheels: list[Path]) -> None:
    """A wheel's files into ``target`` (what ``pip install --target`` does for a plain wheel),
    for a Python without pip. Scripts are not needed: the check runs ``python -m``."""
    target.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                parts = member.split("/")
                if ".." in parts or member.startswith("/"):
                    raise SystemExit(f"{wheel.name}: unsafe path {member}")
                if parts[0].endswith(".data"):
                    if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                        continue
                    parts = parts[2:]
                if member.endswith("/"):
                    continue
                out = target.joinpath(*parts)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(zf.read(member))


def _packaging(spare: Path | None) -> bool:
    """Make ``packaging`` importable: the machine's, else the spare wheel (pure Python, so
    importable from the zip)."""
    try:
        import packaging.requirements  # noqa: F401
    except ImportError:
        found = sorted(spare.glob("packaging-*.whl")) if spare is not None else []
        if not found:
            return False
        sys.path.append(str(found[0]))
    return True


def unmet(site: Path) -> list[tuple[str, str, str]]:
    """(distribution, requirement, what is there) for each requirement of a distribution
    installed in ``site`` that the environment (``sys.path``) does not meet."""
    from packaging.requirements import Requirement

    problems = []
    for dist in metadata.distributions(path=[str(site)]):
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                have = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                problems.append((dist.metadata["Name"], text, "not installed"))
                continue
            if not req.specifier.contains(have, prereleases=True):
                problems.append((dist.metadata["Name"], text, f"{req.name} {have}"))
    return problems


def spares_to_install(site: Path, spare: Path) -> list[Path]:
    """The spare wheels whose distribution the environment lacks or has in a version that a
    wheel in ``site`` does not accept: only those shadow the machine's own."""
    from packaging.requirements import Requirement

    wheels = {normalize(w.name.split("-")[0]): w for w in spare.glob("*.whl")}
    names = {normalize(Requirement(text).name) for _, text, _ in unmet(site)}
    return [wheels[n] for n in sorted(names) if n in wheels]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("torch-id")
    p = sub.add_parser("unpack")
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("wheels", type=Path, nargs="+")
    p = sub.add_parser("spares")
    p.add_argument("--site", type=Path, required=True)
    p.add_argument("--spare", type=Path, required=True)
    p = sub.add_parser("requirements")
    p.add_argument("--site", type=Path, required=True)
    p.add_argument("--spare", type=Path)
    args = parser.parse_args(argv)
    if args.action == "torch-id":
        print(torch_id())
    elif args.action == "unpack":
        unpack(args.target, args.wheels)
    elif args.action == "spares":
        if not _packaging(args.spare):
            print("no packaging: the spare wheels are not checked", file=sys.stderr)
            return 0
        for wheel in spares_to_install(args.site, args.spare):
            print(wheel)
    else:
        if not _packaging(args.spare):
            print("requirements not checked: packaging is not installed")
            return 0
        problems = unmet(args.site)
        for dist, text, have in problems:
            print(f"unmet: {dist} needs {text}; here: {have}")
        print("requirements of the installed wheels: " + ("all met" if not problems else
              f"{len(problems)} unmet (the rows of the check say what fails)"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
