"""Readable kernel names, on the issue's examples and on every kernel name in the fixtures."""

from __future__ import annotations

import pytest

from gpudiag.analysis.trace.kernel_names import demangle_name, readable_kernel_name
from gpudiag.analysis.trace.kernels import short_name


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, "
            "float, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, "
            "float const*, int)",
            "cunn_SoftMaxForward<4, float, float, float, SoftMaxForwardEpilogue>",
        ),
        (
            "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true, "
            "false>(float*, float const*, int, int, int, bool const*, int, bool)",
            "softmax_warp_forward<float, float, float, 10, true, false>",
        ),
        (
            "at::cuda::(anonymous namespace)::spin_kernel(long)",
            "spin_kernel",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::"
            "threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::"
            "{lambda(float, float)#1}, at::detail::Array<char*, 3> >(int, at::native::"
            "threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::"
            "{lambda(float, float)#1}, at::detail::Array<char*, 3>)",
            "vectorized_elementwise_kernel<4, threshold_kernel_impl<float>::lambda, "
            "Array<char*, 3>>",
        ),
        (
            "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<"
            "at::native::(anonymous namespace)::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
            "::{lambda()#2}::operator()() const::{lambda()#14}::operator()() const::"
            "{lambda(float)#1}>(at::TensorIteratorBase&, float const&)::{lambda(int)#1}>(int, "
            "float)",
            "elementwise_kernel<128, 2, gpu_kernel_impl<direct_copy_kernel_cuda::lambda>::lambda>",
        ),
        (
            "std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, "
            "float, float, float, false, true, true, false, 7, false, cublasGemvParamsEx<int, "
            "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float"
            " const>, cublasGemvTensorStridedBatched<float>, float> >(cublasGemvParamsEx<int>)",
            "internal::gemvx::kernel<int, int, float, float, float, float, false, true, true, "
            "false, 7, false, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float "
            "const>, cublasGemvTensorStridedBatched<float const>, "
            "cublasGemvTensorStridedBatched<float>, float>>",
        ),
        ("void foo<int, 2>(float*, int)", "foo<int, 2>"),
        ("volta_sgemm_128x32_nt", "volta_sgemm_128x32_nt"),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "ncclDevKernel_Generic"),
        (
            "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi64ELi8ELb0ELb0ELb1ELi1EEEvPT0_PT_"
            "PfS4_S4_S4_diiiiiiib",
            "aiter::add_rmsnorm_quant_kernel",
        ),
        (
            "_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernelINS_40Block",
            "ck_tile::kentry<FmhaBatchPrefillWithPagedKVCacheKernel>",
        ),
        (
            "_ZN2ck16tensor_operation6device12_GLOBAL__N_149kernel_grouped_conv_fwd_multiple_"
            "abd_xdl_cshuffleINS_34GridwiseGemmMultipleD_xdl_cshuffle",
            "ck::tensor_operation::device::kernel_grouped_conv_fwd_multiple_abd_xdl_cshuffle",
        ),
    ],
)
def test_readable_names(name: str, expected: str) -> None:
    assert readable_kernel_name(name, width=400) == expected
    short = short_name(name)  # the table width
    assert short == expected if len(expected) <= 80 else short == expected[:79] + "\u2026"


def test_width_and_fallbacks() -> None:
    assert len(short_name("k" * 300)) == 80
    assert short_name("k" * 300).endswith("\u2026")
    odd = "void at::native::(anonymous namespace)::(int)"  # no function name left
    assert short_name(odd) == odd
    assert short_name("   ") == "?"
    assert demangle_name("_Zgarbage") == "_Zgarbage"
    assert readable_kernel_name("_Z3fooi") == "foo"


def test_every_fixture_kernel_name_is_readable(fixture_kernel_names: set[str]) -> None:
    """Before this module, 51 of the fixtures' 642 distinct kernel names came out empty or
    as a bare namespace ("at::native::")."""
    names = fixture_kernel_names
    assert len(names) > 600
    for name in names:
        short = short_name(name)
        assert short, name
        assert not short.endswith("::"), name
        assert "anonymous namespace" not in short, name
        assert not short.startswith(("void ", "at::native::")), name
        assert len(short) <= 80, name
