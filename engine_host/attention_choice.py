"""Which attention backend a run gets (``make_backend``) and the early check of that choice
(``check_backend``): above both backends (``attention.ReferenceAttention`` and
``flashinfer_backend.FlashInferAttention``), so that neither imports the other's chooser."""

from __future__ import annotations

import torch

from .attention import AttentionBackend, ReferenceAttention
from .vocab.errors import ConfigError


def check_backend(name: str, device: torch.device | str) -> None:
    """Refuse, before any weights load, a backend that ``make_backend`` would refuse for the
    device alone (unknown name; flashinfer without CUDA). Raises ConfigError."""
    if name not in ("auto", "reference", "flashinfer"):
        raise ConfigError(f"--attention-backend {name!r} is not one of auto, reference, flashinfer")
    if name == "flashinfer" and torch.device(device).type != "cuda":
        raise ConfigError("--attention-backend flashinfer needs a CUDA device; "
                          f"this run is on {torch.device(device).type} (use reference)")
    if name == "flashinfer":
        import importlib.util

        if importlib.util.find_spec("flashinfer") is None:  # not installed (a broken install
            # is caught by make_backend's import)
            raise ConfigError("--attention-backend flashinfer: flashinfer is not installed; "
                              "install the [gpu] extra or use reference")


def make_backend(name: str, device: torch.device | str,
                 decode_attention: str = "auto") -> AttentionBackend:
    """Return the attention backend ``name`` ("auto", "reference", "flashinfer").

    "auto" picks "flashinfer" on CUDA when it imports, else "reference". ``decode_attention``
    (``DECODE_ATTENTION``): FlashInfer's kernel for decode rows (the reference has one path).
    Raises ConfigError (a ValueError) for an unknown name or when "flashinfer" is asked for
    where it cannot run (no CUDA device, flashinfer does not import).
    """
    dev = torch.device(device)
    if name == "auto":
        if dev.type == "cuda":
            try:
                from .flashinfer_backend import FlashInferAttention  # noqa: F401
                name = "flashinfer"
            except Exception:  # flashinfer missing or broken: the reference still works
                name = "reference"
        else:
            name = "reference"
    check_backend(name, dev)
    if name == "reference":
        return ReferenceAttention()
    if name == "flashinfer":
        try:
            from .flashinfer_backend import FlashInferAttention
        except ImportError as e:
            raise ConfigError(f"--attention-backend flashinfer: flashinfer does not import ({e}); "
                               "install the [gpu] extra or use reference") from e
        return FlashInferAttention(dev, decode_attention=decode_attention)
    raise AssertionError(name)  # check_backend refused every other name
