"""Operators whose work follows from their input shapes (matmul, convolution, attention).

The roofline costs these operators, and the trace loader keeps the input shapes of these and
no others; both read the names from here.
"""

from __future__ import annotations

from collections.abc import Iterable

MATMUL_OPS: frozenset[str] = frozenset(
    {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"}
)
CONV_OPS: frozenset[str] = frozenset(
    {
        "aten::conv1d",
        "aten::conv2d",
        "aten::conv3d",
        "aten::convolution",
        "aten::_convolution",
        "aten::cudnn_convolution",
        "aten::mkldnn_convolution",
    }
)
ATTENTION_OPS: frozenset[str] = frozenset(
    {
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_flash_attention_forward",
    }
)
COSTED_OPS: frozenset[str] = MATMUL_OPS | CONV_OPS | ATTENTION_OPS

# Kineto's "Input type" spellings (lower-cased) -> short dtype names.
DTYPE_NAMES: dict[str, str] = {
    "float": "fp32",
    "float32": "fp32",
    "c10::bfloat16": "bf16",
    "bfloat16": "bf16",
    "c10::half": "fp16",
    "half": "fp16",
    "float16": "fp16",
    "double": "fp64",
    "c10::float8_e4m3fn": "fp8",
    "c10::float8_e5m2": "fp8",
    "float8_e4m3fn": "fp8",
    "signed char": "int8",
    "int8": "int8",
}
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8, "fp8": 1, "int8": 1}


def dtype_of(types: Iterable[object], default: str | None = None) -> str | None:
    """The first tensor dtype among an operator's input types (``default`` when none)."""
    for t in types:
        name = DTYPE_NAMES.get(str(t).lower())
        if name is not None:
            return name
    return default
