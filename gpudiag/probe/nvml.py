"""The one chokepoint for NVML: every call to nvidia-ml-py goes through ``NvmlSession.call``.

It loads the bindings and initialises NVML lazily (never at import), decodes bytes, turns each
``NVMLError_*`` into a reading status with a plain reason, reads ``NVML_VALUE_NOT_AVAILABLE``
sentinels as N/A, and logs "function not found" (driver older than the bindings) once per
function. It also notices when the ``pynvml`` module on the path is not NVIDIA's official
``nvidia-ml-py`` (an old ``pynvml`` or ``nvidia-ml-py3`` shadowing it) and says how to fix it.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar

from gpudiag.probe.readings import Reading, Status, na, ok

log = logging.getLogger("gpudiag.probe.nvml")

FIX_BINDINGS = "pip uninstall -y pynvml nvidia-ml-py3 && pip install --force-reinstall nvidia-ml-py"

# NVML error name (the suffix of NVML_ERROR_*) -> (status, plain reason). Codes are looked up in
# the loaded module at run time, so a binding that renumbers or adds codes still maps by name.
_ERRORS: dict[str, tuple[Status, str]] = {
    "NOT_SUPPORTED": (Status.NOT_SUPPORTED, "not supported by this GPU or driver"),
    "NO_PERMISSION": (Status.NO_PERMISSION, "permission denied (needs root or an admin setting)"),
    "GPU_IS_LOST": (
        Status.GPU_LOST,
        "GPU is lost (fell off the bus): check `dmesg` for Xid 79, then reset the GPU or reboot",
    ),
    "RESET_REQUIRED": (Status.GPU_LOST, "GPU requires a reset (`nvidia-smi -r`) or a reboot"),
    "NOT_FOUND": (Status.NOT_FOUND, "not found"),
    "GPU_NOT_FOUND": (Status.NOT_FOUND, "GPU not found"),
    "FUNCTION_NOT_FOUND": (
        Status.DRIVER_TOO_OLD,
        "the NVIDIA driver is older than the NVML bindings: update the driver to read this",
    ),
    "LIBRARY_NOT_FOUND": (
        Status.NOT_FOUND,
        "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver is installed here",
    ),
    "DRIVER_NOT_LOADED": (
        Status.NOT_FOUND,
        "NVIDIA driver not loaded (nvidia-smi fails too): load the kernel module or reboot",
    ),
    "LIB_RM_VERSION_MISMATCH": (
        Status.UNKNOWN,
        "NVML library and kernel driver versions differ (driver upgraded without a reboot): "
        "reboot, or reload the nvidia kernel modules",
    ),
    "NO_DATA": (Status.NOT_AVAILABLE, "no data yet"),
    "INSUFFICIENT_POWER": (Status.UNKNOWN, "insufficient external power: check the power cables"),
    "TIMEOUT": (Status.UNKNOWN, "NVML timed out"),
    "UNINITIALIZED": (Status.UNKNOWN, "NVML is not initialised"),
    "IN_USE": (Status.UNKNOWN, "in use by another process"),
    "OPERATING_SYSTEM": (Status.NO_PERMISSION, "the operating system blocked the request"),
    "CORRUPTED_INFOROM": (Status.UNKNOWN, "corrupted infoROM: contact the vendor"),
}

# NVML_VALUE_NOT_AVAILABLE for c_uint and c_ulonglong results.
_SENTINELS = frozenset({0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF})
_MAX_REMEMBERED_FUNCTIONS = 256


def _decode(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace").rstrip("\x00")
    return value


def check_bindings(module: ModuleType) -> str | None:
    """Why ``module`` is not usable as NVIDIA's nvidia-ml-py, or None when it is fine."""
    path = str(getattr(module, "__file__", "") or "")
    if not hasattr(module, "NVMLError") or not hasattr(module, "nvmlInitWithFlags"):
        return (
            f"the `pynvml` module at {path or '?'} is not NVIDIA's nvidia-ml-py (it lacks "
            "nvmlInitWithFlags): an old `pynvml` or `nvidia-ml-py3` shadows it. "
            f"Fix: {FIX_BINDINGS}"
        )
    if path.replace("\\", "/").endswith("pynvml/__init__.py"):
        # nvidia-ml-py ships a single pynvml.py; a package directory is the old `pynvml` project.
        return (
            f"the `pynvml` package at {path} (the old `pynvml` project) shadows NVIDIA's "
            f"nvidia-ml-py. Fix: {FIX_BINDINGS}"
        )
    return None


def _shared_owners() -> list[str]:
    """Distributions that install a top-level ``pynvml``: more than one means files overwrite."""
    try:
        from importlib.metadata import packages_distributions

        return sorted(set(packages_distributions().get("pynvml", [])))
    except Exception:  # metadata of a broken install must not break the probe
        return []


class NvmlSession:
    """Lazily-initialised access to NVML through one function, ``call``.

    ``module`` injects a stand-in for ``pynvml`` (tests pass a fake built from recorded
    ``nvidia-smi -q -x`` output); by default the official bindings are imported on first use.
    """

    _shared: ClassVar[NvmlSession | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        module: ModuleType | None = None,
        importer: Callable[[str], ModuleType] = importlib.import_module,
    ) -> None:
        self._module = module
        self._importer = importer
        self._init: Reading[bool] | None = None
        self._lock = threading.RLock()
        self._missing_functions: OrderedDict[str, None] = OrderedDict()
        self.bindings_problem: str | None = None
        self._error_names: dict[Any, str] | None = None

    @classmethod
    def shared(cls) -> NvmlSession:
        """The process-wide session (NVML keeps a reference count; one init is enough)."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    @classmethod
    def reset_shared(cls) -> None:
        with cls._shared_lock:
            if cls._shared is not None:
                cls._shared.shutdown()
            cls._shared = None

    # -- loading and init ---------------------------------------------------------------
    @property
    def nvml(self) -> ModuleType:
        """The bindings module (for NVML_* constants); only valid once ``init()`` is OK."""
        if self._module is None:
            raise RuntimeError("NVML bindings are not loaded; call init() first")
        return self._module

    def _load(self) -> Reading[bool]:
        if self._module is None:
            try:
                self._module = self._importer("pynvml")
            except ImportError as exc:
                return na(
                    Status.NOT_FOUND,
                    f"nvidia-ml-py is not installed ({exc}): pip install nvidia-ml-py",
                    "nvml",
                )
            except Exception as exc:  # a corrupt install can raise anything at import
                return na(
                    Status.UNKNOWN,
                    f"the pynvml module failed to import ({type(exc).__name__}: {exc}). "
                    f"Fix: {FIX_BINDINGS}",
                    "nvml",
                )
        problem = check_bindings(self._module)
        if problem is None and getattr(self._module, "__name__", "") == "pynvml":
            owners = _shared_owners()
            if len(owners) > 1:
                problem = (
                    f"several packages install `pynvml` ({', '.join(owners)}) and overwrite each "
                    f"other's files. Fix: {FIX_BINDINGS}"
                )
        if problem is not None:
            self.bindings_problem = problem
            return na(Status.UNKNOWN, problem, "nvml")
        return ok(True, "nvml")

    def init(self) -> Reading[bool]:
        """Initialise NVML once; later calls return the first outcome."""
        with self._lock:
            if self._init is not None:
                return self._init
            loaded = self._load()
            if not loaded.ok:
                self._init = loaded
                return loaded
            nvml = self.nvml
            try:
                flag = getattr(nvml, "NVML_INIT_FLAG_NO_GPUS", 1)
                # NO_GPUS: initialise even when no GPU is attached, so driver facts still answer.
                nvml.nvmlInitWithFlags(flag)
                self._init = ok(True, "nvml")
            except nvml.NVMLError as exc:
                self._init = self._error_reading(exc, "nvmlInitWithFlags")
            except OSError as exc:  # loader errors that escape the bindings
                self._init = na(Status.NOT_FOUND, f"NVML library could not load: {exc}", "nvml")
            return self._init

    def shutdown(self) -> None:
        with self._lock:
            if self._init is not None and self._init.ok:
                try:
                    self.nvml.nvmlShutdown()
                except Exception as exc:  # shutting down must never raise
                    log.debug("nvmlShutdown failed: %s", exc)
            self._init = None

    # -- the chokepoint -----------------------------------------------------------------
    def call(self, function: str, *args: Any, **kwargs: Any) -> Reading[Any]:
        """Call ``pynvml.<function>(*args)`` and return a Reading; never raises."""
        started = self.init()
        if not started.ok:
            return na(started.status, started.reason, "nvml")
        fn = getattr(self.nvml, function, None)
        if fn is None:
            return self._function_missing(
                function, f"nvidia-ml-py lacks {function}: upgrade it (pip install -U nvidia-ml-py)"
            )
        try:
            value = fn(*args, **kwargs)
        except self.nvml.NVMLError as exc:
            return self._error_reading(exc, function)
        except Exception as exc:  # a ctypes or binding bug must not reach the user
            return na(Status.UNKNOWN, f"{function} failed: {type(exc).__name__}: {exc}", "nvml")
        value = _decode(value)
        if isinstance(value, int) and not isinstance(value, bool) and value in _SENTINELS:
            return na(Status.NOT_AVAILABLE, "the driver reports no value (N/A)", "nvml")
        return ok(value, "nvml")

    def device_count(self) -> Reading[int]:
        return self.call("nvmlDeviceGetCount")

    def handle(self, index: int) -> Reading[Any]:
        return self.call("nvmlDeviceGetHandleByIndex", index)

    def const(self, name: str, default: Any = None) -> Any:
        """An NVML_* constant from the loaded bindings (``default`` when they lack it)."""
        return getattr(self._module, name, default) if self._module is not None else default

    # -- error mapping ------------------------------------------------------------------
    def _error_name(self, exc: BaseException) -> str:
        if self._error_names is None:
            self._error_names = {
                getattr(self.nvml, attr): attr[len("NVML_ERROR_") :]
                for attr in dir(self.nvml)
                if attr.startswith("NVML_ERROR_")
            }
        return self._error_names.get(getattr(exc, "value", None), "UNKNOWN")

    def _error_reading(self, exc: BaseException, function: str) -> Reading[Any]:
        name = self._error_name(exc)
        if name == "FUNCTION_NOT_FOUND":
            return self._function_missing(function, _ERRORS[name][1])
        status, reason = _ERRORS.get(name, (Status.UNKNOWN, f"NVML error: {exc}"))
        return na(status, reason, "nvml")

    def _function_missing(self, function: str, reason: str) -> Reading[Any]:
        with self._lock:
            if function not in self._missing_functions:
                log.info("NVML: %s unavailable: %s", function, reason)
                self._missing_functions[function] = None
                while len(self._missing_functions) > _MAX_REMEMBERED_FUNCTIONS:
                    self._missing_functions.popitem(last=False)
        return na(Status.DRIVER_TOO_OLD, f"{function}: {reason}", "nvml")

    @property
    def missing_functions(self) -> tuple[str, ...]:
        """Functions found missing so far (each was logged once)."""
        return tuple(self._missing_functions)
