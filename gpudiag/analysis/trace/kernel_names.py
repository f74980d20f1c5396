"""Readable kernel names: the function a kernel is, without its argument list and C++ noise.

``void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, ...>(float*, ...)``
reads ``cunn_SoftMaxForward<4, float, ...>``; a mangled ``_ZN7ck_tile6kentryI...`` reads
``ck_tile::kentry<FmhaBatchPrefillWithPagedKVCacheKernel>``. Never empty, never a bare
namespace: when nothing readable is left, the name itself is returned.
"""

from __future__ import annotations

import re

ELLIPSIS = "\u2026"

_ANONYMOUS = re.compile(r"\(anonymous namespace\)::|\{anonymous\}::|_GLOBAL__N_\d+::")
# Lambdas inside template arguments: "{lambda(float, float)#1}" and the operator() chains
# that lead to them ("...::{lambda()#2}::operator()() const::{lambda(float)#1}").
_OPERATOR_CALL = re.compile(r"::operator\(\)\(\)(?: const)?")
_LAMBDA = re.compile(r"\{lambda\([^{}]*\)#\d+\}")
_LAMBDA_CHAIN = re.compile(r"lambda(?:::lambda)+")
# Parameter lists of functions named inside template arguments ("impl<float>(Iter&, float)").
_INNER_PARAMS = re.compile(r"(?<=[\w>])\([^()]*\)")
# Namespaces every PyTorch kernel repeats, which say nothing about the kernel.
_NOISE = re.compile(r"\b(?:at::native|at::cuda|at::detail|at|c10|std)::")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
# Template wrappers whose first template argument is the real kernel.
_WRAPPERS = frozenset({"kentry", "Kernel", "Kernel2", "device_kernel", "kernel"})


def _close(text: str, open_at: int) -> int:
    """Index just past the bracket group starting at ``open_at`` (len(text) if unclosed)."""
    pairs = {"<": ">", "(": ")", "{": "}", "[": "]"}
    stack: list[str] = []
    for i in range(open_at, len(text)):
        ch = text[i]
        if ch in pairs:
            stack.append(pairs[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
            if not stack:
                return i + 1
    return len(text)


def _cut_arguments(text: str) -> str:
    """``text`` up to its top-level argument list (brackets of templates/lambdas skipped)."""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "<{[":
            i = _close(text, i)
            continue
        if ch == "(" and i > 0:
            return text[:i]
        i += 1
    return text


def _drop_return_type(text: str) -> str:
    """The part after the last top-level space (``void foo<a, b>`` -> ``foo<a, b>``)."""
    last = -1
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "<({[":
            i = _close(text, i)
            continue
        if ch == " ":
            last = i
        i += 1
    return text[last + 1 :] if last >= 0 else text


def _source_names(sym: str, i: int) -> tuple[list[str], int]:
    """Length-prefixed identifiers of an Itanium nested name from ``sym[i]`` (after N)."""
    parts: list[str] = []
    while i < len(sym):
        if sym[i] == "S":  # a substitution (S_, S0_, St, ...): refers back, adds nothing
            end = sym.find("_", i)
            if sym.startswith("St", i):
                i += 2
                continue
            if end < 0:
                break
            i = end + 1
            continue
        m = re.match(r"\d+", sym[i:])
        if m is None:
            break
        n = int(m.group())
        start = i + len(m.group())
        part = sym[start : start + n]
        if len(part) < n:
            break
        if not part.startswith("_GLOBAL__N"):
            parts.append(part)
        i = start + n
    return parts, i


def demangle_name(sym: str) -> str:
    """The qualified function name of an Itanium-mangled symbol (``_ZN5aiter3fooI...``
    -> ``aiter::foo``); for a template wrapper (``ck_tile::kentry``), the wrapped kernel's
    name is added in angle brackets. Returns ``sym`` unchanged when it cannot be read."""
    if not sym.startswith("_Z"):
        return sym
    i = 2
    if sym.startswith("N", i):
        parts, i = _source_names(sym, i + 1)
    else:
        parts, i = _source_names(sym, i)
        parts = parts[:1]
        if parts:
            i = 2 + len(str(len(parts[0]))) + len(parts[0])
    if not parts:
        return sym
    name = "::".join(parts)
    if parts[-1] in _WRAPPERS and sym.startswith("I", i):
        j = i + 1
        while j < len(sym) and sym[j] == "L":  # literal arguments: L<type><value>E
            end = sym.find("E", j)
            if end < 0:
                break
            j = end + 1
        inner: list[str] = []
        if sym.startswith("N", j):
            inner, _ = _source_names(sym, j + 1)
        elif j < len(sym) and sym[j].isdigit():
            inner, _ = _source_names(sym, j)
        if inner:
            name += f"<{inner[-1] if sym.startswith('N', j) else inner[0]}>"
    return name


def readable_kernel_name(name: str, width: int = 80) -> str:
    """A kernel name a person can read: no return type, argument list, anonymous or
    PyTorch-internal namespaces, lambda signatures; cut to ``width`` characters."""
    text = name.strip()
    if text.startswith("_Z"):
        text = demangle_name(text)
    text = _ANONYMOUS.sub("", text)
    text = _OPERATOR_CALL.sub("", text)
    text = _LAMBDA.sub("lambda", text)
    text = _cut_arguments(text)
    text = _drop_return_type(text.strip())
    previous = None
    while previous != text:
        previous = text
        text = _INNER_PARAMS.sub("", text)
    text = _NOISE.sub("", text)
    text = _LAMBDA_CHAIN.sub("lambda", text)
    text = text.replace("> >", ">>").strip().strip(":").strip()
    if not text or not _IDENTIFIER.search(text):
        text = name.strip() or "?"  # nothing better to show than the name itself
    return text if len(text) <= width else text[: width - 1] + ELLIPSIS
