"""Whether vLLM can run here, checked before it is imported, and its import.

vLLM is the ``[vllm]`` extra. Each reason it cannot run — not installed, a torch other than the
one its metadata pins (a mismatched torch fails inside vLLM's compiled extensions, far from the
cause), no CUDA GPU, an import that fails — is one ConfigError line naming the fix, and leaves
the process usable for ``--engine native``. Version clauses are PEP 440, read with ``packaging``.
"""

from __future__ import annotations

import importlib
import importlib.metadata as _md
import importlib.util
import os
from collections.abc import Iterable
from typing import Any

import torch
from packaging.markers import UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .vocab.errors import ConfigError

VLLM_TESTED = "0.24.0"
INSTALL_HINT = "pip install 'gpuchef[vllm]'"

# Seams for the environment checks (tests replace them).
_dist_version = _md.version
_dist_requires = _md.requires
_find_spec = importlib.util.find_spec


def _torch_version() -> str:
    return torch.__version__


def _cuda_available() -> bool:
    return torch.cuda.is_available()


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


def torch_requirement(requires: Iterable[str] | None) -> str | None:
    """The version specifier a distribution's ``Requires-Dist`` lines put on ``torch`` (e.g.
    "==2.11.0" from vLLM 0.24.0's metadata; clauses in ``packaging``'s order, "<3,>=2.4"), or
    None when there is none. A line whose marker does not hold here without extras (``extra ==
    "zen"``, another platform) is skipped, as pip skips it; a line that is not PEP 508 is too."""
    for line in requires or ():
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower() != "torch":
            continue
        try:
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
        except (UndefinedComparison, UndefinedEnvironmentName):
            continue
        return str(req.specifier) or None
    return None


def version_satisfies(version: str, spec: str) -> bool:
    """Whether ``version`` (e.g. torch's "2.11.0+cu130") meets ``spec`` (e.g. "==2.11.0",
    ">=2.4,<3"), by PEP 440: a local label ("+cu130") is ignored for a specifier without one,
    pre-releases count. A version or specifier that is not PEP 440 cannot be judged and is not
    held against the install (True)."""
    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return True


def check_vllm_environment() -> str:
    """Check that vLLM can run here, before importing it. Returns vLLM's version.

    Raises ConfigError, one line each, for: vLLM not installed (names ``pip install
    'gpuchef[vllm]'``); the installed torch not meeting the torch requirement in vLLM's own
    metadata (vLLM 0.24.0 pins ``torch==2.11.0``; a mismatched torch fails inside vLLM's compiled
    extensions, so it is caught here first); no CUDA GPU visible to torch.
    """
    try:
        ver = _dist_version("vllm")
    except _md.PackageNotFoundError:
        if _find_spec("vllm") is None:
            raise ConfigError(f"vLLM is not installed: {INSTALL_HINT} (vLLM {VLLM_TESTED} "
                              "needs torch 2.11 and a CUDA GPU), or use --engine native") from None
        ver = "(unknown version)"
        spec = None
    else:
        spec = torch_requirement(_dist_requires("vllm"))
    tv = _torch_version()
    if spec and not version_satisfies(tv, spec):
        raise ConfigError(f"vLLM {ver} needs torch{spec} but this torch is {tv}: install "
                          f"vLLM with its own torch (pip install 'torch{spec}' {INSTALL_HINT}) "
                          "in its own environment, or use --engine native")
    if not _cuda_available():
        raise ConfigError(f"--engine vllm needs a CUDA GPU and this torch ({tv}) sees none: run "
                          "it on a GPU machine, or use --engine native")
    return ver


def import_vllm(version: str = "") -> Any:
    """Import vLLM. Raises ConfigError (one line, with the import error) when it does not."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines would cross the UI
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    try:
        return importlib.import_module("vllm")
    except Exception as e:  # ImportError, or whatever its compiled extensions raise
        name = f"vLLM {version}" if version else "vLLM"
        raise ConfigError(f"{name} is installed but does not import ({type(e).__name__}: "
                          f"{first_line(e)}): reinstall it with {INSTALL_HINT}, or use "
                          "--engine native") from None


def use_spawn_for_workers(environ: dict[str, str] | None = None) -> bool:
    """Make vLLM start its tensor-parallel workers with ``spawn`` unless the user chose a method.

    gpuchef has used CUDA in this process before vLLM starts (device checks, NVML, the native
    engine in the same session), and a ``fork``ed worker cannot use CUDA: vLLM 0.24's workers
    then die with "To use CUDA with multiprocessing, you must use the 'spawn' start method".
    vLLM reads ``VLLM_WORKER_MULTIPROC_METHOD`` (vllm/envs.py) when it builds its
    ``MultiprocExecutor``. Returns True when it set it.
    """
    env = os.environ if environ is None else environ
    if env.get("VLLM_WORKER_MULTIPROC_METHOD"):
        return False
    env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    return True
