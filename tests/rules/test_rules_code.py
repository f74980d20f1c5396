"""Source-code rules: API misuse caught from the text, gated on the GPU's compute capability."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from gpudiag.fixes import Fix
from gpudiag.probe.system import SystemReport, inspect
from gpudiag.rules.engine import EvidenceBundle, run_rules
from gpudiag.rules.finding import Severity


def _ids(code: str, system: SystemReport | None = None) -> dict[str, Severity]:
    diagnosis = run_rules(EvidenceBundle(system=system, code=code, env={}))
    return {f.id: f.severity for f in diagnosis.findings}


def _xml(fixtures_dir: Path, name: str) -> SystemReport:
    return inspect(replay=fixtures_dir / "nvidia-smi-xml" / name)


BF16_WITH_SCALER = """
scaler = torch.amp.GradScaler("cuda")
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = model(x)
scaler.scale(loss).backward()
"""


def test_gradscaler_with_bf16() -> None:
    assert "code.gradscaler_with_bf16" in _ids(BF16_WITH_SCALER)
    fp16 = BF16_WITH_SCALER.replace("bfloat16", "float16")
    assert "code.gradscaler_with_bf16" not in _ids(fp16)


def test_deprecated_apis_with_line_numbers() -> None:
    code = (
        "import torch\n"
        "with torch.cuda.amp.autocast():\n    pass\n"
        "with torch.backends.cuda.sdp_kernel(enable_math=False):\n    pass\n"
    )
    diagnosis = run_rules(EvidenceBundle(code=code, env={}))
    by_id = {f.id: f for f in diagnosis.findings}
    assert by_id["code.deprecated_cuda_amp"].evidence[0].name == "line 2"
    assert by_id["code.deprecated_sdp_kernel"].evidence[0].name == "line 4"
    assert _ids("# torch.cuda.amp.autocast() in a comment\n") == {}


TF32 = "torch.backends.cuda.matmul.allow_tf32 = True\n"
FP8 = "w8 = w.to(torch.float8_e4m3fn)\n"


def test_tf32_flags_on_t4_do_nothing(fixtures_dir: Path) -> None:
    t4 = _ids(TF32, _xml(fixtures_dir, "tesla-t4.xml"))
    assert t4["code.tf32_without_tf32"] is Severity.INFO
    a100 = _ids(TF32, _xml(fixtures_dir, "a100-sxm4-v12.xml"))
    assert "code.tf32_without_tf32" not in a100


def test_fp8_below_cc_89(fixtures_dir: Path) -> None:
    diagnosis = run_rules(
        EvidenceBundle(system=_xml(fixtures_dir, "a100-sxm4-v12.xml"), code=FP8, env={})
    )
    fp8 = next(f for f in diagnosis.findings if f.id == "code.fp8_unsupported")
    assert fp8.severity is Severity.HIGH
    assert fp8.fix is not None
    assert fp8.fix.id == "precision.bf16"  # A100 has bf16
    ada = _ids(FP8, _xml(fixtures_dir, "rtx-4000-sff-ada-v13.xml"))  # cc 8.9
    assert "code.fp8_unsupported" not in ada


def test_precision_vs_hardware_needs_a_gpu() -> None:
    diagnosis = run_rules(EvidenceBundle(code=TF32 + FP8, env={}))
    assert "code.precision_vs_hardware" in {n.rule for n in diagnosis.not_evaluated}


def test_demo_gpt_hand_written_attention_is_found() -> None:
    source = (Path(__file__).resolve().parents[2] / "gpudiag" / "workloads" / "gpt.py").read_text()
    diagnosis = run_rules(EvidenceBundle(code=source, env={}))
    attention = next(f for f in diagnosis.findings if f.id == "code.manual_attention")
    assert attention.fix is not None
    assert attention.fix.id == "attention.backend"
    assert "transpose(-2, -1)" in str(attention.evidence[0].value)


@pytest.mark.parametrize(
    "code",
    [
        "out = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v\n",
        "s = torch.matmul(q, k.mT)\np = s.softmax(-1)\no = p @ v\n",
    ],
)
def test_manual_attention_forms(code: str) -> None:
    assert "code.manual_attention" in _ids(code)


def test_plain_matmul_is_not_attention() -> None:
    assert "code.manual_attention" not in _ids("y = x @ w.T\nz = y.relu()\n")


def test_dataparallel_and_gloo(fixtures_dir: Path) -> None:
    code = 'model = nn.DataParallel(model)\ndist.init_process_group("gloo")\n'
    found = _ids(code, _xml(fixtures_dir, "dual_a5000-v13.xml"))
    assert found["code.data_parallel"] is Severity.MEDIUM
    assert "code.ddp_not_nccl" in found
    assert "code.ddp_not_nccl" not in _ids(code)  # gloo is right without a GPU


def test_more_workers_than_cores() -> None:
    import dataclasses

    from gpudiag.probe.readings import ok

    system = inspect()
    four = dataclasses.replace(system, host=dataclasses.replace(system.host, logical_cores=ok(4)))
    code = "loader = DataLoader(ds, batch_size=64, num_workers=16)\n"
    diagnosis = run_rules(EvidenceBundle(system=four, code=code, env={}))
    finding = next(f for f in diagnosis.findings if f.id == "code.dataloader_workers_exceed_cores")
    assert finding.fix is not None
    assert finding.fix == Fix("dataloader.tuning", num_workers=3)
    assert "code.dataloader_workers_exceed_cores" not in _ids(code.replace("16", "2"), four)


def test_fp8_in_transformer_engine_2_spelling(fixtures_dir: Path) -> None:
    te2 = "with te.autocast(enabled=True, recipe=DelayedScaling()):\n    out = model(x)\n"
    found = _ids(te2, _xml(fixtures_dir, "a100-sxm4-v12.xml"))
    assert "code.fp8_unsupported" in found
    plain = "with torch.autocast('cuda', dtype=torch.bfloat16):\n    out = model(x)\n"
    assert "code.fp8_unsupported" not in _ids(plain, _xml(fixtures_dir, "a100-sxm4-v12.xml"))


# -- the source the code rules read from a workload (gpudiag.doctor.workload_source) ---------
NOTEBOOK_MODEL = '''import torch


class CellAttention(torch.nn.Module):
    """Attention written by hand in a notebook cell."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(-2, -1) * 0.35, dim=-1) @ v
'''


def _cell_source(workload_model: object) -> str | None:
    from gpudiag.doctor import workload_source
    from gpudiag.step import Workload

    return workload_source(Workload(workload_model, batch=lambda n: n))


def test_a_model_class_written_in_a_notebook_cell_is_read(ipython_shell: Any) -> None:
    # A class run through IPython lives in __main__, which has no file: inspect.getsource of
    # the module (and, before Python 3.13, of the class) fails, and every code.* rule was "not
    # evaluated" for a notebook's model. Its text is in the cell IPython keeps in linecache;
    # the model's blocks, from another cell, are read too (the attention is in a block).
    model_cell = (
        "class CellModel(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.block = CellAttention()\n\n"
        "    def forward(self, x):\n"
        "        return self.block(x)\n"
    )
    assert ipython_shell.run_cell(NOTEBOOK_MODEL).success
    assert ipython_shell.run_cell(model_cell).success
    try:
        source = _cell_source(ipython_shell.user_ns["CellModel"]())
    finally:
        for name in ("CellAttention", "CellModel"):
            ipython_shell.user_ns.pop(name, None)
    assert source is not None
    assert source.startswith(model_cell)  # the model's cell, then its block's
    assert NOTEBOOK_MODEL in source
    assert "code.manual_attention" in _ids(source)


def test_a_cell_class_in_a_module_with_a_file_is_read_from_its_cell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A scripted IPython: __main__ is the driving script, while the class came from a cell
    # (its text in linecache under IPython's cell name). The script's text was read instead.
    import linecache
    import types

    driver = types.ModuleType("nc_driver_script")
    driver.__file__ = __file__  # the "script": this test file
    monkeypatch.setitem(sys.modules, driver.__name__, driver)
    cell = "<ipython-input-3-5f0c2a1b9e7d>"
    lines = NOTEBOOK_MODEL.splitlines(keepends=True)
    monkeypatch.setitem(linecache.cache, cell, (len(NOTEBOOK_MODEL), None, lines, cell))
    exec(compile(NOTEBOOK_MODEL, cell, "exec"), driver.__dict__)
    source = _cell_source(driver.CellAttention())
    assert source == NOTEBOOK_MODEL  # the cell, not the script
    assert "test_a_cell_class_in_a_module_with_a_file" not in source  # not the script's text
    assert "code.manual_attention" in _ids(source)


def test_a_model_class_in_a_module_file_reads_the_whole_module() -> None:
    from gpudiag.workloads import gpt

    model = gpt.build(seq_len=8).model
    source = _cell_source(model)
    assert source == Path(gpt.__file__).read_text()
