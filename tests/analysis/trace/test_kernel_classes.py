"""The kernel classifier: one family per row, checked on real kernel names.

Names marked "recorded" occur in tests/fixtures/traces (the test at the bottom checks that
they do). Families no fixture holds use names as the libraries publish them (cuBLASLt
nvjet, CUTLASS 3, TensorRT-LLM, FlashAttention, cuDNN SDPA, DeepGEMM, symmetric memory,
custom all-reduce): those are marked "published".
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpudiag.analysis.trace import TraceReport, analyze_trace
from gpudiag.analysis.trace.kernel_classes import (
    AMD,
    COMMUNICATION,
    COMPUTE,
    FAMILIES,
    NVIDIA,
    classify_kernel,
    kernel_dtype,
)
from gpudiag.analysis.trace.kernels import kernel_category, uses_tensor_cores
from gpudiag.analysis.trace.model import Kind
from tests.analysis.trace.conftest import TraceBuilder

Report = Callable[[str], TraceReport]

# (name, family, category, tensor cores, vendor, dtype the name states, source)
# fmt: off
CASES: list[tuple[str, str, str, bool | None, str | None, str | None, str]] = [
    # -- NVIDIA GEMM -------------------------------------------------------------------
    ("volta_sgemm_128x32_nt", "cublas-simt", COMPUTE, False, NVIDIA, "fp32", "recorded"),
    ("ampere_sgemm_128x64_nn", "cublas-simt", COMPUTE, False, NVIDIA, "fp32", "recorded"),
    ("ampere_gcgemm_64x64_nt", "cublas-simt", COMPUTE, False, NVIDIA, None, "recorded"),
    ("volta_h884gemm_64x64_ldg8_nn", "cublas-tensorop", COMPUTE, True, NVIDIA, "fp16",
     "published"),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn", "cublas-tensorop",
     COMPUTE, True, NVIDIA, "bf16", "published"),
    ("ampere_tf32_s1688gemm_tf32_128x128_32x3_nn", "cublas-tensorop", COMPUTE, True, NVIDIA,
     "tf32", "published"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopB_NNT", "cublaslt-nvjet", COMPUTE, True, NVIDIA,
     None, "published"),
    ("nvjet_sm100_tst_64x32_64x16_2x1_2cta_h_bz_TNT", "cublaslt-nvjet", COMPUTE, True,
     NVIDIA, None, "published"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1>"
     "(cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1::Params)", "cutlass2", COMPUTE,
     True, NVIDIA, "tf32", "recorded"),
    ("cutlass_80_simt_sgemm_128x128_8x4_nn_align1", "cutlass-simt", COMPUTE, False, NVIDIA,
     "fp32", "published"),
    ("cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x256x64_1x2x1_0_tnn_align8"
     "_warpspecialized_cooperative_epi_tma", "cutlass3", COMPUTE, True, NVIDIA, "bf16",
     "published"),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, "
     "int>, cutlass::gemm::collective::CollectiveMma<cutlass::gemm::"
     "MainloopSm90TmaGmmaWarpSpecializedPingpong<4, cute::tuple<cute::C<1> > >, "
     "cutlass::float_e4m3_t, cutlass::float_e4m3_t> > >(Params)", "cutlass3", COMPUTE, True,
     NVIDIA, "fp8", "published"),
    ("sm100_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64", "xmma", COMPUTE, True,
     NVIDIA, "bf16", "published"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1",
     "xmma", COMPUTE, True, NVIDIA, "bf16", "published"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8", "cublas-simt", COMPUTE,
     False, NVIDIA, "fp32", "published"),
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x"
     "16_stage4_warpsize2x2x1_g1_tensor16x8x8_alignc4_execute_kernel_cudnn", "xmma", COMPUTE, True,
     NVIDIA, "tf32", "recorded"),
    ("bmm_E4m3_E4m3E4m3_Fp32_t128x8x512u2_s6_et64x8_m64x8x32_cga1x1x1_16dp256b_TN_transOut"
     "_schedS_sm100a", "trtllm-gemm", COMPUTE, True, NVIDIA, "fp8", "published"),
    ("bmm_MxE2m1_MxE2m1MxE2m1_Fp32_t128x8x512u2_s4_et64x8_m64x8x64_cga1x1x1_16dp256b_TN"
     "_sm100f", "trtllm-gemm", COMPUTE, True, NVIDIA, "mxfp4", "published"),
    ("bmm_Bfloat16_E2m1E2m1_Fp32_bA16_bB16_t128x8x512u2_s4_TN_sm100f", "trtllm-gemm",
     COMPUTE, True, NVIDIA, "fp4", "published"),
    ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<0u, 4096u, 7168u, 1u, 128u, 160u, 128u>"
     "(float*, int*, int, int, int, CUtensorMap, CUtensorMap)", "deepgemm", COMPUTE, True,
     NVIDIA, "fp8", "published"),
    # -- NVIDIA attention --------------------------------------------------------------
    ("fmhaSm100aKernel_QkvE4m3OBfloat16HQk128HV128SeparateQkvCausalP32VarSeqQ128Kv128"
     "PersistentContext", "trtllm-fmha", COMPUTE, True, NVIDIA, "fp8", "published"),
    ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
     "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, "
     "false, true, false, false, true, true, false, false>(Flash_fwd_params)",
     "flash-attention", COMPUTE, True, NVIDIA, "bf16", "published"),
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
     "flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, "
     "cute::tuple<cute::C<128>, cute::C<176>, cute::C<128> >, 128, cutlass::half_t> > > >"
     "(flash::FlashAttnFwdSm90::Params)", "flash-attention", COMPUTE, True, NVIDIA, "fp16",
     "published"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_6_64x128x128_4x1x1"
     "_kernel0_0", "cudnn-sdpa", COMPUTE, True, NVIDIA, "fp16", "published"),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<"
     "cutlass::half_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
     "mem-efficient-attention", COMPUTE, True, NVIDIA, "fp16", "published"),
    # -- cuDNN ---------------------------------------------------------------------------
    ("volta_scudnn_128x64_relu_interior_nn_v1", "cublas-simt", COMPUTE, False, NVIDIA,
     "fp32", "recorded"),
    ("volta_fp16_s884cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1",
     "cublas-tensorop", COMPUTE, True, NVIDIA, "fp16", "published"),
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, "
     "float const*, int, float const*, int, float*, kernel_grad_params, unsigned long long, "
     "int, unsigned long long, int, float, int, int, int)", "cudnn", COMPUTE, False, NVIDIA,
     "fp32", "recorded"),
    # -- AMD -----------------------------------------------------------------------------
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x256x32_MI16x16x1_SN_LDSB1_AFC1",
     "hipblaslt", COMPUTE, True, AMD, "bf16", "recorded"),
    ("Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1_AFEM1",
     "hipblaslt", COMPUTE, True, AMD, "fp32", "recorded"),
    ("Cijk_Ailk_Bljk_BBS_BH_MT64x64x64_MI16x16x16x1_SN_1LDSB0_APM1_ABV0_ACED0_AF0EM1",
     "tensile-mfma", COMPUTE, True, AMD, "bf16", "recorded"),
    ("Cijk_Ailk_Bljk_SB_MT64x64x8_SE_APM1_AF0EM8_AF1EM1_AMAS3_ASEM8_BL1_DTL0_EPS1_FL1_GRVW4",
     "tensile", COMPUTE, False, AMD, "fp32", "published"),
    ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x32_wt32x32x8_ws1x1_wr2x2_ta1x8x2x1_"
     "1x4x1x64_tb1x8x2x1_1x4x1x64_gkgs", "miopen-xdlops", COMPUTE, True, AMD, "bf16",
     "recorded"),
    ("batched_transpose_16x32_half", "miopen", COMPUTE, False, AMD, None, "recorded"),
    ("_ZN2ck16tensor_operation6device37kernel_batched_gemm_xdlops_bwd_weightINS_47Gridwise"
     "Gemm_bk0mk1_bk0nk1_mn_xdlops_bwd_weightILi64EttftLNS_25InMemoryDataOperation",
     "ck-matrix", COMPUTE, True, AMD, None, "recorded"),
    ("_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernelINS_40BlockFmha"
     "BatchPrefillPipelineQRKSVSAsyncINS_36BlockFmhaBatchPrefillPipelineProblemIDF16bDF16b",
     "ck-fmha", COMPUTE, True, AMD, None, "recorded"),
    ("_ZN7ck_tile6kentryILi1ENS_12Rmsnorm2dFwdINS_27Rmsnorm2dFwdPipelineOnePassINS_27"
     "Rmsnorm2dFwdPipelineProblemIDF16bDF16bfDF16b", "ck", COMPUTE, False, AMD, None,
     "recorded"),
    ("attn_fwd", "aotriton", COMPUTE, True, None, None, "recorded"),
    ("_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi64ELi8ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_",
     "serving-elementwise", COMPUTE, False, None, None, "recorded"),
    ("_ZN7sgl_hip10activation18act_and_mul_kernelI14__hip_bfloat16TnPFT_RKS3_EXadL_Z4silu",
     "serving-elementwise", COMPUTE, False, None, "bf16", "recorded"),
    # -- Triton --------------------------------------------------------------------------
    ("triton_poi_fused__unsafe_view_mul_silu_2", "triton-inductor", COMPUTE, False, None,
     None, "recorded"),
    ("triton_red_fused_add_mean_mul_pow_rsqrt_0", "triton-inductor", COMPUTE, False, None,
     None, "recorded"),
    ("triton_tem_fused_addmm_0", "triton-template", COMPUTE, None, None, None, "published"),
    ("triton__0d1d2d3d", "triton", COMPUTE, None, None, None, "recorded"),
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1", "triton-matmul", COMPUTE, True, None,
     "bf16", "recorded"),
    ("kernel_unified_attention_3d", "triton-attention", COMPUTE, True, None, None, "recorded"),
    ("_fwd_grouped_kernel_stage1", "triton-attention", COMPUTE, True, None, None, "published"),
    # -- PyTorch elementwise / reductions: plain compute ----------------------------------
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, "
     "at::detail::Array<char*, 3>)", "aten", COMPUTE, False, None, "fp32", "recorded"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, "
     "at::native::MeanOps<c10::BFloat16, float, float, c10::BFloat16>, unsigned int, "
     "c10::BFloat16, 4, 4> >(at::native::ReduceOp<c10::BFloat16, at::native::MeanOps<"
     "c10::BFloat16, float, float, c10::BFloat16>, unsigned int, c10::BFloat16, 4, 4>)", "aten",
     COMPUTE, False, None, "bf16", "recorded"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true, false>"
     "(float*, float const*, int, int, int, bool const*, int, bool)", "aten",
     COMPUTE, False, None, "fp32", "recorded"),
    # -- communication -------------------------------------------------------------------
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "nccl", COMMUNICATION, False,
     None, "fp32", "recorded"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
     "nccl", COMMUNICATION, False, None, None, "recorded"),
    ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "nccl", COMMUNICATION,
     False, None, None, "recorded"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl",
     COMMUNICATION, False, None, "bf16", "published"),
    ("void c10d::symmetric_memory::multimem_all_reduce_kernel<c10::BFloat16, 16, 8>"
     "(c10::BFloat16*, unsigned long, unsigned long, c10d::symmetric_memory::"
     "SymmetricMemory**, unsigned long, unsigned long)", "torch-symm-mem", COMMUNICATION,
     False, NVIDIA, "bf16", "published"),
    ("void c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 16, 8>(float**, "
     "unsigned long, unsigned long, float*, unsigned long, unsigned long, unsigned int**, "
     "unsigned long, unsigned long)", "torch-symm-mem", COMMUNICATION, False, NVIDIA, "fp32",
     "published"),
    ("void c10d::symmetric_memory::two_shot_all_reduce_kernel<c10::BFloat16, 16, 8>"
     "(c10::BFloat16**, unsigned long, unsigned long, unsigned long, unsigned int**, "
     "unsigned long, unsigned long)", "torch-symm-mem", COMMUNICATION, False, NVIDIA, "bf16",
     "published"),
    ("void userbuffers_fp16_sum_inplace_gpu_rw<8>(int, int, int, int, int, int, void**, int, "
     "unsigned long)", "te-userbuffers", COMMUNICATION, False, NVIDIA, "fp16", "published"),
    ("void transformer_engine::detail::cast_transpose_kernel<8, false, __nv_bfloat16, "
     "__nv_fp8_e4m3>(__nv_bfloat16 const*, __nv_fp8_e4m3*)", "transformer-engine", COMPUTE,
     False, NVIDIA, "bf16", "published"),
    ("void vllm::cross_device_reduce_1stage<c10::BFloat16, 8>(vllm::RankData*, "
     "vllm::RankSignals, vllm::Signal*, c10::BFloat16*, int, int)", "custom-allreduce",
     COMMUNICATION, False, None, "bf16", "published"),
    ("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(vllm::RankData*, "
     "vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)", "custom-allreduce",
     COMMUNICATION, False, None, "bf16", "published"),
    # Expert-parallel token dispatch / combine (MoE all-to-all): communication, not compute
    # (ROCm mori's EpDispatchIntraNodeKernel / EpCombineIntraNodeKernel, pplx-kernels'
    # dispatchKernel / combineKernel in namespace pplx, as their sources declare them).
    ("void mori::moe::EpDispatchIntraNodeKernel<__hip_bfloat16>(mori::moe::"
     "EpDispatchCombineArgs<__hip_bfloat16>)", "expert-parallel-a2a", COMMUNICATION, False,
     None, None, "published"),
    ("void mori::moe::EpCombineIntraNodeKernel<__hip_bfloat16>(mori::moe::"
     "EpDispatchCombineArgs<__hip_bfloat16>)", "expert-parallel-a2a", COMMUNICATION, False,
     None, None, "published"),
    ("void pplx::(anonymous namespace)::dispatchKernel<true, true>(int, unsigned long*)",
     "expert-parallel-a2a", COMMUNICATION, False, None, None, "published"),
    # FP8 grouped GEMMs of MoE layers: a Triton persistent kernel (AMD Primus-Turbo's
    # _grouped_fp8_persistent_gemm_kernel), vLLM/SGLang's _w8a8_block_fp8_matmul, aiter's
    # fused-MoE assembly kernels: FP8 products only run on tensor/matrix cores.
    ("_grouped_fp8_persistent_gemm_kernel", "plain-gemm-lowp", COMPUTE, True, None, "fp8",
     "published"),
    ("_w8a8_block_fp8_matmul", "plain-gemm-lowp", COMPUTE, True, None, "fp8", "published"),
    ("_ZN5aiter43fmoe_fp8_blockscale_g1u1_subGU_256_silu_bf16E", "aiter-gemm", COMPUTE, True,
     AMD, "fp8", "published"),
    ("matmul_kernel", "plain-gemm", COMPUTE, None, None, None, "published"),
]
# fmt: on


@pytest.mark.parametrize(
    ("name", "family", "category", "tensor_cores", "vendor", "dtype", "source"),
    CASES,
    ids=[f"{c[1]}:{c[0][:40]}" for c in CASES],
)
def test_kernel_family(
    name: str,
    family: str,
    category: str,
    tensor_cores: bool | None,
    vendor: str | None,
    dtype: str | None,
    source: str,
) -> None:
    got = classify_kernel(name)
    assert (got.family, got.category, got.tensor_cores, got.vendor, got.dtype) == (
        family,
        category,
        tensor_cores,
        vendor,
        dtype,
    )
    # The public wrappers follow the table.
    assert kernel_category(int(Kind.KERNEL), name) == category
    assert uses_tensor_cores(name) is (tensor_cores is True)


def test_recorded_names_are_in_the_fixtures(fixture_kernel_names: set[str]) -> None:
    names = fixture_kernel_names
    for name, *_, source in CASES:
        if source == "recorded":
            assert any(n.startswith(name) for n in names), name[:60]


def test_every_family_is_tested() -> None:
    tested = {c[1] for c in CASES}
    untested = {f.family for f in FAMILIES} - tested
    # Families whose names are all library internals with nothing to pin beyond the row.
    assert untested <= {
        "msccl",
        "deepep",
        "nvshmem",
        "mem-efficient-attention-simt",
        "flashinfer-attention",
        "flashinfer",
        "cublas",
        "rocprim",
        "aiter",
        "cub",
        "fbgemm",
        "marlin",
        "vllm",
        "sglang",
        "triton-helpers",
    }, untested


def test_unknown_kernel_says_it_cannot_tell() -> None:
    got = classify_kernel("my_custom_kernel(float*)")
    assert got.family == "unknown"
    assert got.category == COMPUTE
    assert got.tensor_cores is None
    assert not uses_tensor_cores("my_custom_kernel(float*)")


def test_memcpy_and_sync_kinds_win_over_names() -> None:
    assert kernel_category(int(Kind.MEMCPY), "Memcpy HtoD (Pageable -> Device)") == "memory"
    assert kernel_category(int(Kind.MEMSET), "ncclKernel_looks_like_comm") == "memory"
    assert kernel_category(int(Kind.GPU_SYNC), "Event Sync") == "sync"


def test_op_dtype_wins_over_the_name() -> None:
    # batched_transpose_*_half moves 2-byte elements: on the MI300X ResNet trace they are
    # bf16, so the name states no dtype and the operator's Input type decides.
    assert kernel_dtype("batched_transpose_16x32_half") == (None, "unknown")
    assert kernel_dtype("batched_transpose_16x32_half", "bf16") == ("bf16", "op input type")
    assert kernel_dtype("volta_sgemm_128x32_nt") == ("fp32", "kernel name")
    assert kernel_dtype("volta_sgemm_128x32_nt", "fp16") == ("fp16", "op input type")


# -- on the real traces -----------------------------------------------------------------

MI300_QWEN = "tracelens-mi300-Qwen_Qwen1.5-0.5B-Chat.json.gz"
MI300_RESNET = "tracelens-mi300-resnet_act_checkpoint.json.gz"
MI250 = "hta-amd_trace-mi250_minitoy_train_ROCm6_2_kineto.json.gz"
SGLANG = "tracelens-inference-sglang_Qwen3-8B_prefilldecode.json.gz"
COMPILE = "tracelens-torch_compile_triton.json.gz"


@pytest.mark.parametrize("name", [MI300_QWEN, MI250, SGLANG, COMPILE])
def test_amd_gemm_time_counts_as_matrix_cores(report_of: Report, name: str) -> None:
    report = report_of(name)
    tc = report.rank().tensor_cores
    assert tc is not None
    gemm = [k for k in report.kernels() if k.provider in ("hipBLASLt", "Tensile")]
    assert gemm
    assert all(k.tensor_cores and k.vendor == AMD for k in gemm)
    # Every Tensile/hipBLASLt kernel of these traces names an MFMA instruction.
    assert tc.tensor_core_us >= sum(k.total_us for k in gemm)
    assert report.tensor_core_share is not None
    assert report.tensor_core_share > 0.25


def test_mi300_qwen_gemm_dtype_is_read_from_the_ops(report_of: Report) -> None:
    kernels = report_of(MI300_QWEN).kernels()
    gemm = [k for k in kernels if k.family == "hipblaslt" and k.total_us > 1000]
    assert gemm
    for k in gemm:
        assert (k.dtype, k.dtype_source) == ("bf16", "op input type")
    attention = next(k for k in kernels if k.name == "attn_fwd")
    assert attention.launched_by == "aten::_flash_attention_forward"
    assert attention.tensor_cores


def test_rccl_kernel_is_communication(report_of: Report) -> None:
    report = report_of(MI300_RESNET)
    rccl = next(k for k in report.kernels() if k.name.startswith("ncclDevKernel_Generic"))
    assert rccl.category == COMMUNICATION
    # The time breakdown counts it as communication (busy time, overlaps merged).
    comm_us = report.time_breakdown()["communication_us"]
    assert 0.5 * rccl.total_us < comm_us <= rccl.total_us


def test_triton_pointwise_kernels_are_not_unknown(report_of: Report) -> None:
    report = report_of(COMPILE)
    tc = report.rank().tensor_cores
    assert tc is not None
    # Inductor's pointwise/reduction kernels cannot use tensor cores; nothing is unknown.
    assert tc.unknown_us == 0.0
    triton = [k for k in report.kernels() if k.name.startswith("triton_")]
    assert triton
    assert all(not k.tensor_cores and k.tensor_cores_known for k in triton)


def test_unknown_tensor_core_time_is_not_counted_as_without(
    builder: TraceBuilder, tmp_path: Path
) -> None:
    builder.step(1, 0, 400)
    builder.op("aten::mm", 10, 20)
    builder.launch(12, 50, 100, "triton_tem_fused_mm_0")
    builder.op("aten::mm", 40, 20)
    builder.launch(42, 200, 50, "volta_sgemm_128x32_nt")
    tc = analyze_trace(builder.write(tmp_path / "t.json")).rank().tensor_cores
    assert tc is not None
    assert (tc.unknown_us, tc.tensor_core_us) == (100, 0)
    assert tc.eligible_without_tensor_cores_us == 50


def test_pooled_kernels_of_a_folder_keep_their_class(traces_dir: Path) -> None:
    report = analyze_trace(traces_dir / "param-dlrm-8rank-v100")
    sgemm = next(k for k in report.kernels() if k.name == "volta_sgemm_128x32_nt")
    assert (sgemm.family, sgemm.provider, sgemm.vendor) == ("cublas-simt", "cuBLAS/cuDNN", NVIDIA)
    assert (sgemm.dtype, sgemm.tensor_cores_known) == ("fp32", True)


def test_symmetric_memory_all_reduce_counts_as_communication(
    builder: TraceBuilder, tmp_path: Path
) -> None:
    # A Blackwell-style step: a GEMM, then a multimem all-reduce (torch symmetric memory).
    builder.step(1, 0, 300)
    builder.op("aten::mm", 10, 20)
    builder.launch(12, 40, 80, "nvjet_sm100_tst_64x32_64x16_2x1_2cta_h_bz_TNT")
    builder.op("symm_mem::multimem_all_reduce_", 60, 20)
    builder.launch(
        62,
        130,
        20,
        "void c10d::symmetric_memory::multimem_all_reduce_kernel<c10::BFloat16, 16, 8>"
        "(c10::BFloat16*, unsigned long, unsigned long)",
    )
    report = analyze_trace(builder.write(tmp_path / "t.json"))
    b = report.time_breakdown()
    assert (b["compute_us"], b["communication_us"]) == (80, 20)
    assert report.tensor_core_share == 1.0
