"""The NVML binding: pynvml (or a stand-in) loaded and initialised lazily, once per module.

* :class:`NvmlLibrary` — lazy ``nvmlInit`` under a lock, ``nvmlShutdown`` at exit (atexit), and
  one query helper, :meth:`NvmlLibrary.query`, that turns "not supported here" into the
  :data:`NA` sentinel for that field only (NotSupported, FunctionNotFound on an older driver,
  NoPermission); every other NVML error is raised for the caller to judge.
* :func:`nvml_library` — the shared NvmlLibrary of a module (default ``import pynvml``, lazily:
  importing this file needs no NVIDIA library).
* :func:`parse_gpus` — ``--gpus`` to NVML indices (as ``nvidia-smi`` numbers them, not CUDA's
  after CUDA_VISIBLE_DEVICES), checked against the device count NVML reports.

Nothing here samples or keeps state beyond the initialised modules (nvitop's ``api/libnvml.py``
plays this part there).
"""

from __future__ import annotations

import atexit
import re
import threading
from collections.abc import Callable
from typing import Any

from gpuchef.engine_host.vocab.errors import ConfigError

MAX_GPU_INDEX = 1023           # --gpus without NVML to ask: no host has more GPUs than this


class _NotAvailable:
    """The "not available" sentinel: falsy, prints as N/A, one instance (:data:`NA`)."""

    _inst: "_NotAvailable | None" = None

    def __new__(cls):
        if cls._inst is None:
            cls._inst = super().__new__(cls)
        return cls._inst

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "N/A"


NA = _NotAvailable()


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used in this process. ``str(e)`` is a reason fit for one status line."""


class _Never(Exception):
    """Stands in for an NVML error class a stand-in module lacks (never raised)."""


def _err(nvml: Any, *names: str) -> tuple[type[BaseException], ...]:
    return tuple(getattr(nvml, n, _Never) for n in names)


def describe_nvml_error(e: BaseException) -> str:
    """A short human reason for an NVML error (used in status lines)."""
    name = type(e).__name__
    if name == "NVMLError_LibraryNotFound":
        return "libnvidia-ml.so.1 not found (no NVIDIA driver on this machine)"
    if name == "NVMLError_DriverNotLoaded":
        return "the NVIDIA driver is not loaded"
    if name == "NVMLError_NoPermission":
        return "no permission to use NVML"
    if name == "NVMLError_LibRmVersionMismatch":
        return "NVML/driver version mismatch (reboot or reload the driver)"
    msg = str(e) or name
    return msg


class NvmlLibrary:
    """One NVML module (pynvml, or a stand-in for tests), initialised lazily and once.

    ``init()`` is safe to call from any thread, any number of times (a lock guards the first
    ``nvmlInit``); it registers ``shutdown`` with atexit. Raises NvmlUnavailable with a reason.
    """

    def __init__(self, module: Any) -> None:
        self.module = module
        self._lock = threading.Lock()
        self._initialised = False
        nv = module
        self.na_errors = _err(nv, "NVMLError_NotSupported", "NVMLError_FunctionNotFound",
                               "NVMLError_NoPermission")
        self.lost_errors = _err(nv, "NVMLError_GpuIsLost", "NVMLError_Unknown",
                                "NVMLError_ResetRequired")
        # GPM calls: only GpuIsLost means lost; an Unknown there may be a too-early sample
        self.gpm_lost_errors = _err(nv, "NVMLError_GpuIsLost")
        self.busy_errors = _err(nv, "NVMLError_InUse", "NVMLError_InsufficientResources")
        self.base_error: type[BaseException] = getattr(nv, "NVMLError", _Never)

    @property
    def initialised(self) -> bool:
        return self._initialised

    def init(self) -> None:
        if self._initialised:
            return
        with self._lock:
            if self._initialised:
                return
            try:
                self.module.nvmlInit()
            except self.base_error as e:
                raise NvmlUnavailable(describe_nvml_error(e)) from e
            except OSError as e:  # a broken install can fail below pynvml's error mapping
                raise NvmlUnavailable(f"{type(e).__name__}: {e}") from e
            self._initialised = True
            atexit.register(self.shutdown)

    def shutdown(self) -> None:
        """``nvmlShutdown`` if initialised (errors ignored: this runs at exit)."""
        with self._lock:
            if not self._initialised:
                return
            self._initialised = False
            try:
                self.module.nvmlShutdown()
            except Exception:
                pass

    def query(self, fn: Callable[..., Any] | str, *args: Any) -> Any:
        """Call an NVML function; NotSupported / FunctionNotFound / NoPermission → :data:`NA`.

        ``fn`` is a function or the name of one in the module (a missing name is NA too, for an
        older pynvml). Other NVML errors propagate (GPU lost, in use, …).
        """
        if isinstance(fn, str):
            fn = getattr(self.module, fn, None)
            if fn is None:
                return NA
        try:
            return fn(*args)
        except self.na_errors:
            return NA

    def device_count(self) -> int:
        self.init()
        try:
            return int(self.module.nvmlDeviceGetCount())
        except self.base_error as e:
            raise NvmlUnavailable(describe_nvml_error(e)) from e


_LIBRARIES: dict[int, NvmlLibrary] = {}
_LIBRARIES_LOCK = threading.Lock()


def nvml_library(nvml: Any = None) -> NvmlLibrary:
    """The shared :class:`NvmlLibrary` for ``nvml`` (default: ``import pynvml``, lazily).

    Raises NvmlUnavailable when nvidia-ml-py is not installed.
    """
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError as e:
            raise NvmlUnavailable(f"nvidia-ml-py (module pynvml) is not installed: {e}") from e
    with _LIBRARIES_LOCK:
        lib = _LIBRARIES.get(id(nvml))
        if lib is None or lib.module is not nvml:
            lib = _LIBRARIES[id(nvml)] = NvmlLibrary(nvml)
        return lib


def parse_gpus(spec: str | list[int] | None, *, device_count: int | None = None,
               nvml: Any = None) -> list[int] | None:
    """Parse ``--gpus``: ``"0,1"``, ``"0-3"``, ``"all"``/``""``/None (→ None = all GPUs).

    Returns sorted NVML indices. Indices are checked against ``device_count`` (default: asked of
    NVML). When NVML is not available the syntax is still checked but not the indices (the
    sampler will report NVML missing). Raises ConfigError naming the bad value and the range.
    """
    if spec is None:
        return None
    if isinstance(spec, (list, tuple)):
        items = [str(x) for x in spec]
    else:
        s = str(spec).strip().lower()
        if s in ("", "all"):
            return None
        items = [p for p in re.split(r"[,\s]+", s) if p]
    ranges: list[tuple[int, int]] = []
    for it in items:
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", it.strip())
        if not m:
            raise ConfigError(f"--gpus {spec!r}: {it!r} is not a GPU index "
                              "(use e.g. 0,1 or 0-3 or all)")
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) is not None else a
        if b < a:
            raise ConfigError(f"--gpus {spec!r}: range {it!r} runs backwards")
        ranges.append((a, b))
    if not ranges:
        raise ConfigError(f"--gpus {spec!r} names no GPU (use e.g. 0,1 or all)")
    n = device_count
    if n is None:
        try:
            n = nvml_library(nvml).device_count()
        except NvmlUnavailable:
            n = None
    # checked before a range is expanded: 0-99999999999 would otherwise fill the memory
    limit = n if n is not None else MAX_GPU_INDEX + 1
    over = [max(a, limit) for a, b in ranges if b >= limit]  # the lowest index too high
    if over:
        bad = min(over)
        if n is None:
            raise ConfigError(f"--gpus {spec!r}: GPU {bad} is out of range: allowed indices "
                              f"[0, {MAX_GPU_INDEX}]")
        allowed = f"[0, {n - 1}]" if n > 0 else "none (no GPU found)"
        raise ConfigError(f"--gpus {spec!r}: GPU {bad} does not exist; "
                          f"{n} GPU(s) found, allowed indices {allowed}")
    return sorted({i for a, b in ranges for i in range(a, b + 1)})
