"""The engine contract: what EngineHost, the sessions and the commands may use of an engine.

gpuchef's native ``LLMEngine`` (engine.py) and the hosted ``VllmEngine`` (vllm_engine.py)
implement it; ``factory.make_engine`` returns one. Nothing above engine_host/ probes an engine
for optional attributes: what differs between the two is a value here (``engine_name``,
``async_scheduling``), a method that may do nothing (``validate_scheduler_config``, ``close``,
``drain``), never an attribute that may be missing. nano-vllm's single ``LLMEngine`` surface
is the model (add_request / step / is_finished).
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import torch

from .vocab.config import EngineConfig, SchedulerConfig
from .vocab.records import RequestRecord
from .request import SamplingParams


class BackendInfo(Protocol):
    """What the surfaces read of an attention backend: its ``name`` ("flashinfer",
    "reference", or vLLM's backend as "vllm (flash_attn)")."""

    name: str


class KVInfo(Protocol):
    """The KV cache as the surfaces read it: ``block_size`` (tokens) and ``usage()`` (an object
    with ``used`` and ``total`` blocks)."""

    block_size: int

    def usage(self) -> Any: ...


@runtime_checkable
class Engine(Protocol):
    """An engine EngineHost can drive, single-threaded (the host's thread calls everything but
    the read-only attributes).

    Attributes: ``config`` (the EngineConfig it was built from), ``device``, ``dtype``,
    ``loaded`` (loader.LoadedModel: name, random_weights, source, num_params),
    ``model_config`` (``vocab_size``, ``eos_token_ids``), ``max_model_len`` (tokens),
    ``num_blocks`` (KV blocks), ``kv``, ``attn``, ``requests`` (id → state of the requests
    in it), ``step_id`` (the id the next step gets), ``engine_name`` ("" = gpuchef's native
    engine; "vLLM 0.24.0"), ``tensor_parallel_size``, ``async_scheduling`` (whether step N+1
    is launched while N runs).
    """

    config: EngineConfig
    device: torch.device
    dtype: torch.dtype
    loaded: Any
    model_config: Any
    max_model_len: int
    num_blocks: int
    kv: KVInfo
    attn: BackendInfo
    requests: dict[str, Any]
    step_id: int
    engine_name: str
    tensor_parallel_size: int

    @property
    def async_scheduling(self) -> bool: ...

    @property
    def scheduler_config(self) -> SchedulerConfig: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def has_step_in_flight(self) -> bool: ...

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int],
                    sampling: SamplingParams | None = None, arrival_ns: int | None = None) -> Any:
        """Queue a request; raises ConfigError (nothing changes) for one the engine refuses."""

    def step(self) -> Any:
        """One step: an ``engine.StepResult`` (record None when nothing ran)."""

    def drain(self) -> Any:
        """Complete a step in flight (async scheduling) and return it; StepResult(None) when
        none is."""

    def abort(self, request_id: str, reason: str = "abort") -> RequestRecord | None: ...

    def has_unfinished(self) -> bool: ...

    def set_scheduler_config(self, cfg: SchedulerConfig) -> None: ...

    def validate_scheduler_config(self, cfg: SchedulerConfig) -> None:
        """Raise ConfigError if ``cfg`` cannot be put in force live (the native engine takes
        any valid config; vLLM not a budget above its start-up one)."""

    def close(self) -> None:
        """Release what the engine holds beyond memory (vLLM: its engine core, TP workers).
        Idempotent."""
