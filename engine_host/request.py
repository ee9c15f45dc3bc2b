"""A request's sampling parameters and its state inside the engine."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from .vocab.errors import ConfigError


SAMPLING_EPS = 1e-5  # vllm/sampling_params.py _SAMPLING_EPS
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 64) - 1


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each output token, and when to stop.

    ``temperature`` below 1e-5 = greedy (vLLM's rule). ``top_k`` 0 = off, ``top_p`` 1.0 = off
    (vLLM's conventions). ``seed`` (an integer in [-2^63, 2^64)) keys the request's sampling noise; with or
    without one, a request's samples do not depend on what it is batched with (its noise is a
    hash of its seed and output position: ``sampling.row_key``). ``ignore_eos`` with ``max_tokens`` forces the output length,
    as trace replay needs (``vllm bench``'s ``ignore_eos``). ``stop_token_ids`` end the request
    when sampled (finish reason "stop"), ``ignore_eos`` or not, as in vLLM. ``min_tokens``
    (vLLM's SamplingParams field, 0 = off, at most ``max_tokens``): until the request has that
    many output tokens, its EOS ids and ``stop_token_ids`` are masked out of the logits (vLLM's
    ``MinTokensLogitsProcessor``; ``ignore_eos`` or not: vLLM masks its ``all_stop_token_ids``)
    and stop strings do not end it (the front door's stop check).
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ConfigError(f"max_tokens={self.max_tokens!r} must be an integer >= 1")
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            raise ConfigError(f"temperature={self.temperature!r} must be a finite number >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p={self.top_p!r} is out of range: allowed (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k={self.top_k!r} must be an integer >= 0 (0 = off)")
        s = self.seed
        if s is not None and (isinstance(s, bool) or not isinstance(s, int)
                              or not SEED_MIN <= s <= SEED_MAX):
            raise ConfigError(f"seed={s!r} must be an integer in [{SEED_MIN}, {SEED_MAX}] "
                              "(vLLM's range: what torch.Generator.manual_seed takes)")
        ids = self.stop_token_ids
        if not isinstance(ids, tuple) or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            raise ConfigError(f"stop_token_ids={ids!r} must be a tuple of integer token ids")
        m = self.min_tokens
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ConfigError(f"min_tokens={m!r} must be an integer >= 0 (0 = off)")
        if m > self.max_tokens:  # vLLM's SamplingParams._verify_args
            raise ConfigError(f"min_tokens={m} must be less than or equal to "
                              f"max_tokens={self.max_tokens}: allowed 0 to {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        # vLLM's _SAMPLING_EPS: below it logits / temperature overflow to inf; it means greedy
        return self.temperature < SAMPLING_EPS


def check_prompt(request_id: str, prompt: list[int], vocab_size: int, max_model_len: int) -> None:
    """The checks every engine makes before queueing a prompt (token ids, int).

    Raises ConfigError for an empty prompt, a token id outside ``[0, vocab_size)`` or a prompt
    that leaves no room for one output token in ``max_model_len``.
    """
    if not prompt:
        raise ConfigError(f"request {request_id!r}: the prompt is empty (need ≥ 1 token)")
    lo, hi = min(prompt), max(prompt)
    if lo < 0 or hi >= vocab_size:
        raise ConfigError(f"request {request_id!r}: token id {lo if lo < 0 else hi} is "
                          f"outside the vocabulary [0, {vocab_size})")
    if len(prompt) >= max_model_len:
        raise ConfigError(f"request {request_id!r}: prompt of {len(prompt)} tokens is longer "
                          f"than the context allows: max_model_len {max_model_len} needs "
                          f"prompt ≤ {max_model_len - 1}")


#: Stands in ``output_token_ids`` for a token that a launched, not yet completed step samples
#: (async scheduling). Never reaches the model: the runner reads it on the device instead.
PLACEHOLDER_TOKEN = -1


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """One request's state. Token bookkeeping follows vLLM V1's single rule: each step a request
    is given ``n`` of its not-yet-computed tokens ``all_token_ids[num_computed_tokens:]``; when
    ``num_computed_tokens`` reaches ``num_tokens`` the step samples its next token.

    ``prefill_target``: tokens to compute before the first sample since the request was last
    admitted (the prompt; prompt + outputs so far after a preemption, which recomputes them).
    While ``num_computed_tokens < prefill_target`` the request is in prefill, after that a decode.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    arrival_ns: int
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    prefill_target: int = 0
    block_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    token_times_ns: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    finish_reason: str = ""
    last_step: int = -1  # id of the latest step with this request in it (Scheduler.advance)
    first_scheduled_ns: int = 0  # start of the first step that computed any of it (queue time)
    #: the ids ``sampling.min_tokens`` masks: the model's EOS ids and ``stop_token_ids`` (vLLM's
    #: ``all_stop_token_ids``), set by the engine when it queues the request
    min_tokens_stop_ids: tuple[int, ...] = ()

    def needs_min_tokens_mask(self) -> bool:
        """Whether the token sampled next must not be a stop id: fewer than ``min_tokens``
        outputs before it. ``output_token_ids`` holds a placeholder for each token a launched
        step samples (async scheduling), so the count is right while that step is in flight."""
        return (bool(self.min_tokens_stop_ids)
                and len(self.output_token_ids) < self.sampling.min_tokens)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_prefill(self) -> bool:
        return self.num_computed_tokens < self.prefill_target

    @property
    def remaining_prefill(self) -> int:
        return max(0, self.prefill_target - self.num_computed_tokens)

    def token_slice(self, start: int, n: int) -> list[int]:
        """Token ids ``[start, start + n)`` of prompt + outputs."""
        p = self.prompt_len
        if start + n <= p:
            return self.prompt_token_ids[start:start + n]
        if start >= p:  # decodes: no copy of the prompt on the hot path
            return self.output_token_ids[start - p:start - p + n]
        return self.prompt_token_ids[start:] + self.output_token_ids[:start + n - p]
