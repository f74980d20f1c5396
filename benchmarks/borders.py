"""Every input surface, every fault: what a hostile or broken input does to gpudiag (on demand).

    python benchmarks/borders.py [--target DIR] [--surface NAME ...] [--json OUT.json]

Each case runs in a fresh Python process of its own (its own session, its address space capped
at 6 GiB so a runaway allocation cannot take the machine down), started from a scratch folder
that holds the hostile files. The case is judged by what comes out of it:

- ``clean``: it worked, or it ended in a gpudiag error (a ``GpuDiagError``, or the CLI's
  ``gpudiag: error: ...`` / an argparse usage error) that names the cause; an expected
  ``KeyboardInterrupt`` (Ctrl-C) counts as clean.
- ``raw``: a Python traceback, any other exception, or a crash.
- ``unsafe``: an exported script that ``bash -n`` (``python -m py_compile``) rejects, or an
  export of what must be refused (a recipe's NCCL plugin or file variable).
- ``unclear``: a gpudiag error that does not say what the case's fault was (a rank's own error
  hidden behind the survivor's "Connection closed by peer").
- ``hang``: still running at the case's time cap (then killed with everything it started).
- ``orphans``: processes the case started still alive once it ended (found by an environment
  marker every descendant inherits, so a rank re-parented to init is found too); they are
  counted, then killed.
- ``state lost``: after the call the working directory, ``sys.argv``, the environment, torch's
  switches or the watched model differ from before.

``--target DIR`` runs the cases against another checkout (its folder goes first on
PYTHONPATH), e.g. a worktree of the commit before a change, for a before/after table.
"""

# The hostile values below spell numbers with Unicode digits on purpose.
# ruff: noqa: RUF001

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
MARKER = "GPUDIAG_BORDERS_CASE"
ADDRESS_SPACE = 6 << 30


@dataclass
class Case:
    surface: str
    name: str
    argv: list[str] | None = None  # a `gpudiag ...` command line
    code: str | None = None  # an API case: Python that runs with the prelude
    cap_s: float = 60.0
    env: dict[str, str] = field(default_factory=dict)
    expect: tuple[str, ...] = ()  # exception names that are the right outcome (KeyboardInterrupt)
    must_say: tuple[str, ...] = ()  # words a clean error must contain (else: unclear)
    check_output: str = ""  # "bash" / "python": the printed export must parse
    must_refuse: bool = False  # printing an export at all is the fault (a plugin variable)
    interrupt: Callable[[psutil.Process, str], bool] | None = None  # when to send SIGINT
    stdin: str | None = None


@dataclass
class Outcome:
    case: Case
    verdict: str  # clean / raw / unclear / hang
    orphans: int
    state_lost: list[str]
    seconds: float
    detail: str


# -- the prelude of an API case ------------------------------------------------------------
PRELUDE = """
import json, os, sys
import torch
import torch._dynamo  # torch's own import sets TORCHINDUCTOR_CACHE_DIR: not the case's doing
import gpudiag as gd
from gpudiag.errors import GpuDiagError

_watched = []
def watch(module):
    _watched.append((module, {k: v.detach().clone() for k, v in module.state_dict().items()}))
    return module

def _state():
    return {
        "cwd": os.getcwd(),
        "argv": list(sys.argv),
        "environ": dict(os.environ),
        "grad mode": torch.is_grad_enabled(),
        "default dtype": str(torch.get_default_dtype()),
        "threads": torch.get_num_threads(),
        "matmul precision": torch.get_float32_matmul_precision(),
    }

_before = _state()

def _report(outcome, detail=""):
    after = _state()
    lost = [k for k in _before if _before[k] != after[k]]
    for module, saved in _watched:
        now = module.state_dict()
        if set(now) != set(saved) or any(not torch.equal(now[k], saved[k]) for k in saved):
            lost.append("model")
    line = json.dumps({"outcome": outcome, "detail": detail[:400], "state_lost": lost})
    sys.stdout.write("\\nBORDERS " + line + "\\n")
    sys.stdout.flush()
"""

WRAP = """
try:
{body}
    _report("ok")
except GpuDiagError as _exc:
    _report("clean", type(_exc).__name__ + ": " + str(_exc))
except BaseException as _exc:
    _report("exception", type(_exc).__name__ + ": " + str(_exc))
"""


def api(surface: str, name: str, body: str, **kwargs: Any) -> Case:
    code = PRELUDE + WRAP.format(body=textwrap.indent(textwrap.dedent(body).strip(), "    "))
    return Case(surface, name, code=code, **kwargs)


def cli(surface: str, name: str, *argv: str, **kwargs: Any) -> Case:
    return Case(surface, name, argv=list(argv), **kwargs)


# -- hostile files, written into each case's scratch folder -------------------------------
def _config(**changes: Any) -> str:
    base: dict[str, Any] = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "vocab_size": 100,
    }
    base.update(changes)
    return json.dumps(base)


def _deep_json(depth: int) -> str:
    return _config()[:-1] + ', "extra": ' + "[" * depth + "]" * depth + "}"


FIXTURES = ROOT / "tests" / "fixtures"


def write_files(folder: Path) -> None:
    f = folder
    (f / "cfg_nan.json").write_text(_config(hidden_size=float("nan")))
    (f / "cfg_inf.json").write_text(_config(num_hidden_layers=float("inf")))
    (f / "cfg_1e300.json").write_text(_config(num_hidden_layers=1e300))
    (f / "cfg_bigint.json").write_text(_config(num_hidden_layers=10**30))
    (f / "cfg_list.json").write_text(_config(hidden_size=[64]))
    (f / "cfg_word.json").write_text(_config(num_attention_heads="four"))
    (f / "cfg_negative.json").write_text(_config(num_hidden_layers=-2))
    (f / "cfg_unicode.json").write_text(_config(num_hidden_layers="²"))
    (f / "cfg_deep.json").write_text(_deep_json(100_000))
    (f / "cfg_toplist.json").write_text("[1, 2, 3]")
    (f / "cfg_truncated.json").write_text(_config()[:30])
    (f / "cfg_empty.json").write_text("")
    (f / "binary.bin").write_bytes(bytes(range(256)) * 64)
    (f / "latin1.py").write_bytes("x = 'caf\xe9'\n".encode("latin-1"))
    (f / "deep.py").write_text("x = " + "(" * 100_000 + ")" * 100_000 + "\n")
    (f / "huge.py").write_text("x = 1\n" * 20_000_000)  # 120 MB of Python
    (f / "existing.txt").write_text("the user's notes: do not overwrite\n")
    (f / "adir").mkdir(exist_ok=True)
    xml = (FIXTURES / "nvidia-smi-xml" / "a100-sxm4-v12.xml").read_bytes()
    (f / "smi_truncated.xml").write_bytes(xml[: len(xml) // 2])
    (f / "smi_bomb.xml").write_text(
        '<?xml version="1.0"?>\n<!DOCTYPE lolz [<!ENTITY lol "lol">'
        + "".join(
            f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">'
            for i in range(1, 10)
        )
        + "]>\n<nvidia_smi_log><driver_version>&lol9;</driver_version></nvidia_smi_log>\n"
    )
    (f / "smi_deep.xml").write_text(
        "<nvidia_smi_log>" + "<gpu>" * 50_000 + "</gpu>" * 50_000 + "</nvidia_smi_log>"
    )
    (f / "smi_huge.txt").write_text("=" * 80 + "\n" + "| NVIDIA-SMI 550.54 |\n" * 5_000_000)
    text = (FIXTURES / "nvidia-smi-text" / "h100-sxm-x8.nvidia-smi.txt").read_text()
    (f / "smi_text_unicode.txt").write_text(text.replace("0 ", "٠ ").replace("1 ", "١ "))
    (f / "snap_nan.json").write_text(
        json.dumps(
            {
                "format": "gpudiag-snapshot",
                "version": 1,
                "gpus": [{"info": {"index": float("nan")}, "state": {}}],
            }
        )
    )
    (f / "snap_deep.json").write_text(
        '{"format": "gpudiag-snapshot", "gpus": ' + "[" * 100_000 + "]" * 100_000 + "}"
    )
    (f / "snap_types.json").write_text(
        json.dumps(
            {"format": "gpudiag-snapshot", "version": 1, "gpus": "all of them", "driver": [1]}
        )
    )
    topo = (FIXTURES / "topo-matrix").glob("*.txt")
    topo_text = next(iter(sorted(topo))).read_text()
    (f / "topo_truncated.txt").write_text(topo_text[: len(topo_text) // 3])
    (f / "topo_unicode.txt").write_text(topo_text.replace("NV1", "NV١").replace("0-", "٠-"))
    log = (FIXTURES / "nccl-tests" / "superbench-nccl_allreduce.log").read_text()
    (f / "nccl_unicode.log").write_text(
        log.replace("8 ", "٨ ").replace("1048576", "１０４８５７６")
    )
    (f / "nccl_truncated.log").write_text(log[: len(log) // 2])
    (f / "nccl_huge_numbers.log").write_text(log.replace("1048576", "1" + "0" * 400))
    (f / "nccl_nan.log").write_text(log.replace("  1048576 ", "  nan ").replace(" 0.0", " inf"))
    for name, body in RECIPES.items():
        (f / name).write_text(body)
    (f / "borders_wl.py").write_text(WORKLOAD_MODULE)


RECIPES = {
    "recipe_plugin.yaml": (
        "kind: gpudiag.recipe\nschema_version: 1\nfixes:\n  - id: nccl.env\n    params:\n"
        "      variables: {NCCL_NET_PLUGIN: /tmp/evil.so, NCCL_ALGO: Ring}\n"
    ),
    "recipe_debugfile.yaml": (
        "kind: gpudiag.recipe\nschema_version: 1\nfixes:\n  - id: nccl.env\n    params:\n"
        "      variables: {NCCL_DEBUG_FILE: /home/user/.bashrc}\n"
    ),
    "recipe_tuner.yaml": (
        "kind: gpudiag.recipe\nschema_version: 1\nfixes:\n  - id: nccl.env\n    params:\n"
        "      variables: {NCCL_TUNER_PLUGIN: libevil.so, NCCL_PROFILER_PLUGIN: x.so}\n"
    ),
    "recipe_topofile.yaml": (
        "kind: gpudiag.recipe\nschema_version: 1\nfixes:\n  - id: nccl.env\n    params:\n"
        "      variables: {NCCL_TOPO_FILE: /etc/shadow}\n"
    ),
    "recipe_tuning.yaml": (
        "kind: gpudiag.recipe\nschema_version: 1\nfixes:\n  - id: nccl.env\n    params:\n"
        "      variables: {NCCL_ALGO: Ring, NCCL_PROTO: Simple, NCCL_MAX_NCHANNELS: '8'}\n"
    ),
}

# Workload factories the ranks of a distributed case import by name ("borders_wl:NAME").
WORKLOAD_MODULE = """
import os, time
import torch
from gpudiag.step import Workload

def _make(width=8):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width)
    )
    return Workload(
        model, batch=lambda bs: torch.randn(bs, width), loss=lambda m, x: m(x).pow(2).mean(),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1), batch_size=4, name="borders",
    )

def ok(width=8):
    return _make(width)

def rank1_crashes(width=8):
    if os.environ.get("RANK") == "1":
        raise ValueError("boom from rank 1's own workload")
    return _make(width)

def rank1_hangs(width=8):
    if os.environ.get("RANK") == "1":
        time.sleep(10_000)
    return _make(width)

def every_rank_fails(width=8):
    raise RuntimeError("this workload cannot be built anywhere")
"""


def _ranks_started(proc: psutil.Process, marker: str) -> bool:
    """Ctrl-C once the ranks are up: three processes beside the case (launcher + 2 ranks)."""
    return len(marked(marker)) >= 4


# -- the cases -----------------------------------------------------------------------------
CONFIG_FILES = [
    "cfg_nan.json",
    "cfg_inf.json",
    "cfg_1e300.json",
    "cfg_bigint.json",
    "cfg_list.json",
    "cfg_word.json",
    "cfg_negative.json",
    "cfg_unicode.json",
    "cfg_deep.json",
    "cfg_toplist.json",
    "cfg_truncated.json",
    "cfg_empty.json",
    "binary.bin",
    "/dev/zero",
    "adir",
]
CONFIG_VALUES = {
    "NaN hidden": "{**base, 'hidden_size': float('nan')}",
    "Infinity layers": "{**base, 'num_hidden_layers': float('inf')}",
    "1e300 layers": "{**base, 'num_hidden_layers': 1e300}",
    "10**30 layers": "{**base, 'num_hidden_layers': 10**30}",
    "list hidden": "{**base, 'hidden_size': [64]}",
    "word heads": "{**base, 'num_attention_heads': 'four'}",
    "unicode digit layers": "{**base, 'num_hidden_layers': '²'}",
    "negative layers": "{**base, 'num_hidden_layers': -2}",
    "bool heads": "{**base, 'num_attention_heads': True}",
    "100k-deep value": "{**base, 'extra': deep}",
    "huge vocab": "{**base, 'vocab_size': 10**18}",
    "NaN seq_len": "{**base, 'max_position_embeddings': float('nan')}",
}
CONFIG_PRELUDE = """
base = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100}
deep = []
for _ in range(100_000):
    deep = [deep]
"""

HANGING_STEP = """
import time
model = watch(torch.nn.Linear(8, 8))
calls = [0]
def loss(m, x):
    calls[0] += 1
    if calls[0] >= {at}:
        time.sleep(10_000)
    return m(x).pow(2).mean()
wl = gd.Workload(model, batch=lambda bs: torch.randn(bs, 8), loss=loss,
                 optimizer=lambda p: torch.optim.SGD(p, lr=0.1), batch_size=4)
"""

MISBEHAVING_STEP = """
model = watch(torch.nn.Linear(8, 8))
calls = [0]
def loss(m, x):
    calls[0] += 1
    if calls[0] >= {at}:
{action}
    return m(x).pow(2).mean()
wl = gd.Workload(model, batch=lambda bs: torch.randn(bs, 8), loss=loss,
                 optimizer=lambda p: torch.optim.SGD(p, lr=0.1), batch_size=4)
"""
ACTIONS = {
    "chdir and fail": (
        "        os.chdir('/')\n        raise RuntimeError('step failed after chdir')"
    ),
    "sys.exit": "        sys.exit(3)",
    "argv and env changed": (
        "        sys.argv.append('--oops')\n        os.environ['BORDERS_LEAK'] = '1'"
    ),
    "KeyboardInterrupt": "        raise KeyboardInterrupt",
    "MemoryError": "        raise MemoryError('step ran out of host memory')",
}
CALLS = {
    "compare": "gd.compare(wl, ['precision.bf16'], time_budget_s=3, min_rounds=2, progress=False)",
    "memory": "gd.memory(wl)",
    "fit": "gd.fit(wl, '64MiB')",
    "diagnose": "gd.diagnose(wl, progress=False)",
    "tune": (
        "gd.tune(wl, fixes=['precision.bf16'], diagnosis=False, time_budget_s=5, progress=False)"
    ),
}

MAGIC = """
from IPython.testing.globalipapp import get_ipython
ip = get_ipython()
ip.run_line_magic("load_ext", "gpudiag")
ip.user_ns["model"] = watch(torch.nn.Linear(8, 8))
ip.user_ns["opt"] = torch.optim.SGD(ip.user_ns["model"].parameters(), lr=0.1)
ip.user_ns["x"] = torch.randn(4, 8)
cell = "\\n".join([
    "import os, sys, time",
    "loss = model(x).pow(2).mean()",
    "loss.backward(); opt.step(); opt.zero_grad()",
    {action!r},
])
ip.run_cell_magic("gpudiag", "{line}", cell)
"""
MAGIC_ACTIONS = {
    "sys.exit": "sys.exit(2)",
    "chdir and fail": "os.chdir('/'); raise RuntimeError('cell failed after chdir')",
    "KeyboardInterrupt": "raise KeyboardInterrupt",
    "argv and env": "sys.argv.append('--x'); os.environ['BORDERS_CELL'] = '1'",
    "a syntax error": "x = = 1",
}
MAGIC_LINES = {
    "compare": "compare --fix precision.bf16 --budget 2 --min-rounds 2",
    "doctor": "doctor --no-widget --no-scaling --steps 1",
    "memory": "memory",
    "tune": "tune --no-diagnosis --fix precision.bf16 --budget 3",
}

OPTIMIZERS = """
import inspect as _inspect
model = watch(torch.nn.Linear(4, 2, bias={name!r} != "Muon"))  # Muon takes 2-D parameters only
cls = getattr(torch.optim, {name!r})
kwargs = {{"lr": 0.01}} if "lr" in _inspect.signature(cls).parameters else {{}}
opt = cls(model.parameters(), **kwargs)
wl = gd.Workload(model, batch=lambda bs: torch.randn(bs, 4), loss=lambda m, x: m(x).pow(2).mean(),
                 optimizer=opt, batch_size=4)
gd.compare(wl, [], drift_steps=1, warmup_steps=1, progress=False)
"""


def optimizer_names() -> list[str]:
    import torch

    return sorted(
        name
        for name in dir(torch.optim)
        if isinstance(getattr(torch.optim, name), type)
        and issubclass(getattr(torch.optim, name), torch.optim.Optimizer)
        and getattr(torch.optim, name) is not torch.optim.Optimizer
    )


def cases() -> list[Case]:
    out: list[Case] = []
    # 0. valid input: every torch.optim optimizer as an instance
    for name in optimizer_names():
        out.append(api("optimizer instances", name, OPTIMIZERS.format(name=name), cap_s=120))
    # 4. model configs: files (CLI) and values (API)
    for f in CONFIG_FILES:
        out.append(cli("config files", f"memory --config {f}", "memory", "--config", f))
        out.append(cli("config files", f"plan {f}", "plan", f, "--gpus", "8"))
    for label, value in CONFIG_VALUES.items():
        body = CONFIG_PRELUDE + f"gd.estimate_memory({value}, batch_size=1, seq_len=128)"
        out.append(api("config values", f"estimate_memory {label}", body))
        body = CONFIG_PRELUDE + f"gd.plan({value}, gpus=8, seq_len=128)"
        out.append(api("config values", f"plan {label}", body))
    # 4. CLI values
    compare = ["compare", "--fix", "precision.bf16", "--budget", "2", "--min-rounds", "2"]
    for setting in (
        "hidden=1000000000",
        "seq_len=abc",
        "seq_len=-5",
        "seq_len=nan",
        "seq_len=²",
        "d_model=1e300",
        "n_layer=2.5",
        "vocab_size=10**9",
    ):
        workload = "mlp" if setting.startswith("hidden") else "gpt"
        out.append(
            cli(
                "CLI values",
                f"compare --set {setting}",
                *compare,
                "--workload",
                workload,
                "--set",
                setting,
                cap_s=120,
            )
        )
    for extra in (
        ["--budget", "nan"],
        ["--budget", "-1"],
        ["--min-rounds", "-3"],
        ["--max-rounds", "0"],
        ["--seed", "٣"],
    ):
        out.append(
            cli(
                "CLI values",
                "compare " + " ".join(extra),
                "compare",
                "--workload",
                "mlp",
                "--fix",
                "precision.bf16",
                *extra,
                cap_s=120,
            )
        )
    for extra in (
        ["--batch-size", "0"],
        ["--batch-size", "-1"],
        ["--budget", "nanGiB"],
        ["--budget", "-5GiB"],
        ["--budget", "1e400GiB"],
        ["--budget", "²GiB"],
        ["--parallelism", "fsdp:²"],
        ["--parallelism", "tp:0"],
    ):
        out.append(
            cli(
                "CLI values",
                "memory gpt --estimate-only " + " ".join(extra),
                "memory",
                "gpt",
                "--estimate-only",
                *extra,
            )
        )
    plan = ["plan", "--layers", "2", "--hidden", "64", "--heads", "4"]
    for extra in (
        ["--gpus", "0"],
        ["--gpus", "-8"],
        ["--gpus", "1000000000000"],
        ["--gpus", "8", "--mfu", "nan"],
        ["--gpus", "8", "--mfu", "5"],
        ["--gpus", "8", "--network-gbps", "inf"],
        ["--gpus", "8", "--micro-batch", "0"],
        ["--gpus", "8", "--gpu-memory", "nanGiB"],
        ["--gpus", "8", "--zero", "9"],
        ["--gpus", "8", "--seq-len", "-1"],
        ["--gpus", "٨"],
    ):
        out.append(cli("CLI values", " ".join(["plan", *extra]), *plan, *extra))
    out.append(cli("CLI values", "occupancy --cc 8.٠", "occupancy", "--cc", "8.٠"))
    out.append(
        cli("CLI values", "bench attention --seq-lens 16000000", "bench", "attention",
            "--seq-lens", "16000000", "--backends", "math", cap_s=90)
    )  # fmt: skip
    for extra in (
        ["--threads", "0"],
        ["--threads", "1000000000"],
        ["--cc", "²"],
        ["--smem", "1e400"],
        ["--regs", "-1"],
        ["--carveout-percent", "500"],
    ):
        out.append(cli("CLI values", " ".join(["occupancy", *extra]), "occupancy", *extra))
    for extra in (
        ["--devices", "²"],
        ["--devices", "0,٣"],
        ["--interval", "nan"],
        ["--interval", "0"],
        ["--interval", "-1"],
        ["--duration", "nan"],
        ["--refresh", "0"],
    ):
        out.append(
            cli(
                "CLI values",
                " ".join(["monitor", *extra]),
                "monitor",
                "--json",
                "--duration",
                "1",
                *extra,
            )
        )
    out.append(
        cli(
            "CLI values",
            "record onto a file",
            "record",
            "existing.txt",
            "--no-bench",
            "--no-traces",
            "--monitor-seconds",
            "0.5",
            cap_s=120,
        )
    )
    out.append(
        cli(
            "CLI values",
            "record --monitor-seconds nan",
            "record",
            "newdir",
            "--no-bench",
            "--no-traces",
            "--monitor-seconds",
            "nan",
            cap_s=120,
        )
    )
    out.append(
        cli(
            "CLI values",
            "record into /dev/null",
            "record",
            "/dev/null",
            "--no-bench",
            "--no-traces",
            "--monitor-seconds",
            "0.5",
            cap_s=120,
        )
    )
    for extra in (
        ["matmul", "--sizes", "0"],
        ["matmul", "--sizes", "1000000"],
        ["bandwidth", "--sizes", "1024G"],
        ["matmul", "--repeats", "-1"],
    ):
        out.append(cli("CLI values", " ".join(["bench", *extra]), "bench", *extra, cap_s=90))
    # doctor --code
    for f in ("binary.bin", "/dev/zero", "deep.py", "latin1.py", "adir", "huge.py"):
        out.append(cli("code files", f"doctor --code {f}", "doctor", "--code", f, "--json"))
    # replay paths
    for f in (
        "/dev/zero",
        "adir",
        "cfg_empty.json",
        "binary.bin",
        "smi_truncated.xml",
        "smi_bomb.xml",
        "smi_deep.xml",
        "smi_huge.txt",
        "smi_text_unicode.txt",
        "snap_nan.json",
        "snap_deep.json",
        "snap_types.json",
    ):
        out.append(cli("replay files", f"inspect --replay {f}", "inspect", "--replay", f))
    smi = str(FIXTURES / "nvidia-smi-xml" / "a100-sxm4-v12.xml")
    for f in ("/dev/zero", "binary.bin", "topo_truncated.txt", "topo_unicode.txt", "adir"):
        out.append(
            cli(
                "replay files",
                f"inspect --topology {f}",
                "inspect",
                "--replay",
                smi,
                "--topology",
                f,
            )
        )
    out.append(
        api("replay files", "gd.inspect(replay='/dev/zero')", "gd.inspect(replay='/dev/zero')")
    )
    for f in ("/dev/zero", "binary.bin", "smi_deep.xml"):
        out.append(
            cli(
                "replay files",
                f"monitor --replay {f}",
                "monitor",
                "--replay",
                f,
                "--json",
                "--duration",
                "1",
            )
        )
    for f in (
        "nccl_unicode.log",
        "nccl_truncated.log",
        "nccl_huge_numbers.log",
        "nccl_nan.log",
        "/dev/zero",
        "binary.bin",
    ):
        out.append(cli("nccl-tests logs", f"bench nccl-log {f}", "bench", "nccl-log", f))
    # 5. recipes and exported scripts
    for name in RECIPES:
        hostile = "tuning" not in name
        out.append(
            cli(
                "recipes",
                f"recipe env {name}",
                "recipe",
                "env",
                name,
                check_output="bash",
                must_say=("NCCL_",) if hostile else (),
                must_refuse=hostile,
            )
        )
        if hostile:
            out.append(
                cli(
                    "recipes",
                    f"recipe torchrun {name}",
                    "recipe",
                    "torchrun",
                    name,
                    check_output="bash",
                    must_say=("NCCL_",),
                    must_refuse=True,
                )
            )
    for label, extra in (
        ("rdzv ${MASTER_ADDR:29500", ["--nnodes", "2", "--rdzv-endpoint", "${MASTER_ADDR:29500"]),
        ("rdzv $(reboot):1", ["--nnodes", "2", "--rdzv-endpoint", "$(reboot):1"]),
        ("rdzv `id`:1", ["--nnodes", "2", "--rdzv-endpoint", "`id`:1"]),
        ("script with quote", ["--script", "tr'ain.py"]),
        ("script with newline", ["--script", "train.py\nrm -rf ~"]),
        ("nproc unicode", ["--nproc", "٨"]),
        ("nnodes unicode", ["--nnodes", "²"]),
    ):
        out.append(
            cli(
                "recipes",
                f"recipe torchrun {label}",
                "recipe",
                "torchrun",
                "recipe_tuning.yaml",
                *extra,
                check_output="bash",
            )
        )
    out.append(
        cli(
            "recipes",
            "recipe slurm --partition 'a;b'",
            "recipe",
            "slurm",
            "recipe_tuning.yaml",
            "--partition",
            "a;b",
            check_output="bash",
        )
    )
    out.append(
        cli(
            "recipes",
            "recipe python",
            "recipe",
            "python",
            "recipe_tuning.yaml",
            check_output="python",
        )
    )
    # environment variables
    for env in (
        {"LOCAL_WORLD_SIZE": "²"},
        {"LOCAL_WORLD_SIZE": "abc"},
        {"NCCL_MAX_NCHANNELS": "²"},
        {"NCCL_MAX_NCHANNELS": "1e9"},
        {"CUDA_VISIBLE_DEVICES": "²"},
        {"CUDA_VISIBLE_DEVICES": "0,٣"},
        {"NCCL_P2P_LEVEL": "٣"},
        {"NCCL_NET_GDR_LEVEL": "²"},
    ):
        label = " ".join(f"{k}={v}" for k, v in env.items())
        out.append(cli("environment", f"doctor with {label}", "doctor", "--json", env=env))
    for env in (
        {"RANK": "٠", "WORLD_SIZE": "٢"},
        {"RANK": "0", "WORLD_SIZE": "²"},
        {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "²"},
    ):
        label = " ".join(f"{k}={v}" for k, v in env.items())
        out.append(cli("environment", f"inspect with {label}", "inspect", env=env, cap_s=45))
    # 1 + 3. user code that misbehaves inside a trial
    for call_name, call in CALLS.items():
        out.append(
            api(
                "trials: user code",
                f"{call_name}: step hangs (3rd call)",
                HANGING_STEP.format(at=3) + call,
                cap_s=150,
            )
        )
        for action_name, action in ACTIONS.items():
            expect = ("KeyboardInterrupt",) if action_name == "KeyboardInterrupt" else ()
            out.append(
                api(
                    "trials: user code",
                    f"{call_name}: {action_name}",
                    MISBEHAVING_STEP.format(at=2, action=action) + call,
                    expect=expect,
                    cap_s=150,
                )
            )
    for magic, line in MAGIC_LINES.items():
        for action_name, action in MAGIC_ACTIONS.items():
            expect = ("KeyboardInterrupt",) if action_name == "KeyboardInterrupt" else ()
            out.append(
                api(
                    "magics: user cells",
                    f"%%gpudiag {magic}: {action_name}",
                    MAGIC.format(line=line, action=action),
                    cap_s=150,
                    expect=expect,
                )
            )
    # 2. ranks
    nproc = "gd.compare({wl!r}, fixes=['fsdp.wrap'], nproc=2, rounds=1, steps_per_round=1, memory_steps=1, timeout_s={timeout})"  # noqa: E501
    out.append(
        api(
            "ranks",
            "a rank crashes",
            nproc.format(wl="borders_wl:rank1_crashes", timeout=120),
            must_say=("boom from rank 1",),
            cap_s=180,
        )
    )
    out.append(
        api(
            "ranks",
            "every rank fails to build",
            nproc.format(wl="borders_wl:every_rank_fails", timeout=120),
            must_say=("cannot be built anywhere",),
            cap_s=180,
        )
    )
    out.append(
        api(
            "ranks",
            "a rank hangs (timeout 30 s)",
            nproc.format(wl="borders_wl:rank1_hangs", timeout=30),
            must_say=("timeout", "30"),
            cap_s=150,
        )
    )
    out.append(
        api(
            "ranks",
            "Ctrl-C while the ranks run",
            nproc.format(wl="borders_wl:rank1_hangs", timeout=300),
            expect=("KeyboardInterrupt",),
            interrupt=_ranks_started,
            cap_s=150,
        )
    )
    out.append(
        api(
            "ranks",
            "a clean 2-rank trial",
            nproc.format(wl="borders_wl:ok", timeout=300),
            cap_s=240,
        )
    )
    return out


# -- running a case ------------------------------------------------------------------------
def marked(marker: str) -> list[psutil.Process]:
    """Processes whose environment carries this case's marker."""
    out = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(MARKER) == marker:
                out.append(proc)
        except (psutil.Error, OSError):
            continue
    return out


def _kill(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=5)


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    # A shell starts background jobs with SIGINT ignored, and a child inherits that: Python
    # then never raises KeyboardInterrupt. The case gets Ctrl-C as a notebook kernel would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_case(case: Case, folder: Path, target: Path | None, python: str) -> Outcome:
    marker = uuid.uuid4().hex
    env = dict(os.environ)
    env.update(case.env)
    env[MARKER] = marker
    env["TQDM_DISABLE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(target) if target else "", str(folder), env.get("PYTHONPATH", "")) if p
    )
    if case.code is not None:
        script = folder / f"case_{marker}.py"
        script.write_text(case.code)
        cmd = [python, str(script)]
    else:
        assert case.argv is not None
        cmd = [python, "-m", "gpudiag", *case.argv]
    out_path, err_path = folder / f"out_{marker}.txt", folder / f"err_{marker}.txt"
    t0 = time.perf_counter()
    hung = False
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            cmd,
            cwd=folder,
            env=env,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            preexec_fn=_limit,
            start_new_session=True,
        )
        ps = psutil.Process(proc.pid)
        interrupted = False
        while proc.poll() is None:
            elapsed = time.perf_counter() - t0
            if elapsed > case.cap_s:
                hung = True
                break
            if case.interrupt is not None and not interrupted and case.interrupt(ps, marker):
                time.sleep(1.0)
                proc.send_signal(signal.SIGINT)  # what Jupyter's "interrupt the kernel" sends
                interrupted = True
            time.sleep(0.2)
        if hung:  # what a user does with a kernel that never answers: kill it
            proc.kill()
            proc.wait()
    seconds = time.perf_counter() - t0
    time.sleep(1.5)  # a launcher's ranks get a moment to go with it
    left = [p for p in marked(marker) if p.pid != proc.pid]
    orphans = len(left)
    _kill(left)
    stdout = out_path.read_text(errors="replace")
    stderr = err_path.read_text(errors="replace")
    verdict, detail, lost = _judge(case, proc.returncode, stdout, stderr, hung, folder)
    return Outcome(case, verdict, orphans, lost, seconds, detail)


def _judge(
    case: Case, code: int, stdout: str, stderr: str, hung: bool, folder: Path
) -> tuple[str, str, list[str]]:
    if hung:
        return "hang", f"still running after {case.cap_s:.0f} s", []
    text = stdout + stderr
    if case.code is not None:
        lines = [ln for ln in stdout.splitlines() if ln.startswith("BORDERS ")]
        if not lines:
            last = (stderr.strip().splitlines() or [f"exit {code}"])[-1]
            return "raw", f"no report (exit {code}): {last[:300]}", []
        rep = json.loads(lines[-1][len("BORDERS ") :])
        lost = list(rep["state_lost"])
        detail = rep["detail"]
        if rep["outcome"] == "exception":
            name = detail.split(":", 1)[0]
            if name in case.expect:
                return "clean", detail, lost
            return "raw", detail, lost
        said = all(w.lower() in detail.lower() for w in case.must_say)
        if rep["outcome"] == "clean" and not said:
            return "unclear", detail, lost
        if rep["outcome"] == "ok" and case.expect:
            return "raw", f"expected {case.expect[0]}, it returned", lost
        return "clean", detail, lost
    if "Traceback (most recent call last)" in text:
        last = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        return "raw", "traceback: " + (last[-1][:300] if last else ""), []
    if code < 0:
        return "raw", f"killed by signal {-code}", []
    if case.must_refuse and code == 0:
        return "unsafe", "exported: " + stdout.strip()[:200], []
    if case.check_output and code == 0:
        problem = _check_export(case.check_output, stdout, folder)
        if problem:
            return "unsafe", problem, []
    if code == 0:
        return "clean", stdout.strip().splitlines()[-1][:200] if stdout.strip() else "", []
    said = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    message = said[-1] if said else f"exit {code}"
    if "error" not in message.lower() and "usage" not in text.lower():
        return "raw", f"exit {code} without an error message: {message[:200]}", []
    if case.must_say and not all(w.lower() in text.lower() for w in case.must_say):
        return "unclear", message[:300], []
    return "clean", message[:300], []


def _check_export(kind: str, text: str, folder: Path) -> str:
    path = folder / ("export.sh" if kind == "bash" else "export.py")
    path.write_text(text)
    cmd = (
        ["bash", "-n", str(path)]
        if kind == "bash"
        else [sys.executable, "-m", "py_compile", str(path)]
    )
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return f"{kind} rejects the export: {done.stderr.strip()[:200]}"
    return ""


# -- the table -----------------------------------------------------------------------------
COLUMNS = ("cases", "clean", "raw", "unsafe", "unclear", "hang", "orphans", "state lost")


def table(outcomes: list[Outcome]) -> list[list[str]]:
    rows = []
    surfaces = list(dict.fromkeys(o.case.surface for o in outcomes))
    for surface in [*surfaces, "all"]:
        mine = [o for o in outcomes if surface in ("all", o.case.surface)]
        rows.append(
            [
                surface,
                str(len(mine)),
                str(sum(o.verdict == "clean" for o in mine)),
                str(sum(o.verdict == "raw" for o in mine)),
                str(sum(o.verdict == "unsafe" for o in mine)),
                str(sum(o.verdict == "unclear" for o in mine)),
                str(sum(o.verdict == "hang" for o in mine)),
                str(sum(o.orphans for o in mine)),
                str(sum(bool(o.state_lost) for o in mine)),
            ]
        )
    return rows


def print_table(rows: list[list[str]]) -> None:
    header = ["surface", *COLUMNS]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=False))
            )
        )


def print_before_after(before_path: Path, after_path: Path) -> int:
    """One table per run, and the cases whose outcome changed."""
    runs = [json.loads(p.read_text()) for p in (before_path, after_path)]
    for title, run in zip(("before", "after"), runs, strict=True):
        outcomes = [
            Outcome(
                Case(r["surface"], r["case"]),
                r["verdict"],
                r["orphans"],
                r["state_lost"],
                r["seconds"],
                r["detail"],
            )
            for r in run
        ]
        print(f"== {title} ({len(outcomes)} cases)")
        print_table(table(outcomes))
        print()
    before = {(r["surface"], r["case"]): r for r in runs[0]}
    still = [r for r in runs[1] if r["verdict"] != "clean" or r["orphans"] or r["state_lost"]]
    print(f"not clean after: {len(still)}")
    for r in still:
        was = before.get((r["surface"], r["case"]), {}).get("verdict", "?")
        print(f"  [{r['surface']}] {r['case']}: {was} -> {r['verdict']}: {r['detail'][:150]}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=None, help="a checkout to run instead")
    parser.add_argument("--surface", action="append", default=[], help="only these surfaces")
    parser.add_argument("--match", default="", help="only cases whose name holds this text")
    parser.add_argument("--json", type=Path, default=None, help="write every outcome here")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument(
        "--tables",
        nargs=2,
        type=Path,
        metavar=("BEFORE.json", "AFTER.json"),
        help="print the before/after tables of two saved runs (--json) and exit",
    )
    args = parser.parse_args()
    if args.tables:
        return print_before_after(*args.tables)
    chosen = [
        c
        for c in cases()
        if (not args.surface or c.surface in args.surface) and args.match in c.name
    ]
    target = args.target.resolve() if args.target else None
    print(f"{len(chosen)} cases against {target or ROOT}; load {os.getloadavg()[0]:.1f}")
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="gpudiag-borders-") as tmp:
        folder = Path(tmp)
        write_files(folder)
        for case in chosen:
            outcome = run_case(case, folder, target, args.python)
            outcomes.append(outcome)
            flag = outcome.verdict + (f" +{outcome.orphans} orphans" if outcome.orphans else "")
            flag += " STATE LOST " + ",".join(outcome.state_lost) if outcome.state_lost else ""
            head = f"  [{case.surface}] {case.name}: {flag} ({outcome.seconds:.1f} s)"
            print(f"{head} {outcome.detail[:160]!r}", flush=True)
    print()
    print_table(table(outcomes))
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "surface": o.case.surface,
                        "case": o.case.name,
                        "verdict": o.verdict,
                        "orphans": o.orphans,
                        "state_lost": o.state_lost,
                        "seconds": round(o.seconds, 1),
                        "detail": o.detail,
                    }
                    for o in outcomes
                ],
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
