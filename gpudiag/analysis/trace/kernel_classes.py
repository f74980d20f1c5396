"""What a GPU kernel is, from its name: one ordered table of library naming patterns.

Each row of ``FAMILIES`` names a family of kernels (cuBLAS, CUTLASS 3, NCCL, Tensile, ...)
and says what its name tells: category (compute or communication), whether it runs on
tensor cores / AMD matrix cores (True, False, or None when the name cannot tell), the
library, the vendor where the name is vendor-specific, and how to read a dtype from it. The
first row whose pattern matches wins, so narrow rows (FP32 kernels inside tensor-core
libraries) come before broad ones.

Each row also says what work its kernels do (``work``): matrix products and convolutions
("gemm"), fused attention, communication, memory-bound work (element-wise, normalisation,
reductions, copies, gathers inside kernels) or other. It is the one classifier every part of
gpudiag reads: the time ledger's rows, the rules (``is_library_kernel`` says whose kernel it
is), the tensor-core share.

A name is a hint, not evidence: where the trace recorded the launching operator's
``Input type``, that dtype wins over the name's (``kernel_dtype``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

COMPUTE, COMMUNICATION, MEMORY, SYNC = "compute", "communication", "memory", "sync"
NVIDIA, AMD = "NVIDIA", "AMD"
# What a kernel's work is (``KernelClass.work``).
GEMM, ATTENTION, MEMORY_BOUND, OTHER = "gemm", "attention", "memory-bound", "other"
WORKS: tuple[str, ...] = (GEMM, ATTENTION, COMMUNICATION, MEMORY_BOUND, OTHER)

DtypeReader = Callable[[str], str | None]
WorkReader = Callable[[str], str]


@dataclass(frozen=True)
class KernelClass:
    """What a kernel's name says about it (``provider``: the library that ships it).

    ``tensor_cores``: True when the name says it runs on tensor cores (NVIDIA) or matrix
    cores (AMD MFMA), False when it says it does not, None when the name cannot tell (a
    Triton template, an unknown kernel). ``dtype``: the input dtype the name states, or None.
    ``work``: gemm, attention, communication, memory-bound or other (``WORKS``).
    """

    family: str
    category: str
    tensor_cores: bool | None
    provider: str | None
    vendor: str | None
    dtype: str | None
    work: str = OTHER

    @property
    def is_library(self) -> bool:
        """Whether a tuned library or PyTorch itself ships the kernel (not the user's code).

        A kernel no row knows is the user's own; so are generic Triton kernels and Inductor's
        generated ones, whose block sizes and warps are a config the user (or torch.compile's
        autotuner) chooses. Libraries' Triton kernels (attention, MoE matmuls) are libraries'."""
        return self.family not in USER_FAMILIES

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "category": self.category,
            "tensor_cores": self.tensor_cores,
            "provider": self.provider,
            "vendor": self.vendor,
            "dtype": self.dtype,
            "work": self.work,
        }


@dataclass(frozen=True)
class KernelFamily:
    """One row of the table: a name pattern and what a match means."""

    family: str
    pattern: re.Pattern[str]
    category: str
    tensor_cores: bool | None
    provider: str | None
    vendor: str | None
    dtype: DtypeReader | None = None
    work: str | WorkReader = OTHER

    def work_of(self, name: str) -> str:
        return self.work if isinstance(self.work, str) else self.work(name)


# -- dtype readers, one per naming grammar ----------------------------------------------------

# Spellings of dtypes inside kernel names and template arguments -> gpudiag's short names
# (the ones gpudiag.analysis.costed_ops uses, plus fp4 / mxfp4 / tf32 that only names state).
_TOKEN_DTYPES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.IGNORECASE), d)
    for p, d in (
        (r"mxe2m1|mxfp4", "mxfp4"),
        (r"mxe4m3|mxfp8", "mxfp8"),
        (r"e2m1|nvfp4|fp4", "fp4"),
        (r"e4m3|e5m2|fp8|float8", "fp8"),
        (r"tf32|tfloat32", "tf32"),
        (r"bf16|bfloat16", "bf16"),
        (r"fp16|f16|half", "fp16"),
        (r"fp64|f64|double", "fp64"),
        (r"int8|i8", "int8"),
        (r"fp32|f32|float", "fp32"),
    )
)


def _first_dtype(text: str) -> str | None:
    """The dtype named earliest in ``text`` (word-ish tokens only)."""
    best: tuple[int, str] | None = None
    for pattern, dtype in _TOKEN_DTYPES:
        for m in pattern.finditer(text):
            # A token, not a fragment of a longer word ("shalf", "f160").
            before = text[m.start() - 1] if m.start() else "_"
            after = text[m.end()] if m.end() < len(text) else "_"
            if before.isalpha() and before.lower() not in "_:<, " and dtype != "fp32":
                continue
            if after.isdigit():
                continue
            if best is None or m.start() < best[0]:
                best = (m.start(), dtype)
            break
    return best[1] if best else None


# C++ spellings inside template arguments (``<float, c10::BFloat16>``).
_CXX_TYPES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), d)
    for p, d in (
        (
            r"\b(?:c10::BFloat16|__nv_bfloat16|__hip_bfloat16|cutlass::bfloat16_t|bfloat16)\b",
            "bf16",
        ),
        (r"\b(?:c10::Half|__half|cutlass::half_t|half)\b", "fp16"),
        (
            r"\b(?:c10::Float8_e4m3fn\w*|c10::Float8_e5m2\w*|__nv_fp8_e4m3|__nv_fp8_e5m2|"
            r"cutlass::float_e4m3_t|cutlass::float_e5m2_t)\b",
            "fp8",
        ),
        (r"\bdouble\b", "fp64"),
        (r"\bfloat\b", "fp32"),
    )
)


def _template_dtype(name: str) -> str | None:
    """The first C++ type among a templated kernel's template arguments."""
    lt = name.find("<")
    if lt < 0:
        return None
    args = name[lt:]
    paren = _top_level_paren(args)
    if paren >= 0:
        args = args[:paren]
    best: tuple[int, str] | None = None
    for pattern, dtype in _CXX_TYPES:
        m = pattern.search(args)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), dtype)
    return best[1] if best else None


def _top_level_paren(text: str) -> int:
    depth = 0
    for i, ch in enumerate(text):
        if ch in "<[{":
            depth += 1
        elif ch in ">]}":
            depth -= 1
        elif ch == "(" and depth <= 0:
            return i
    return -1


# cuBLAS / cuDNN legacy names: <arch>_[<in>_]<s|h|d|i><mma shape>gemm/cudnn...
_CUBLAS_DTYPE = re.compile(
    r"(?:^|_)(?:(?P<in>bf16|fp16|tf32|int8|i8)_)?(?P<acc>[shdicz])(?:884|1688|16816|16832|8816|8832|"
    r"gemm|cudnn|gemv)",
    re.IGNORECASE,
)


def _cublas_dtype(name: str) -> str | None:
    m = _CUBLAS_DTYPE.search(name)
    if m is None:
        return _first_dtype(name)
    if m.group("in"):
        return _first_dtype(m.group("in"))
    acc = m.group("acc").lower()
    mma = re.match(r"[shdicz](884|1688|16816|16832|8816|8832)", name[m.start("acc") :])
    if acc == "h":
        return "fp16"
    if acc == "i":
        return "int8"
    if acc == "d" or acc == "z":
        return "fp64"
    if acc == "s":
        # s1688gemm without an input type: CUTLASS/cuBLAS TF32 kernels (fp32 in, TF32 math).
        return "tf32" if mma else "fp32"
    return None


# Tensile / hipBLASLt: Cijk_A<idx>_B<idx>_<A/B type char>... (Tensile's ProblemType naming).
_TENSILE_DTYPE = re.compile(r"Cijk_A\w*?_B\w*?_(?P<t>F8B8|B8F8|F8|B8|I8|4xi8|[SDHBXCZI])(?=[A-Z_])")
_TENSILE_TYPES = {
    "S": "fp32",
    "D": "fp64",
    "H": "fp16",
    "B": "bf16",
    "X": "tf32",  # xf32
    "I8": "int8",
    "4xi8": "int8",
    "F8": "fp8",
    "B8": "fp8",
    "F8B8": "fp8",
    "B8F8": "fp8",
}


def _tensile_dtype(name: str) -> str | None:
    m = _TENSILE_DTYPE.search(name)
    return _TENSILE_TYPES.get(m.group("t")) if m else None


# TensorRT-LLM / FlashInfer generated GEMMs: bmm_<out>_<A><B>_<acc>_... (the inputs' types
# are the second token: bmm_Bfloat16_E2m1E2m1_Fp32 multiplies FP4 into a bf16 output).
def _trtllm_bmm_dtype(name: str) -> str | None:
    tokens = name.split("_")
    inputs = _first_dtype(tokens[2]) if len(tokens) > 2 else None
    return inputs or _first_dtype(tokens[1] if len(tokens) > 1 else name)


# TensorRT-LLM FMHA: fmhaSm100aKernel_QkvE4m3OBfloat16... / _QBfloat16KvE4m3...
_TRTLLM_FMHA = re.compile(r"_Q(?:kv)?(?P<q>E4m3|E5m2|E2m1|Bfloat16|Fp16|Fp32)")


def _trtllm_fmha_dtype(name: str) -> str | None:
    m = _TRTLLM_FMHA.search(name)
    return _first_dtype(m.group("q")) if m else _first_dtype(name)


def _name_then_template(name: str) -> str | None:
    return _template_dtype(name) or _first_dtype(_base_identifier(name))


def _base_identifier(name: str) -> str:
    paren = _top_level_paren(name)
    return name[:paren] if paren >= 0 else name


def _nccl_dtype(name: str) -> str | None:
    if "SendRecv" in name or "Broadcast" in name:
        return None  # moves bytes (int8_t), whatever the tensors are
    m = re.search(r"_(?:Sum|Prod|Min|Max|Avg|PreMulSum|SumPostDiv)_(\w+?)(?:_|\(|$)", name)
    return _first_dtype(m.group(1).replace("_t", "")) if m else _template_dtype(name)


def _no_dtype(name: str) -> str | None:
    return None


# -- the table ----------------------------------------------------------------------------


def _row(
    family: str,
    pattern: str,
    category: str,
    tensor_cores: bool | None,
    provider: str | None,
    vendor: str | None,
    dtype: DtypeReader | None = _name_then_template,
    flags: int = 0,
    *,
    work: str | WorkReader | None = None,
) -> KernelFamily:
    if work is None:
        work = COMMUNICATION if category == COMMUNICATION else _work_by_name
    return KernelFamily(
        family, re.compile(pattern, flags), category, tensor_cores, provider, vendor, dtype, work
    )


# -- work readers, for the families whose kernels do several kinds of work -------------------

# Element-wise, normalisation, reduction, copy, layout, gather/scatter, sort/scan and the small
# fused epilogues of serving libraries: bound by memory traffic, not by arithmetic.
_MEMORY_BOUND = re.compile(
    r"elementwise|element_wise|vectorized|unrolled|reduce|reduction|norm|softmax|SoftMax|copy|"
    r"Copy|cat_?array|concat|index|gather|scatter|fill|transpose|permute|nchwToNhwc|nhwcToNchw|"
    r"cast|quant|activation|act_and_mul|silu|gelu|relu|rotary|embedding|kvcache|kv_cache|"
    r"cache|dropout|memset|pool|upsample|im2col|col2im|bn_fw|bn_bw|BatchNorm|batch_norm|"
    r"layer_norm|LayerNorm|rms_?norm|Rmsnorm|SubTensorOp|Op[1-4]dTensor|Moments|GammaBeta|"
    r"multi_tensor_apply|Adam|sgd|RadixSort|Scan|scan|sort|topk|cumsum|arange|"
    r"scalePackedTensor|compute\w*Offsets|embedding|bucketize|segments|bounds_check|"
    r"to_dense|linearize_index|compute_position|store_kv|dense_representation|nll|loss|"
    r"ClassNLL|searchsorted|where|masked|clamp|pow|exp|log|sqrt|tanh|sigmoid|neg|abs",
    re.IGNORECASE,
)
_CONV_OR_GEMM = re.compile(
    r"conv(?!ert)|gemm|gemv|matmul|winograd|wgrad|dgrad|fprop|fft2d|_mm_|bmm|igemm|xdlops", re.I
)


def _work_by_name(name: str) -> str:
    """gemm / memory-bound / other for kernels of libraries that ship several kinds."""
    base = _base_identifier(name)
    if _CONV_OR_GEMM.search(base):
        return GEMM
    if _MEMORY_BOUND.search(base):
        return MEMORY_BOUND
    return OTHER


def _template_work(name: str) -> str:
    """Inductor's templates: matmul / convolution templates, or flex attention."""
    return ATTENTION if re.search(r"attention|flex", name, re.I) else GEMM


def _memory_bound_unless_gemm(name: str) -> str:
    """PyTorch's own kernels, cuDNN's and MIOpen's helpers: memory-bound unless a product."""
    head = _base_identifier(name).split("<", 1)[0]
    return GEMM if _CONV_OR_GEMM.search(head) else MEMORY_BOUND


_I = re.IGNORECASE
_ARCH = r"(?:kepler|maxwell|pascal|volta|turing|ampere|hopper|blackwell|sm\d{2,3}[af]?)"

FAMILIES: tuple[KernelFamily, ...] = (
    # -- communication -------------------------------------------------------------------
    # NCCL and RCCL share names (ncclKernel_* before 2.19, ncclDevKernel_* after; RCCL
    # uses ncclDevKernel_Generic too), so the vendor is not in the name.
    _row("nccl", r"^(?:void )?nccl\w*Kernel", COMMUNICATION, False, "NCCL/RCCL", None, _nccl_dtype),
    _row("msccl", r"^(?:void )?msccl\w*Kernel|mscclpp::", COMMUNICATION, False, "MSCCL", None),
    # torch symmetric memory (c10d::symmetric_memory): multimem / one-shot / two-shot.
    _row(
        "torch-symm-mem",
        r"multimem_all_reduce|multimem_one_shot|multimem_all_gather|multimem_reduce_scatter|"
        r"one_shot_all_reduce|two_shot_all_reduce|symmetric_memory::",
        COMMUNICATION,
        False,
        "torch symmetric memory",
        NVIDIA,
    ),
    # vLLM / SGLang / aiter custom all-reduce, TensorRT-LLM / FlashInfer all-reduce fusion,
    # vLLM quick all-reduce (ROCm).
    _row(
        "custom-allreduce",
        r"cross_device_reduce_[12]stage|custom_all_reduce|customAllReduce|"
        r"oneShotAllReduce|twoShotAllReduce|allreduce_fusion_kernel|lamport_?all_?reduce|"
        r"quickreduce::|allreduce_prototype",
        COMMUNICATION,
        False,
        "custom all-reduce",
        None,
    ),
    _row("deepep", r"deep_ep::", COMMUNICATION, False, "DeepEP", NVIDIA, _no_dtype),
    # Expert-parallel all-to-all of MoE layers (token dispatch and combine) in the other EP
    # libraries: pplx-kernels, ROCm mori, TensorRT-LLM / FlashInfer MoE all-to-all, UCCL-EP,
    # and the generic all-to-all dispatch/combine kernel names they and Triton-distributed use.
    _row(
        "expert-parallel-a2a",
        r"pplx::|mori::moe::|Ep(?:Dispatch|Combine)\w*Kernel|moe_?a2a|moeA2A|[Aa]2[Aa]_?"
        r"(?:[Dd]ispatch|[Cc]ombine)|all_?to_?all_?(?:dispatch|combine)|[Aa]ll[Tt]o[Aa]ll"
        r"(?:Dispatch|Combine)|(?:dispatch|combine)_?(?:intra|inter)_?node|"
        r"low_latency_(?:dispatch|combine)|uccl::",
        COMMUNICATION,
        False,
        "expert-parallel all-to-all",
        None,
        _no_dtype,
    ),
    # Transformer Engine's userbuffers (communication overlapped with GEMMs).
    _row(
        "te-userbuffers",
        r"userbuffers_|transformer_engine::\w*userbuffers",
        COMMUNICATION,
        False,
        "Transformer Engine",
        NVIDIA,
    ),
    _row("nvshmem", r"^(?:void )?nvshmemi?_", COMMUNICATION, False, "NVSHMEM", NVIDIA, _no_dtype),
    # -- NVIDIA attention ----------------------------------------------------------------
    _row(
        "trtllm-fmha",
        r"^fmhaSm\d+",
        COMPUTE,
        True,
        "TensorRT-LLM",
        NVIDIA,
        _trtllm_fmha_dtype,
        work=ATTENTION,
    ),
    _row(
        "cudnn-sdpa",
        r"cudnn\w*sdpa|sdpa\w*(?:flash|fprop|bprop)\w*(?:wgmma|hmma|umma|tcgen05)?",
        COMPUTE,
        True,
        "cuDNN",
        NVIDIA,
        work=ATTENTION,
    ),
    _row(
        "flash-attention",
        r"flash::|flash_fwd|flash_bwd|flash_attn|FlashAttn|pytorch_flash::",
        COMPUTE,
        True,
        "FlashAttention",
        NVIDIA,
        work=ATTENTION,
    ),
    # Memory-efficient attention (xformers / PyTorch): tensor cores from sm80 for every
    # dtype (fp32 as 3xTF32), before that only for fp16.
    _row(
        "mem-efficient-attention-simt",
        r"fmha_cutlass[FB]_f32\w*_sm(?:50|70|75)",
        COMPUTE,
        False,
        "mem-efficient attention",
        NVIDIA,
        work=ATTENTION,
    ),
    _row(
        "mem-efficient-attention",
        r"fmha_cutlass[FB]|AttentionKernel<|AttentionBackwardKernel<",
        COMPUTE,
        True,
        "mem-efficient attention",
        NVIDIA,
        work=ATTENTION,
    ),
    _row(
        "flashinfer-attention",
        r"flashinfer::\w*(?:Prefill|MLA|mla|Attention)",
        COMPUTE,
        True,
        "FlashInfer",
        NVIDIA,
        work=ATTENTION,
    ),
    _row("flashinfer", r"flashinfer::", COMPUTE, None, "FlashInfer", NVIDIA),
    # -- NVIDIA GEMM libraries -----------------------------------------------------------
    _row(
        "trtllm-gemm",
        r"^bmm_(?:E4m3|E5m2|E2m1|MxE2m1|MxE4m3|Bfloat16|Fp16|Fp32)_",
        COMPUTE,
        True,
        "TensorRT-LLM",
        NVIDIA,
        _trtllm_bmm_dtype,
        _I,
        work=GEMM,
    ),
    _row("deepgemm", r"deep_gemm::", COMPUTE, True, "DeepGEMM", NVIDIA, work=GEMM),
    _row("cublaslt-nvjet", r"^nvjet_", COMPUTE, True, "cuBLASLt", NVIDIA, _no_dtype, work=GEMM),
    _row(
        "cutlass-simt",
        r"cutlass\w*_simt_|cutlass\w*_[sd]gemm_(?!tensorop)|cutlass[\w:]*?OpClassSimt",
        COMPUTE,
        False,
        "CUTLASS",
        NVIDIA,
        _cublas_dtype,
        work=GEMM,
    ),
    _row(
        "cutlass3",
        r"cutlass3x_sm\d+|cutlass::device_kernel<\w*(?:::\w+)*::(?:GemmUniversal|Gemm)\b|"
        r"Sm(?:90|100|120)\w*(?:Gmma|Umma|TmaWarpSpecialized)|MainloopSm(?:90|100)",
        COMPUTE,
        True,
        "CUTLASS 3",
        NVIDIA,
        work=GEMM,
    ),
    _row(
        "cutlass2",
        r"cutlass_\d+_(?:wmma_)?tensorop|cutlass[\w:]*?(?:tensorop|TensorOp)",
        COMPUTE,
        True,
        "CUTLASS",
        NVIDIA,
        _cublas_dtype,
        work=GEMM,
    ),
    # FP32/FP64 kernels on the CUDA cores inside cuBLAS/cuDNN/xmma.
    _row(
        "cublas-simt",
        _ARCH
        + r"_g?(?:s|d|c|z)gemm|"
        + _ARCH
        + r"_(?:s|d)cudnn|^(?:cudnn_(?:infer|train)_)?"
        + _ARCH
        + r"_scudnn|f32f32_f32f32_f32|gemv|gemmSN_|gemmk1_kernel|dot_kernel|"
        r"splitKreduce_kernel|cublasLt::splitKreduce|epilogue::impl::globalKernel|"
        r"^(?:void )?[sd]gemm_|magma_[sdcz]gemm",
        COMPUTE,
        False,
        "cuBLAS/cuDNN",
        NVIDIA,
        _cublas_dtype,
        work=GEMM,
    ),
    # sm80_xmma_*, sm90_xmma_*, sm100_* engines of cuBLAS and cuDNN (also CUTLASS-derived
    # sm100_* kernels), and the cuDNN runtime-compiled kernels.
    _row(
        "xmma",
        r"(?:^|_)sm\d{2,3}[af]?_xmma|^sm\d{3}[af]?_\w*(?:gemm|conv|fprop|dgrad|wgrad|mma)|"
        r"cudnn_generated_fort_native|xmma_",
        COMPUTE,
        True,
        "cuBLAS/cuDNN",
        NVIDIA,
        work=GEMM,
    ),
    # Legacy cuBLAS/cuDNN tensor-core names: <arch>_[fp16_]<h|s|i><mma shape>gemm/cudnn.
    _row(
        "cublas-tensorop",
        _ARCH + r"_\w*?(?:[hsi](?:884|1688|16816|16832|8816|8832))(?:gemm|cudnn|\w)|"
        r"(?:^|[^0-9])(?:884|1688|16816|16832|8816|8832)(?:gemm|cudnn)|hmma|wgmma|tcgen05|umma",
        COMPUTE,
        True,
        "cuBLAS/cuDNN",
        NVIDIA,
        _cublas_dtype,
        work=GEMM,
    ),
    _row(
        "cudnn",
        r"cudnn|implicit_convolve_sgemm|explicit_convolve_sgemm|precomputed_convolve_sgemm|"
        r"wgrad_alg\d_engine|dgrad_engine|winograd|fft2d|flip_filter|compute_gemm_pointers",
        COMPUTE,
        False,
        "cuDNN",
        NVIDIA,
        work=_memory_bound_unless_gemm,
    ),
    # Other cuBLAS helpers (scal, reduce, transpose): the tensor-core ones are named above.
    _row("cublas", r"cublas", COMPUTE, False, "cuBLAS", NVIDIA, work=MEMORY_BOUND),
    # -- AMD -----------------------------------------------------------------------------
    # Tensile (rocBLAS) and hipBLASLt (TensileLite, "UserArgs"): MI<m>x<n>x<k>[x<b>] is
    # the MFMA instruction, so a matrix-core kernel; without it, a VALU kernel.
    _row(
        "hipblaslt",
        r"^(?:Custom_)?Cijk_\w*_UserArgs\w*_MI\d+x\d+x\d+",
        COMPUTE,
        True,
        "hipBLASLt",
        AMD,
        _tensile_dtype,
        work=GEMM,
    ),
    _row(
        "tensile-mfma",
        r"^(?:Custom_)?Cijk_\w*_MI\d+x\d+x\d+|^(?:Custom_)?Cijk_\w*MFMA",
        COMPUTE,
        True,
        "Tensile",
        AMD,
        _tensile_dtype,
        work=GEMM,
    ),
    _row(
        "tensile", r"^(?:Custom_)?Cijk_", COMPUTE, False, "Tensile", AMD, _tensile_dtype, work=GEMM
    ),
    # AOTriton flash attention (PyTorch SDPA on ROCm): attn_fwd / attn_bwd / bwd_kernel_*.
    _row(
        "aotriton",
        r"^(?:_?attn_fwd|_?attn_bwd|bwd_kernel_dk_dv|bwd_kernel_dq|bwd_preprocess)\w*$",
        COMPUTE,
        True,
        "AOTriton",
        None,
        work=ATTENTION,
    ),
    # Composable Kernel: FMHA (attention: aiter's mha_* launch these) and xdl(ops)/wmma/mfma
    # kernels and GEMM tiles use matrix cores.
    _row(
        "ck-fmha",
        r"(?:_ZN2ck|ck::|ck_tile|_ZN7ck_tile)[\w:]*?(?:Fmha|fmha)",
        COMPUTE,
        True,
        "Composable Kernel",
        AMD,
        work=ATTENTION,
    ),
    _row(
        "ck-matrix",
        r"(?:_ZN2ck|ck::|ck_tile|_ZN7ck_tile)[\w:]*?(?:xdl|wmma|mfma|Gemm|gemm)",
        COMPUTE,
        True,
        "Composable Kernel",
        AMD,
        work=GEMM,
    ),
    _row("ck", r"_ZN2ck|ck::|ck_tile|_ZN7ck_tile", COMPUTE, False, "Composable Kernel", AMD),
    # MIOpen: igemm_*_gtcx* are the xdlops (MFMA) implicit-GEMM convolutions.
    _row(
        "miopen-xdlops",
        r"^igemm_(?:fwd|bwd|wrw)_gtcx\d*_|_xdlops|xdlops_",
        COMPUTE,
        True,
        "MIOpen",
        AMD,
        work=GEMM,
    ),
    _row(
        "miopen",
        r"^igemm_|^naive_conv|^MIOpen|^miopen|^batched_transpose_|^transpose_(?:NCHW|CNHW|NHWC)|"
        r"^SubTensorOp|^Op[1-4]dTensor|^gridwise_convolution|^Conv_Winograd",
        COMPUTE,
        False,
        "MIOpen",
        AMD,
        _no_dtype,  # "half" in batched_transpose_*_half is the element size, not the dtype,
        work=_memory_bound_unless_gemm,
    ),
    # aiter's assembly and CK GEMMs and fused-MoE GEMMs (fp8/bf16 on MFMA matrix cores).
    _row(
        "aiter-gemm",
        r"(?:_ZN5aiter|aiter::|^aiter_)\w*?(?:fmoe|moe_?gemm|gemm|_mm_|bpreshuffle|mfma)|"
        r"^_?fmoe_|^_ZN5aiter\d*fmoe",
        COMPUTE,
        True,
        "aiter",
        AMD,
        work=GEMM,
    ),
    # Norms, activations, rotary embeddings, caches, quantisation and sampling in the
    # serving libraries: elementwise work, no tensor cores.
    _row(
        "serving-elementwise",
        r"(?:vllm::|sgl_hip|sgl_kernel|sglang::|_ZN5aiter|aiter::)[\w:]*?"
        r"(?:act_and_mul|activation|norm|rotary|cache|copy|quant|sampl|topk|softmax|silu|gelu)",
        COMPUTE,
        False,
        "vLLM/SGLang/aiter",
        None,
        work=MEMORY_BOUND,
    ),
    _row(
        "aiter",
        r"_ZN5aiter|aiter::|^aiter_",
        COMPUTE,
        None,
        "aiter",
        AMD,
    ),
    _row("rocprim", r"rocprim::|hipcub::", COMPUTE, False, "rocPRIM", AMD, work=MEMORY_BOUND),
    # Transformer Engine's own kernels are casts, transposes, norms and activations (its
    # GEMMs are cuBLASLt's, its attention cuDNN's or FlashAttention's, named above).
    _row(
        "transformer-engine",
        r"transformer_engine::",
        COMPUTE,
        False,
        "Transformer Engine",
        NVIDIA,
        work=MEMORY_BOUND,
    ),
    # -- other CUDA/HIP libraries --------------------------------------------------------
    _row("cub", r"(?:^|[\s:])cub::", COMPUTE, False, "CUB", None, _no_dtype, work=MEMORY_BOUND),
    _row(
        "fbgemm",
        r"fbgemm_gpu::|split_embedding|embedding_codegen|bounds_check_indices|"
        r"permute_pooled_embs|_block_bucketize",
        COMPUTE,
        False,
        "FBGEMM",
        None,
        work=MEMORY_BOUND,
    ),
    _row("marlin", r"[Mm]arlin", COMPUTE, True, "Marlin", NVIDIA, work=GEMM),
    _row("vllm", r"vllm::", COMPUTE, None, "vLLM", None),
    _row("sglang", r"sgl_hip|sgl_kernel|sglang::", COMPUTE, None, "SGLang", None),
    # -- Triton --------------------------------------------------------------------------
    # Inductor's pointwise / reduction / persistent-reduction kernels have no tl.dot;
    # its templates (triton_tem_*) and other Triton kernels may or may not.
    _row(
        "triton-inductor",
        r"^triton_(?:poi|red|per)_",
        COMPUTE,
        False,
        "Triton (inductor)",
        None,
        _no_dtype,
        work=MEMORY_BOUND,
    ),
    _row(
        "triton-template",
        r"^triton_tem_",
        COMPUTE,
        None,
        "Triton (inductor)",
        None,
        _no_dtype,
        work=_template_work,
    ),
    # vLLM's Triton attention (kernel_unified_attention_2d/3d) and the Triton attention
    # kernels of SGLang / LightLLM (_fwd_kernel, _fwd_grouped_kernel): tl.dot, tensor cores.
    _row(
        "triton-attention",
        r"^kernel_unified_attention|^_fwd_kernel|^_fwd_grouped_kernel",
        COMPUTE,
        True,
        "Triton",
        None,
        work=ATTENTION,
    ),
    # OpenAI triton_kernels' matmul_ogs (vLLM/SGLang MoE).
    _row(
        "triton-matmul",
        r"^_?matmul_ogs_|^_p_matmul_ogs|^fused_moe_kernel|^_fused_moe",
        COMPUTE,
        True,
        "Triton",
        None,
        work=GEMM,
    ),
    # triton_kernels' MoE routing helpers (no tl.dot).
    _row(
        "triton-helpers",
        r"^_(?:finalize_matmul_scatter|combined_routing|sum_bitmatrix_rows|topk_forward|"
        r"compute_writeback_idx)",
        COMPUTE,
        False,
        "Triton",
        None,
        work=OTHER,
    ),
    _row("triton", r"^triton_|^_?triton", COMPUTE, None, "Triton", None, _no_dtype),
    # A GEMM kernel under a plain identifier (a Triton kernel, a JIT-compiled one: no C++
    # signature): FP8/FP4 products only run on tensor cores; other dtypes cannot be told.
    _row(
        "plain-gemm-lowp",
        r"^(?=\w*(?:gemm|matmul|grouped_mm|_mm_))(?=\w*(?:fp8|e4m3|e5m2|fp4|int8|w8a8))\w+$",
        COMPUTE,
        True,
        None,
        None,
        _first_dtype,
        _I,
        work=GEMM,
    ),
    _row(
        "plain-gemm",
        r"^\w*(?:gemm|matmul|grouped_mm|_mm_)\w*$",
        COMPUTE,
        None,
        None,
        None,
        _no_dtype,
        work=GEMM,
    ),
    # -- PyTorch's own kernels: elementwise, reductions, norms, softmax, copies ----------
    _row(
        "aten",
        r"at::native::|at::cuda::|^(?:void )?(?:\(anonymous namespace\)::)?"
        r"(?:cunn_|softmax_warp|elementwise_kernel|vectorized_elementwise|reduce_kernel|"
        r"indexing_backward|CatArrayBatchedCopy|multi_tensor_apply)",
        COMPUTE,
        False,
        "PyTorch",
        None,
        work=_memory_bound_unless_gemm,
    ),
)

UNKNOWN_FAMILY = "unknown"
# Families whose kernels are the user's code (see ``KernelClass.is_library``).
USER_FAMILIES: frozenset[str] = frozenset({UNKNOWN_FAMILY, "triton", "triton-inductor"})

# The families whose kernels are fused attention (one kernel for QK^T, softmax and PV).
ATTENTION_FAMILIES: frozenset[str] = frozenset(
    {
        "trtllm-fmha",
        "cudnn-sdpa",
        "flash-attention",
        "mem-efficient-attention-simt",
        "mem-efficient-attention",
        "flashinfer-attention",
        "aotriton",
        "ck-fmha",
        "triton-attention",
    }
)


@functools.lru_cache(maxsize=8192)
def classify_kernel(name: str) -> KernelClass:
    """What ``name`` says about a GPU kernel (the first ``FAMILIES`` row that matches).

    A name no row matches is a compute kernel of unknown library whose tensor-core use the
    name cannot tell (``tensor_cores=None``); the generic MMA markers (hmma, wgmma, ...)
    are rows of their own, so a kernel that states them is still found.
    """
    for row in FAMILIES:
        if row.pattern.search(name):
            dtype = row.dtype(name) if row.dtype is not None else None
            return KernelClass(
                row.family,
                row.category,
                row.tensor_cores,
                row.provider,
                row.vendor,
                dtype,
                row.work_of(name),
            )
    return KernelClass(
        UNKNOWN_FAMILY, COMPUTE, None, None, None, _name_then_template(name), _work_by_name(name)
    )


def is_library_kernel(name: str) -> bool:
    """Whether a tuned library or PyTorch itself ships the kernel, not the user's code (see
    ``KernelClass.is_library``): block-size and occupancy advice is for the user's kernels."""
    return classify_kernel(name).is_library


def kernel_dtype(name: str, op_dtype: str | None = None) -> tuple[str | None, str]:
    """The dtype a kernel ran in and where that came from: ("bf16", "op input type") when the
    launching operator's recorded ``Input type`` says so, else what the name states
    ("kernel name"), else (None, "unknown")."""
    if op_dtype:
        return op_dtype, "op input type"
    dtype = classify_kernel(name).dtype
    return (dtype, "kernel name") if dtype else (None, "unknown")
