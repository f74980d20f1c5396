"""Isolated trials: snapshot the user's state, restore it in ``finally``, verify nothing leaked.

What is kept (the promise: a trial never harms the user's state): every parameter and buffer
(non-persistent ones and BatchNorm statistics included) restored in place with ``copy_`` so
the user's tensor objects stay the same, their gradients and ``requires_grad``, each module's
attributes, submodules and hooks, the optimizers' state and param groups, torch / CUDA /
Python / NumPy RNG states, and torch's global switches (TF32 and fp32-precision flags, float32
matmul precision, cuDNN flags, SDPA backend enables, default dtype, grad mode, autocast state,
deterministic algorithms, thread count), and the process's working directory, ``sys.argv``
and environment variables (gpudiag._process_state).
"""

from __future__ import annotations

import contextlib
import copy
import random
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gpudiag._process_state import ProcessState
from gpudiag.errors import GpuDiagError, GpuDiagWarning, TrialStateError
from gpudiag.probe import cuda

_UNREADABLE = object()


@dataclass(frozen=True)
class _Switch:
    name: str
    get: Callable[[], Any]
    set: Callable[[Any], None] | None  # None: verified, never set (cannot be set safely)


def _attr_switch(obj: Any, attr: str, name: str) -> _Switch:
    return _Switch(name, lambda: getattr(obj, attr), lambda v: setattr(obj, attr, v))


def _set_grad_mode(value: bool) -> None:
    import torch

    torch.set_grad_enabled(value)  # called, not entered: sets the mode for this thread


def _switches() -> list[_Switch]:
    import torch

    b = torch.backends
    out = [
        _Switch("default dtype", torch.get_default_dtype, torch.set_default_dtype),
        _Switch("grad mode", torch.is_grad_enabled, _set_grad_mode),
        _Switch("inference mode", torch.is_inference_mode_enabled, None),
        _Switch(
            "deterministic algorithms",
            lambda: (
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            ),
            lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1]),
        ),
        _Switch(
            "float32 matmul precision",
            torch.get_float32_matmul_precision,
            torch.set_float32_matmul_precision,
        ),
        _attr_switch(b.cuda.matmul, "allow_tf32", "cuda.matmul.allow_tf32"),
        _attr_switch(
            b.cuda.matmul,
            "allow_fp16_reduced_precision_reduction",
            "cuda.matmul.allow_fp16_reduced_precision_reduction",
        ),
        _attr_switch(
            b.cuda.matmul,
            "allow_bf16_reduced_precision_reduction",
            "cuda.matmul.allow_bf16_reduced_precision_reduction",
        ),
        _attr_switch(b.cudnn, "allow_tf32", "cudnn.allow_tf32"),
        _attr_switch(b.cudnn, "benchmark", "cudnn.benchmark"),
        _attr_switch(b.cudnn, "deterministic", "cudnn.deterministic"),
        _attr_switch(b.cudnn, "enabled", "cudnn.enabled"),
        _attr_switch(b.mkldnn, "enabled", "mkldnn.enabled"),
        _Switch("sdpa flash enabled", b.cuda.flash_sdp_enabled, b.cuda.enable_flash_sdp),
        _Switch(
            "sdpa mem-efficient enabled",
            b.cuda.mem_efficient_sdp_enabled,
            b.cuda.enable_mem_efficient_sdp,
        ),
        _Switch("sdpa math enabled", b.cuda.math_sdp_enabled, b.cuda.enable_math_sdp),
        _Switch("num threads", torch.get_num_threads, torch.set_num_threads),
        _Switch("num interop threads", torch.get_num_interop_threads, None),
        _Switch(
            "autocast cache", torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled
        ),
    ]
    if hasattr(b.cuda, "cudnn_sdp_enabled"):
        out.append(_Switch("sdpa cudnn enabled", b.cuda.cudnn_sdp_enabled, b.cuda.enable_cudnn_sdp))
    for device in ("cpu", "cuda"):
        out += _autocast_switches(device)
    # torch >= 2.9 keeps TF32 choices as fp32_precision fields; the legacy flags above are views
    # of them. They are set last so the new API has the final word.
    for path in (
        "fp32_precision",
        "cuda.matmul.fp32_precision",
        "cudnn.fp32_precision",
        "cudnn.conv.fp32_precision",
        "cudnn.rnn.fp32_precision",
        "mkldnn.fp32_precision",
        "mkldnn.matmul.fp32_precision",
        "mkldnn.conv.fp32_precision",
        "mkldnn.rnn.fp32_precision",
    ):
        *parents, attr = path.split(".")
        obj: Any = b
        for p in parents:
            obj = getattr(obj, p, None)
        if obj is not None and hasattr(obj, attr):
            out.append(_attr_switch(obj, attr, path))
    return out


def _autocast_switches(device: str) -> list[_Switch]:
    import torch

    def enabled(value: bool) -> None:
        torch.set_autocast_enabled(device, value)

    def dtype(value: Any) -> None:
        torch.set_autocast_dtype(device, value)

    return [
        _Switch(f"autocast {device} enabled", lambda: torch.is_autocast_enabled(device), enabled),
        _Switch(f"autocast {device} dtype", lambda: torch.get_autocast_dtype(device), dtype),
    ]


def _read(switch: _Switch) -> Any:
    try:
        return switch.get()
    except Exception:  # a mix of legacy and new TF32 APIs makes some getters raise
        return _UNREADABLE


def _same(a: Any, b: Any) -> bool:
    import numpy as np
    import torch

    if a is b:
        return True
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a.cpu(), b.cpu()))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.shape == b.shape and bool(np.array_equal(a, b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:
        return False


@dataclass
class GlobalState:
    """torch's process-wide switches, the RNG states, and the working directory, ``sys.argv``
    and environment at one moment."""

    switches: dict[str, Any]
    torch_rng: Any
    cuda_rng: Any
    python_rng: Any
    numpy_rng: Any
    process: ProcessState

    @property
    def environ(self) -> dict[str, str] | None:
        return self.process.environ

    @classmethod
    def capture(cls, *, env: bool = True) -> GlobalState:
        import numpy as np
        import torch

        return cls(
            switches={s.name: _read(s) for s in _switches()},
            torch_rng=torch.get_rng_state(),
            cuda_rng=cuda.get_rng_states(),
            python_rng=random.getstate(),
            numpy_rng=np.random.get_state(),
            process=ProcessState.capture(env=env),
        )

    def restore(self) -> None:
        import numpy as np
        import torch

        for switch in _switches():
            value = self.switches.get(switch.name, _UNREADABLE)
            if switch.set is None or value is _UNREADABLE:
                continue
            with contextlib.suppress(Exception):
                if not _same(_read(switch), value):
                    switch.set(value)
        torch.set_rng_state(self.torch_rng)
        cuda.set_rng_states(self.cuda_rng)
        random.setstate(self.python_rng)
        np.random.set_state(self.numpy_rng)
        self.process.restore()

    def differences(self, other: GlobalState) -> list[str]:
        out = [
            f"{name}: {self.switches[name]!r} -> {other.switches.get(name)!r}"
            for name in self.switches
            if self.switches[name] is not _UNREADABLE
            and not _same(self.switches[name], other.switches.get(name))
        ]
        for name in ("torch_rng", "cuda_rng", "python_rng", "numpy_rng"):
            if not _same(getattr(self, name), getattr(other, name)):
                out.append(f"{name.replace('_', ' ')} state changed")
        return out + self.process.differences(other.process)


# Module attributes holding tensors or hooks: their *contents* are restored, not just the dict.
_MODULE_DICTS = (
    "_parameters",
    "_buffers",
    "_modules",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


@dataclass
class _TensorRecord:
    tensor: Any
    data: Any  # an alias of the original storage: put back if a trial swapped ``.data``
    data_ptr: int
    dtype: Any
    shape: tuple[int, ...]
    values: Any
    requires_grad: bool
    grad: Any
    grad_data: Any
    grad_values: Any


def _clone(t: Any, offload: bool) -> Any:
    out = t.detach()
    if offload and out.device.type != "cpu":
        return out.to("cpu", copy=True)
    return out.clone()


@dataclass
class _ModuleRecord:
    module: Any
    attrs: dict[str, Any]
    dicts: dict[str, dict[Any, Any]]
    non_persistent: set[str] | None
    config: Any
    config_attrs: dict[str, Any] | None


@dataclass
class _OptimizerRecord:
    optimizer: Any
    attrs: dict[str, Any]
    groups: list[tuple[dict[str, Any], dict[str, Any]]]
    state: list[tuple[Any, dict[str, Any], dict[str, tuple[Any, Any]]]]


def _is_module(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.nn.Module)


def _is_optimizer(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.optim.Optimizer)


def tensor_bytes(*objects: Any) -> int:
    """Bytes of the distinct parameters, buffers, gradients and optimizer state of ``objects``."""
    seen: set[int] = set()
    total = 0
    for t in _tensors_of(objects):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def _tensors_of(objects: tuple[Any, ...]) -> Iterator[Any]:
    import torch

    for obj in objects:
        if _is_module(obj):
            for t in [*obj.parameters(), *obj.buffers()]:
                yield t
                if t.grad is not None:
                    yield t.grad
        elif _is_optimizer(obj):
            for state in obj.state.values():
                yield from (v for v in state.values() if isinstance(v, torch.Tensor))


@dataclass
class TrialSnapshot:
    """Everything a trial could change, captured so ``restore()`` can put it back exactly."""

    modules: list[_ModuleRecord] = field(default_factory=list)
    tensors: list[_TensorRecord] = field(default_factory=list)
    optimizers: list[_OptimizerRecord] = field(default_factory=list)
    globals: GlobalState | None = None
    offload: bool = True

    @classmethod
    def capture(cls, *objects: Any, env: bool = True, offload: bool = True) -> TrialSnapshot:
        """Snapshot modules and optimizers in ``objects`` (other objects are refused) and globals.

        ``offload`` keeps the copies of GPU tensors in host memory, where there is room.
        """
        snap = cls(offload=offload)
        seen_modules: set[int] = set()
        seen_tensors: set[int] = set()
        for obj in objects:
            if obj is None:
                continue
            if _is_module(obj):
                for module in obj.modules():
                    if id(module) in seen_modules:
                        continue
                    seen_modules.add(id(module))
                    snap.modules.append(_capture_module(module))
                    for t in [*module._parameters.values(), *module._buffers.values()]:
                        if t is not None and id(t) not in seen_tensors:
                            seen_tensors.add(id(t))
                            snap.tensors.append(_capture_tensor(t, offload))
            elif _is_optimizer(obj):
                snap.optimizers.append(_capture_optimizer(obj, offload))
            else:
                raise GpuDiagError(
                    f"a trial can protect torch modules and optimizers, not {type(obj).__name__}"
                )
        snap.globals = GlobalState.capture(env=env)
        return snap

    # -- restore --------------------------------------------------------------------------
    def restore(self) -> None:
        """Put everything back. Runs every part even if one fails, then re-raises the first."""
        errors: list[BaseException] = []
        for part in (
            self._restore_modules,
            self._restore_tensors,
            self._restore_optimizers,
            self._restore_globals,
        ):
            try:
                part()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise TrialStateError(
                f"could not restore the state after a trial: {errors[0]!r}"
            ) from errors[0]

    def _restore_modules(self) -> None:
        for rec in self.modules:
            state = vars(rec.module)
            for key in [k for k in state if k not in rec.attrs]:
                del state[key]
            for key, value in rec.attrs.items():
                if state.get(key, _UNREADABLE) is not value:
                    state[key] = value
            for name, content in rec.dicts.items():
                target = rec.attrs[name]
                if not _same_items(target, content):
                    target.clear()
                    target.update(content)
            if rec.non_persistent is not None:
                current = rec.attrs["_non_persistent_buffers_set"]
                current.clear()
                current.update(rec.non_persistent)
            if rec.config is not None and rec.config_attrs is not None:
                cfg = vars(rec.config)
                for key in [k for k in cfg if k not in rec.config_attrs]:
                    del cfg[key]
                cfg.update(rec.config_attrs)

    def _restore_tensors(self) -> None:
        import torch

        with torch.no_grad():
            for rec in self.tensors:
                t = rec.tensor
                if (
                    t.data_ptr() != rec.data_ptr
                    or t.dtype != rec.dtype
                    or tuple(t.shape) != rec.shape
                ):
                    t.data = rec.data
                t.copy_(rec.values)
                if t.is_leaf and t.requires_grad != rec.requires_grad:
                    t.requires_grad_(rec.requires_grad)
                if t.grad is not rec.grad:
                    t.grad = rec.grad
                if rec.grad is not None:
                    g = rec.grad
                    if g.data_ptr() != rec.grad_data.data_ptr() or g.dtype != rec.grad_data.dtype:
                        g.data = rec.grad_data
                    g.copy_(rec.grad_values)

    def _restore_optimizers(self) -> None:
        import torch

        for rec in self.optimizers:
            state = vars(rec.optimizer)
            for key in [k for k in state if k not in rec.attrs]:
                del state[key]
            state.update(rec.attrs)
            groups = rec.attrs["param_groups"]
            groups[:] = [g for g, _ in rec.groups]
            for group, content in rec.groups:
                group.clear()
                group.update(content)
                group["params"] = list(content["params"])
            opt_state = rec.attrs["state"]
            opt_state.clear()
            with torch.no_grad():
                for param, entry, values in rec.state:
                    entry.clear()
                    for key, (obj, saved) in values.items():
                        if isinstance(obj, torch.Tensor):
                            if obj.shape == saved.shape and obj.dtype == saved.dtype:
                                obj.copy_(saved)
                            else:
                                obj = saved.to(obj.device, copy=True)
                            entry[key] = obj
                        else:
                            entry[key] = copy.deepcopy(saved)
                    opt_state[param] = entry

    def _restore_globals(self) -> None:
        if self.globals is not None:
            self.globals.restore()

    # -- verification -----------------------------------------------------------------------
    def differences(self) -> list[str]:
        """What differs now from the snapshot; empty when the user's state is intact."""
        import torch

        out: list[str] = []
        for rec in self.modules:
            state = vars(rec.module)
            name = type(rec.module).__name__
            if set(state) != set(rec.attrs):
                out.append(f"{name}: attributes changed {sorted(set(state) ^ set(rec.attrs))}")
            for key, value in rec.attrs.items():
                if key in state and state[key] is not value:
                    out.append(f"{name}.{key} is a different object")
            for dname, content in rec.dicts.items():
                if not _same_items(rec.attrs[dname], content):
                    out.append(f"{name}.{dname} changed")
            config_attrs = rec.config_attrs
            if (
                rec.config is not None
                and config_attrs is not None
                and not _same(dict(vars(rec.config)), config_attrs)
            ):
                out.append(f"{name}.config changed")
        for i, trec in enumerate(self.tensors):
            t = trec.tensor
            where = f"tensor #{i} {tuple(t.shape)}"
            if t.data_ptr() != trec.data_ptr or t.dtype != trec.dtype:
                out.append(f"{where}: storage or dtype changed")
            elif not torch.equal(
                t.detach().cpu() if trec.values.device != t.device else t.detach(), trec.values
            ):
                out.append(f"{where}: values changed")
            if t.requires_grad != trec.requires_grad:
                out.append(f"{where}: requires_grad changed")
            if t.grad is not trec.grad:
                out.append(f"{where}: .grad is a different object")
            elif trec.grad is not None and not _same(trec.grad, trec.grad_values):
                out.append(f"{where}: gradient values changed")
        for orec in self.optimizers:
            name = type(orec.optimizer).__name__
            opt_state = orec.optimizer.state
            if len(opt_state) != len(orec.state):
                out.append(f"{name}: state has {len(opt_state)} entries, had {len(orec.state)}")
            for param, entry, values in orec.state:
                current = opt_state.get(param) if hasattr(opt_state, "get") else None
                if current is not entry or set(entry) != set(values):
                    out.append(f"{name}: state of a parameter was replaced")
                    continue
                for key, (_, saved) in values.items():
                    if not _same(entry[key], saved):
                        out.append(f"{name}: state {key!r} changed")
            for group, content in orec.groups:
                for key, value in content.items():
                    if key == "params":
                        if [id(p) for p in group["params"]] != [id(p) for p in value]:
                            out.append(f"{name}: param group parameters changed")
                    elif not _same(group.get(key), value):
                        out.append(f"{name}: param group {key!r} changed")
        if self.globals is not None:
            out += self.globals.differences(
                GlobalState.capture(env=self.globals.environ is not None)
            )
        return out

    def named_values(self, module: Any) -> dict[str, Any]:
        """name -> snapshot copy of each parameter and buffer of ``module`` (resets copies)."""
        by_id = {id(r.tensor): r.values for r in self.tensors}
        out = {}
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            if id(t) in by_id:
                out[name] = by_id[id(t)]
        return out


def _same_items(a: dict[Any, Any], b: dict[Any, Any]) -> bool:
    """Same keys in the same order, holding the very same objects (no tensor ``==``)."""
    return list(a) == list(b) and all(a[k] is b[k] for k in b)


def _capture_module(module: Any) -> _ModuleRecord:
    state = vars(module)
    attrs = dict(state)
    dicts = {name: dict(state[name]) for name in _MODULE_DICTS if isinstance(state.get(name), dict)}
    non_persistent = (
        set(state["_non_persistent_buffers_set"])
        if "_non_persistent_buffers_set" in state
        else None
    )
    config = state.get("config")
    config_attrs = (
        dict(vars(config)) if config is not None and hasattr(config, "__dict__") else None
    )
    return _ModuleRecord(module, attrs, dicts, non_persistent, config, config_attrs)


def _capture_tensor(t: Any, offload: bool) -> _TensorRecord:
    grad = t.grad
    return _TensorRecord(
        tensor=t,
        data=t.data,
        data_ptr=t.data_ptr(),
        dtype=t.dtype,
        shape=tuple(t.shape),
        values=_clone(t, offload),
        requires_grad=t.requires_grad,
        grad=grad,
        grad_data=None if grad is None else grad.data,
        grad_values=None if grad is None else _clone(grad, offload),
    )


def _capture_optimizer(opt: Any, offload: bool) -> _OptimizerRecord:
    import torch

    groups = [(g, {**g, "params": list(g["params"])}) for g in opt.param_groups]
    state = []
    for param, entry in opt.state.items():
        values = {
            k: (v, _clone(v, offload) if isinstance(v, torch.Tensor) else copy.deepcopy(v))
            for k, v in entry.items()
        }
        state.append((param, entry, values))
    return _OptimizerRecord(opt, dict(vars(opt)), groups, state)


@contextlib.contextmanager
def isolated(
    *objects: Any, verify: bool = True, env: bool = True, offload: bool = True
) -> Iterator[TrialSnapshot]:
    """Run a block as a trial: whatever it does to ``objects`` and to torch's globals is undone.

    Restores in ``finally`` (normal exit, exception, KeyboardInterrupt, out-of-memory), then,
    with ``verify``, checks that the state equals the snapshot and raises TrialStateError if
    not (only a warning when another exception is already on its way out).
    """
    snapshot = TrialSnapshot.capture(*objects, env=env, offload=offload)
    try:
        yield snapshot
    except BaseException:
        _finish(snapshot, verify=verify, in_flight=True)
        raise
    _finish(snapshot, verify=verify, in_flight=False)


def _finish(snapshot: TrialSnapshot, *, verify: bool, in_flight: bool) -> None:
    try:
        snapshot.restore()
        problems = snapshot.differences() if verify else []
        if problems:
            raise TrialStateError(
                "the user's state differs after the trial: " + "; ".join(problems[:5])
            )
    except TrialStateError as exc:
        if not in_flight:
            raise
        warnings.warn(str(exc), GpuDiagWarning, stacklevel=4)
