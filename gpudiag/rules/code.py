"""Source-code rules: API misuse a trace cannot show (deprecated APIs, precision settings the
GPU ignores, GradScaler with bf16, hand-written attention, DataParallel)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, FixRef, Severity

CATEGORY = "code"


# Patterns are plain searches (no ``.*`` between two parts): a pattern like
# ``softmax\s*\(.*(@|matmul).*transpose`` backtracks cubically on a long line, and a 280 KB
# generated line made `gpudiag doctor --code` run for hours. Parts that must come in order on a
# line are searched one after the other instead (``_InOrder``), which takes linear time.


class _InOrder:
    """Each pattern found on the line after the previous one's match (``a.*b.*c``, linearly)."""

    def __init__(self, *patterns: str) -> None:
        self.patterns = [re.compile(p) for p in patterns]

    def search(self, line: str) -> bool:
        pos = 0
        for pattern in self.patterns:
            match = pattern.search(line, pos)
            if match is None:
                return False
            pos = match.end()
        return True


class _CallWith:
    """A call whose arguments (up to its first ``)``) hold ``arg``; linear over the line."""

    def __init__(self, call: str, arg: str) -> None:
        self.call, self.arg = re.compile(call), re.compile(arg)

    def search(self, line: str) -> bool:
        pos = 0
        while (match := self.call.search(line, pos)) is not None:
            close = line.find(")", match.end())
            end = len(line) if close < 0 else close
            if self.arg.search(line, match.end(), end):
                return True
            if close < 0:
                return False
            pos = close + 1  # calls before this ")" share its arguments: already looked at
        return False


def _first(pattern: re.Pattern[str] | _InOrder | _CallWith, code: str) -> tuple[int, str] | None:
    """Line number (1-based) and stripped text of the first line matching ``pattern``."""
    for number, line in enumerate(code.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("#"):
            continue
        if pattern.search(line):
            return number, stripped[:120]
    return None


def _where(hit: tuple[int, str]) -> Evidence:
    return Evidence(f"line {hit[0]}", hit[1], source="source code")


def _gpu_cc(evidence: EvidenceBundle) -> tuple[int, int] | None:
    system = evidence.system
    gpu = system.primary_gpu if system is not None else None
    return gpu.compute_capability if gpu is not None else None


_GRADSCALER = re.compile(r"\bGradScaler\s*\(")
_BF16 = re.compile(r"bfloat16|\bbf16\b")
_FP16 = re.compile(r"\bfloat16\b|\bhalf\b|\bfp16\b")
_OLD_AUTOCAST = re.compile(r"torch\.cuda\.amp\.(autocast|GradScaler)|from torch\.cuda\.amp import")
_SDP_KERNEL = re.compile(r"\bsdp_kernel\s*\(")
_TF32 = re.compile(
    r"allow_tf32\s*=\s*True|set_float32_matmul_precision\(\s*['\"](high|medium)['\"]"
    r"|fp32_precision\s*=\s*['\"]tf32['\"]"
)
# Transformer Engine 2.x spells its FP8 region te.autocast(recipe=...); 1.x fp8_autocast(...).
_FP8 = re.compile(
    r"float8_e4m3|float8_e5m2|fp8_autocast|\bte\.autocast\s*\(|\bFp8\w*\(|torch\._scaled_mm"
)
_SOFTMAX_QK = _InOrder(r"softmax\s*\(", r"@|matmul|bmm|einsum", r"transpose|\.mT\b|\.T\b|->")
_QK = _InOrder(
    r"@|matmul|bmm",
    r"transpose\(\s*-2\s*,\s*-1\s*\)|transpose\(\s*-1\s*,\s*-2\s*\)|\.mT\b",
)
_SOFTMAX = re.compile(r"softmax\s*\(")
_NEAR = 6  # lines between Q.K^T and its softmax in a hand-written attention


def _manual_attention_line(code: str) -> tuple[int, str] | None:
    """softmax(Q.K^T) on one line, or Q.K^T followed within a few lines by a softmax."""
    one_line = _first(_SOFTMAX_QK, code)
    if one_line is not None:
        return one_line
    lines = code.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("#") or not _QK.search(line):
            continue
        if any(_SOFTMAX.search(later) for later in lines[i + 1 : i + 1 + _NEAR]):
            return i + 1, line.strip()[:120]
    return None


_DATAPARALLEL = re.compile(r"\bnn\.DataParallel\s*\(|\bDataParallel\s*\(")
_GLOO = _CallWith(r"init_process_group\s*\(", r"['\"]gloo['\"]")


@rule("code.gradscaler_bf16", category=CATEGORY, needs=("code",))
def gradscaler_with_bf16(evidence: EvidenceBundle) -> Iterator[Finding]:
    """A GradScaler in code that trains in bf16 (bf16 has fp32's range: no scaling needed)."""
    code = evidence.code or ""
    scaler = _first(_GRADSCALER, code)
    if scaler is None or _first(_BF16, code) is None or _first(_FP16, code) is not None:
        return
    yield Finding(
        "code.gradscaler_with_bf16",
        Severity.LOW,
        CATEGORY,
        "GradScaler with bf16 autocast: bf16 has fp32's exponent range, so loss scaling only "
        "adds work (and an inf check that syncs)",
        (_where(scaler),),
        threshold="GradScaler( in code that uses bfloat16 and not float16",
        fix=FixRef("precision.bf16"),
        instruction="drop the GradScaler: call loss.backward() and optimizer.step() directly",
    )


@rule("code.deprecated_api", category=CATEGORY, needs=("code",))
def deprecated_api(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Deprecated torch.cuda.amp and torch.backends.cuda.sdp_kernel calls."""
    code = evidence.code or ""
    amp = _first(_OLD_AUTOCAST, code)
    if amp is not None:
        yield Finding(
            "code.deprecated_cuda_amp",
            Severity.LOW,
            CATEGORY,
            "torch.cuda.amp is deprecated (a FutureWarning every call)",
            (_where(amp),),
            threshold="torch.cuda.amp.autocast / GradScaler in code",
            instruction='use torch.autocast("cuda", dtype=...) and torch.amp.GradScaler("cuda")',
        )
    sdp = _first(_SDP_KERNEL, code)
    if sdp is not None:
        yield Finding(
            "code.deprecated_sdp_kernel",
            Severity.LOW,
            CATEGORY,
            "torch.backends.cuda.sdp_kernel is deprecated",
            (_where(sdp),),
            threshold="sdp_kernel( in code",
            fix=FixRef("attention.backend", {"backend": "flash"}),
            instruction="use torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)",
        )


@rule("code.precision_vs_hardware", category=CATEGORY, needs=("code", "gpu"))
def precision_vs_hardware(evidence: EvidenceBundle) -> Iterator[Finding]:
    """TF32 switches on a GPU without TF32 (cc < 8.0), or fp8 below cc 8.9."""
    code = evidence.code or ""
    cc = _gpu_cc(evidence)
    if cc is None:
        return
    label = f"cc {cc[0]}.{cc[1]}"
    tf32 = _first(_TF32, code)
    if tf32 is not None and cc < (8, 0):
        yield Finding(
            "code.tf32_without_tf32",
            Severity.INFO,
            CATEGORY,
            f"TF32 is switched on but this GPU ({label}) has no TF32: the switch does nothing",
            (_where(tf32), Evidence("compute capability", label, source="system report")),
            threshold="TF32 flags in code and compute capability < 8.0",
            fix=FixRef("precision.fp16") if cc >= (7, 0) else None,
            instruction="for tensor-core speed on this GPU use fp16 autocast with a GradScaler"
            if cc >= (7, 0)
            else "this GPU has no tensor cores: fp32 is the right precision",
        )
    fp8 = _first(_FP8, code)
    if fp8 is not None and cc < (8, 9):
        from gpudiag.specs import features

        bf16 = features(cc).bf16
        yield Finding(
            "code.fp8_unsupported",
            Severity.HIGH,
            CATEGORY,
            f"fp8 is requested but this GPU ({label}) has no fp8 tensor cores (cc 8.9+): it "
            "fails or falls back to slower paths",
            (_where(fp8), Evidence("compute capability", label, source="system report")),
            threshold="fp8 types / Transformer Engine fp8 in code and compute capability < 8.9",
            fix=FixRef("precision.bf16") if bf16 else FixRef("precision.fp16"),
            instruction="use bf16 autocast on this GPU"
            if bf16
            else "use fp16 autocast on this GPU",
        )


@rule("code.manual_attention", category=CATEGORY, needs=("code",))
def manual_attention(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Hand-written softmax(QK^T)V attention: materialises the seq x seq matrix."""
    code = evidence.code or ""
    hit = _manual_attention_line(code)
    if hit is None:
        return
    trace = evidence.trace
    if trace is not None:
        # The code may hold an unused eager path: with a trace, only flag it when softmax ran
        # outside SDPA's math backend (which calls softmax itself).
        calls = {op.name: op.count for op in trace.top_cpu_ops(10_000)}
        sdpa_math = calls.get("aten::_scaled_dot_product_attention_math", 0)
        if calls.get("aten::softmax", 0) <= sdpa_math:
            return
    cc = _gpu_cc(evidence)
    backend = "flash"
    if cc is not None:
        from gpudiag.specs import features

        backend = "flash" if features(cc).flash_attention_2 else "efficient"
    yield Finding(
        "code.manual_attention",
        Severity.MEDIUM,
        CATEGORY,
        "hand-written attention softmax(QK^T)V: memory and time grow with seq^2; the fused "
        "kernels of scaled_dot_product_attention avoid it",
        (_where(hit),),
        threshold="softmax over a Q.K^T product in code",
        fix=FixRef("attention.backend", {"backend": backend}),
        instruction="replace with torch.nn.functional.scaled_dot_product_attention(q, k, v, "
        "is_causal=...)",
    )


@rule("code.data_parallel", category=CATEGORY, needs=("code",))
def data_parallel(evidence: EvidenceBundle) -> Iterator[Finding]:
    """nn.DataParallel, or DDP over gloo when GPUs are present."""
    code = evidence.code or ""
    dp = _first(_DATAPARALLEL, code)
    if dp is not None:
        yield Finding(
            "code.data_parallel",
            Severity.MEDIUM,
            CATEGORY,
            "nn.DataParallel runs one Python thread for all GPUs and copies the model every "
            "step; DistributedDataParallel scales better",
            (_where(dp),),
            threshold="nn.DataParallel( in code",
            instruction="use DistributedDataParallel, one process per GPU (torchrun)",
        )
    gloo = _first(_GLOO, code)
    if gloo is not None and evidence.has("gpu"):
        yield Finding(
            "code.ddp_not_nccl",
            Severity.MEDIUM,
            CATEGORY,
            "the process group uses gloo on a machine with NVIDIA GPUs: NCCL is much faster "
            "for GPU tensors",
            (_where(gloo),),
            threshold="init_process_group('gloo') with an NVIDIA GPU present",
            instruction='init_process_group("nccl") (or "cpu:gloo,cuda:nccl")',
        )


_NUM_WORKERS = re.compile(r"num_workers\s*=\s*([0-9]{1,6})\b")


@rule("code.dataloader_workers", category=CATEGORY, needs=("code", "system"))
def dataloader_workers_vs_cores(evidence: EvidenceBundle) -> Iterator[Finding]:
    """More DataLoader workers than the host has cores (SageMaker's workers-vs-cores rule)."""
    code = evidence.code or ""
    cores = evidence.system_report.host.logical_cores.get()
    if not cores:
        return
    for number, line in enumerate(code.splitlines(), start=1):
        match = _NUM_WORKERS.search(line)
        if match is None or line.strip().startswith("#"):
            continue
        workers = int(match.group(1))
        if workers > int(cores):
            yield Finding(
                "code.dataloader_workers_exceed_cores",
                Severity.LOW,
                CATEGORY,
                f"DataLoader num_workers={workers} but the host has {cores} logical cores: "
                "workers compete with the training process for CPU",
                (
                    _where((number, line.strip()[:120])),
                    Evidence("logical cores", cores, source="host"),
                ),
                threshold="num_workers > logical cores of the host",
                fix=FixRef("dataloader.tuning", {"num_workers": max(1, int(cores) - 1)}),
                instruction="use at most one worker per free core (per GPU process)",
            )
            return
