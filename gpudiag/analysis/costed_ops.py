"""Operators whose work follows from their input shapes (matmul, convolution, attention).

The roofline costs these operators, and the trace loader keeps the input shapes of these and
no others; both read the names from here.
"""

from __future__ import annotations

import functools
import re
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
# A custom operator (a C++/CUDA extension's, registered as ``namespace::name``) named like a
# matrix product: its two matrix inputs give its FLOPs, so a user's own GEMM kernel can be
# set against the roof too. PyTorch's own namespaces are not custom.
_CUSTOM_MATMUL = re.compile(
    r"^(?!(?:aten|prim|c10d|_c10d_functional|profiler|autograd|cuda|torch|inductor|"
    r"quantized)::)[A-Za-z_]\w{0,39}::\w*(?:mm|matmul|gemm|gemv)\w*$",
    re.IGNORECASE,
)


@functools.lru_cache(maxsize=4096)
def is_matmul(name: str) -> bool:
    """PyTorch's matrix products, and custom operators named like one."""
    return name in MATMUL_OPS or _CUSTOM_MATMUL.match(name) is not None


def is_costed(name: str) -> bool:
    """Whether an operator's work follows from its input shapes (the trace keeps them)."""
    return name in COSTED_OPS or is_matmul(name)


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
