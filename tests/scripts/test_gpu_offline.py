"""The GPU check on a GPU machine without network (scripts/gpu/): the wheel lock covers what
the machine's Python lacks, the folder agrees with the lock, the helpers that run there before
anything is installed, the scripts parse, and (slow) a dry run of the one command here."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import REPO

SCRIPTS = REPO / "scripts" / "gpu"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


wheels = _load("wheels")
offline_env = _load("offline_env")


def _wheel(folder: Path, name: str, version: str, tag: str = "py3-none-any", **kw: Any) -> Path:
    """A minimal wheel: METADATA with ``requires`` and the files given as {path: text}."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-{tag}.whl"
    requires = "".join(f"Requires-Dist: {r}\n" for r in kw.get("requires", []))
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\n"
                    f"Version: {version}\n{requires}")  # fmt: skip
        for member, text in kw.get("files", {}).items():
            zf.writestr(member, text)
    return path


# --- the lock: what the GPU machine's Python lacks, resolved for it ------------------------


def test_the_lock_covers_every_runtime_dependency_the_image_lacks() -> None:
    from packaging.requirements import Requirement

    lock, image = wheels.read_lock(), wheels.image_packages()
    assert {"torch", "numpy", "pandas", "pytest", "nvidia-ml-py"} <= image
    missing = wheels.missing_direct(image)
    assert lock["direct"] == missing, "pyproject.toml changed: make gpu-wheels-lock"
    for text in wheels.runtime_requirements():
        req = Requirement(text)
        name = wheels.normalize(req.name)
        if name in image:
            continue
        assert name in lock["carry"], f"{name} is not in the image and not carried"
        assert req.specifier.contains(lock["carry"][name]), text
    # What the image is known to lack (the list) travels.
    assert {"msgspec", "pydantic", "plotly", "ipywidgets", "anywidget", "ipython"} <= set(
        lock["carry"]
    )


def test_every_requirement_of_a_carried_wheel_is_met() -> None:
    lock, image = wheels.read_lock(), wheels.image_packages()
    assert wheels.lock_problems(lock, image, lock["direct"]) == []
    assert not [n for n in (*lock["carry"], *lock["spare"]) if wheels.NEVER.match(n)]
    assert not set(lock["carry"]) & image  # the image's own packages travel only as spares
    assert set(lock["spare"]) <= image


def test_lock_problems_finds_what_is_uncovered() -> None:
    lock = {
        "carry": {"pydantic": "2.14.4", "plotly": "5.0"},
        "spare": {},
        "requires": {"pydantic": ["annotated-types>=0.6", "typing-extensions>=4.16"]},
    }
    problems = wheels.lock_problems(lock, {"typing-extensions"}, ["plotly>=6", "pydantic>=2.6"])
    assert problems == [
        "gpudiag needs plotly>=6; the lock has plotly==5.0",
        "pydantic needs annotated-types>=0.6: neither the image nor the lock has annotated-types",
    ]


def test_the_closure_keeps_what_the_gpu_machines_python_needs() -> None:
    def item(name: str, version: str, *requires: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}

    report = {
        "install": [
            item("IPython", "9.0", "jedi>=0.18", 'typing_extensions>=4.6; python_version < "3.12"',
                 'colorama; sys_platform == "win32"', 'pytest; extra == "test"'),
            item("jedi", "0.20", "parso<0.9"),
            item("parso", "0.8.7"),
            item("typing_extensions", "4.16.0"),
        ]
    }  # fmt: skip
    needed = wheels.closure(report, ["ipython>=8"])
    assert list(needed) == ["ipython", "jedi", "parso"]
    assert needed["ipython"]["requires"] == ["jedi>=0.18"]
    with pytest.raises(SystemExit, match="pip did not resolve"):
        wheels.closure(report, ["msgspec"])


# --- the folder that travels ----------------------------------------------------------------


def _lock(**carry: str) -> dict[str, Any]:
    return {"carry": carry, "spare": {"typing-extensions": "4.16.0"}, "requires": {"b": ["a>=1"]}}


def test_folder_problems_names_each_disagreement(tmp_path: Path) -> None:
    folder = tmp_path / "wheels"
    _wheel(folder, "a", "1.0")
    _wheel(folder, "a", "1.1")  # two versions
    _wheel(folder, "b", "2.0", requires=["a>=2"])  # requirements unlike the lock's
    _wheel(folder, "c", "3.0", tag="cp311-cp311-manylinux_2_17_x86_64")  # wrong Python
    _wheel(folder, "torch", "2.11.0", tag="cp312-cp312-manylinux_2_28_x86_64")
    _wheel(folder, "gpudiag", "0.1.0")
    (folder / "spare").mkdir()
    problems = wheels.folder_problems(folder, _lock(a="1.0", b="2.0", c="3.0", d="4.0"))
    assert "wheels/: two versions of a (1.0, 1.1)" in problems
    assert "a-1.1-py3-none-any.whl: the lock says a==1.0" in problems
    assert "b-2.0-py3-none-any.whl: its requirements differ from the lock's" in problems
    assert any(p.startswith("c-3.0-cp311") and "CPython 3.12" in p for p in problems)
    assert any(p.startswith("torch-2.11.0") and "never travel" in p for p in problems)
    assert "wheels/: no wheel of d" in problems
    assert "spare/: no wheel of typing-extensions" in problems


def test_a_folder_as_the_lock_says_has_no_problem(tmp_path: Path) -> None:
    folder = tmp_path / "wheels"
    _wheel(folder, "a", "1.0")
    _wheel(folder, "b", "2.0", tag="cp312-cp312-manylinux_2_17_x86_64", requires=["a>=1"])
    _wheel(folder, "gpudiag", "0.1.0")
    _wheel(folder / "spare", "typing_extensions", "4.16.0")
    assert wheels.folder_problems(folder, _lock(a="1.0", b="2.0")) == []


def test_the_wheel_folder_here_agrees_with_the_lock() -> None:
    if not wheels.FOLDER.is_dir():
        pytest.skip("no .gpu-wheels/ in this checkout (make gpu-wheels fills it)")
    assert wheels.folder_problems() == []
    tree, folder = wheels.travelling_bytes()
    assert folder <= wheels.WHEEL_LIMIT
    assert tree + folder <= wheels.TRAVEL_LIMIT


# --- the helpers that run on the GPU machine before anything is installed --------------------


def test_unpack_installs_a_wheel_as_pip_would(tmp_path: Path) -> None:
    wheel = _wheel(
        tmp_path,
        "x",
        "1.0",
        files={"x/__init__.py": "V = 1\n", "x-1.0.data/purelib/y.py": "W = 2\n",
               "x-1.0.data/scripts/tool": "#!/bin/sh\n"},
    )  # fmt: skip
    site = tmp_path / "site"
    offline_env.unpack(site, [wheel])
    assert (site / "x" / "__init__.py").read_text() == "V = 1\n"
    assert (site / "y.py").read_text() == "W = 2\n"
    assert (site / "x-1.0.dist-info" / "METADATA").is_file()
    assert not (site / "tool").exists()


def test_unpack_refuses_a_path_out_of_the_target(tmp_path: Path) -> None:
    climbing = "/".join(["..", "escape.py"])  # a member one folder above the target
    wheel = _wheel(tmp_path, "x", "1.0", files={climbing: "x"})
    with pytest.raises(SystemExit, match="unsafe path"):
        offline_env.unpack(tmp_path / "site", [wheel])
    assert not (tmp_path / "escape.py").exists()


def test_only_the_spares_whose_version_does_not_fit_are_installed(tmp_path: Path) -> None:
    site, spare = tmp_path / "site", tmp_path / "spare"
    # A carried wheel that asks for more than this environment has, and for what it has.
    wanted = ["typing-extensions>=999", "pytest>=1", 'colorama>=99; sys_platform == "win32"']
    offline_env.unpack(site, [_wheel(tmp_path / "w", "carried", "1.0", requires=wanted)])
    for name in ("typing_extensions", "pytest", "colorama"):
        _wheel(spare, name, "1000.0")
    problems = offline_env.unmet(site)
    assert [(d, t) for d, t, _ in problems] == [("carried", "typing-extensions>=999")]
    chosen = offline_env.spares_to_install(site, spare)
    assert [p.name for p in chosen] == ["typing_extensions-1000.0-py3-none-any.whl"]


def test_torch_id_names_the_version_and_folder() -> None:
    from importlib import metadata

    import torch

    line = offline_env.torch_id()
    where = Path(torch.__file__).resolve().parent
    assert line == f"torch {metadata.version('torch')} at {where}"
    assert torch.__version__.startswith(metadata.version("torch").split("+")[0])


# --- the scripts ------------------------------------------------------------------------------

SHELL_SCRIPTS = sorted(SCRIPTS.glob("*.sh"))


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_the_shell_scripts_parse(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    if shutil.which("shellcheck"):
        lint = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout[-3000:]


def test_check_offline_refuses_to_run_outside_a_checkout(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(SCRIPTS / "check_offline.sh"), str(tmp_path / "out")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "root of a gpudiag checkout" in done.stderr
    assert not (tmp_path / "out").exists()


def test_check_offline_refuses_an_unknown_part() -> None:
    done = subprocess.run(
        ["bash", str(SCRIPTS / "check_offline.sh"), "unused-out", "no-such-part"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "unknown part no-such-part" in done.stderr
    assert not (REPO / "unused-out").exists()


_SELECT = """
import json, sys
import pytest

class Keep:
    def __init__(self):
        self.ids = []
    def pytest_collection_finish(self, session):
        self.ids += [item.nodeid for item in session.items]

found = {}
for expression in json.loads(sys.argv[1]):
    keep = Keep()
    extra = ["-k", expression] if expression else []
    pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                 "-m", "gpu", *extra, "tests/gpu"], plugins=[keep])
    found[expression] = keep.ids
print("SELECTED" + json.dumps(found))
"""


@pytest.mark.slow
def test_the_parts_select_every_gpu_test_once() -> None:
    """The -k expressions of check_offline.sh, through pytest's own selection (one process)."""
    text = (SCRIPTS / "check_offline.sh").read_text()
    expressions = re.findall(r'^part [\w-]+ \d+ --no-end-to-end -- -k "?([^"\n]+?)"?$', text, re.M)
    assert len(expressions) == 4
    done = subprocess.run(
        [sys.executable, "-c", _SELECT, json.dumps(["", *expressions])],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    found = json.loads(done.stdout.rpartition("SELECTED")[2])
    everything = found.pop("")
    assert len(everything) >= 25
    assert all(found.values()), found
    selected = [nodeid for ids in found.values() for nodeid in ids]
    assert sorted(selected) == sorted(everything)


def _run_check(out: Path, wheel_folder: Path, *parts: str, deadline_s: int = 600) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    env.update(
        GPU_CHECK_PYTHON=sys.executable,
        GPU_CHECK_WHEELS=str(wheel_folder),
        GPU_CHECK_DEADLINE_S=str(deadline_s),
    )
    done = subprocess.run(
        ["bash", str(SCRIPTS / "check_offline.sh"), str(out), *parts],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    return f"exit {done.returncode}\n{done.stdout}{done.stderr}"


@pytest.mark.slow
def test_check_offline_installs_the_folder_and_merges_its_parts(tmp_path: Path) -> None:
    """The command with this venv's Python and a folder of one wheel: it installs it with
    --no-index beside torch, runs the parts asked for and leaves the table and the files."""
    folder = tmp_path / "wheels"
    _wheel(folder, "gpudiag_offline_probe", "1.0", files={"gpudiag_offline_probe.py": "X = 1\n"})
    _wheel(folder / "spare", "typing_extensions", "1000.0")  # this venv's fits: not installed
    out = tmp_path / "out"
    log = _run_check(out, folder, "deps", "nccl")
    assert log.startswith("exit 0"), log[-4000:]
    assert "installing 1 wheels" in log
    assert "spare wheels" not in log
    assert re.search(r"after: +torch \S+ at .* \(unchanged\)", log)
    assert sorted(p.name for p in out.iterdir()) == ["env.txt", "log.txt", "rows.json", "table.txt"]
    rows = json.loads((out / "rows.json").read_text())
    assert [r["test"] for r in rows][:2] == ["dependencies", "dependencies"]
    assert rows[-1]["path"] == "gd.bench.allreduce, one rank over NCCL"
    assert "installed: 1 distributions" in (out / "env.txt").read_text()
    # With no time left every part is "not run", the table still comes, and the exit says so.
    late = _run_check(tmp_path / "late", folder, "deps", deadline_s=1)
    assert late.startswith("exit 1"), late[-4000:]
    table = (tmp_path / "late" / "table.txt").read_text()
    assert "part deps" in table
    assert table.rstrip().endswith("0 passed, 0 failed, 0 not applicable, 1 not run")


def test_check_offline_refuses_a_torch_wheel(tmp_path: Path) -> None:
    folder = tmp_path / "wheels"
    _wheel(folder, "torch", "2.11.0", tag="cp312-cp312-manylinux_2_28_x86_64")
    log = _run_check(tmp_path / "out", folder, "deps")
    assert log.startswith("exit 3"), log[-3000:]
    assert "the machine's own torch stack is never replaced" in log


# --- the dry run: the GPU machine's command here, in Python 3.12, offline ----------------------


def _dry_run_inputs() -> str | None:
    """Why the dry run cannot run here, or None."""
    if not wheels.FOLDER.is_dir():
        return "no .gpu-wheels/ in this checkout (make gpu-wheels fills it)"
    cache = Path(os.environ.get("GPU_DRYRUN_CACHE", Path.home() / ".cache/gpudiag-gpu-dryrun"))
    if not list((cache / "wheels").glob("torch-2.11.0-cp312-*.whl")):
        return f"no torch 2.11.0 wheel for Python 3.12 in {cache}/wheels (dry_run.sh --fill-cache)"
    pyenv = Path.home().glob(".pyenv/versions/3.12*/bin/python3.12")
    for candidate in filter(None, [shutil.which("python3.12"), *map(str, pyenv)]):
        probe = [candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"]
        if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
            return None
    return "python3.12 is not installed here"


@pytest.mark.slow
def test_dry_run_installs_offline_and_runs_every_part(tmp_path: Path) -> None:
    """scripts/gpu/dry_run.sh: Python 3.12 with torch 2.11.0 (no GPU here) and only the GPU
    image's packages; the command installs .gpu-wheels/ with --no-index and runs to the end."""
    reason = _dry_run_inputs()
    if reason is not None:
        pytest.skip(f"dry run not possible: {reason}")
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(SCRIPTS / "dry_run.sh"), str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "torch unchanged: torch 2.11.0" in log
    # What comes back from the GPU machine: a few plain files, none over 16 MiB.
    files = sorted(out.iterdir())
    assert all(p.is_file() for p in files)
    assert 5 <= len(files) <= 8
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", p.name) for p in files)
    assert all(p.stat().st_size < 16 << 20 for p in files)
    assert {"table.txt", "rows.json", "env.txt", "log.txt"} <= {p.name for p in files}
    rows = json.loads((out / "rows.json").read_text())
    by_test = {}
    for row in rows:
        by_test.setdefault(row["test"].split("::")[0], []).append(row)
    assert [r for r in rows if r["result"] == "failed"] == []
    deps = by_test["dependencies"]
    assert {r["path"] for r in deps} >= {"import msgspec>=0.18", "import pydantic>=2.6"}
    assert all(r["result"] == "passed" for r in deps)
    gpu_rows = [r for r in rows if r["test"].startswith("tests/gpu/")]
    assert len(gpu_rows) >= 25
    assert {(r["result"], r["figure"]) for r in gpu_rows} == {
        ("not applicable", "needs a CUDA GPU")
    }
    assert [r["result"] for r in by_test["end-to-end"]] == ["passed", "passed"]
    table = (out / "table.txt").read_text()
    assert re.search(r"^\d+ passed, 0 failed, \d+ not applicable$", table, re.M)
    with tarfile.open(out / "recording-no-cuda-host.tar.gz") as recording:
        names = recording.getnames()
    assert "no-cuda-host/manifest.json" in names
