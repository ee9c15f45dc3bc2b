"""The load generator's request stream: when each request arrives, how long it is, its token ids.

Pure data: no threads, no engine. ``generate(cfg)`` turns a ``WorkloadConfig`` into a list of
``RequestSpec`` sorted by arrival time; whoever drives the engine sleeps until each ``arrival_s``
and submits it.

Two sources of load:

* ``dataset="random"``: arrivals from a gamma process (``request_rate``, ``burstiness``; 1.0 is
  Poisson) or evenly spaced (``arrival="constant"``), lengths uniform in
  ``[len*(1-r), len*(1+r)]`` — the definitions of ``vllm bench serve`` (vllm/benchmarks/serve.py
  ``get_request``, vllm/benchmarks/datasets.py ``RandomDataset``).
* a trace (``dataset="azure-conv"`` or a CSV path with ``TIMESTAMP,ContextTokens,GeneratedTokens``):
  arrivals replayed from the timestamps, time-scaled by ``trace_speed``; lengths from the file.
* a phased workload (``dataset="conv_long_burst"``, a bundled one, or a path to a ``.yaml``
  file): phases back to back, each with its own arrivals, rate and lengths, bursts and
  mixtures (``phases.py`` parses the file and draws them); time-scaled by ``trace_speed`` as a
  trace is.

Everything is seeded: the same config gives the same stream, token ids included, so both arms of
an A/B experiment see identical requests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .errors import ConfigError
from .traces import BUNDLED_DATASETS, MAX_REQUESTS, _int, _num, dataset_path, load_trace_csv

#: Every dataset name ``WorkloadConfig.dataset`` accepts besides a path to a CSV file.
DATASET_NAMES: tuple[str, ...] = ("random", *BUNDLED_DATASETS)
ARRIVALS: tuple[str, ...] = ("poisson", "constant")

#: Request ids: ``req-<i>`` for the load, ``PROBE_ID_PREFIX + <k>`` for probes (metrics use it
#: to keep probes out of the load's latency figures).
REQUEST_ID_PREFIX = "req-"
PROBE_ID_PREFIX = "probe-"

#: Smallest token id drawn: ids below it are often special tokens (BOS/EOS/PAD) in Llama-family
#: vocabularies, and an EOS in a prompt would change what the model does.
MIN_TOKEN_ID = 10

# Independent random streams, so that e.g. asking for more prompts never changes the token ids
# of the first ones.
_STREAM_ARRIVALS, _STREAM_LENGTHS, _STREAM_PROMPT, _STREAM_PROBE = 0, 1, 2, 3


class PromptTokens(Sequence):
    """A prompt's token ids, drawn on demand from a seeded generator (``Sequence[int]``).

    Holding 19k trace prompts as Python ints would cost ~1 GB, so ids are generated when read:
    ``numpy.random.default_rng(seed_key).integers(MIN_TOKEN_ID, vocab_size, size=length)``.
    Reads are deterministic. ``list(p)``, ``tuple(p)``, ``len(p)``, ``p[i]``, ``np.asarray(p)``
    work; ``p.to_numpy()`` gives an int64 array (the fast path into ``torch.from_numpy``).
    Two PromptTokens compare equal to each other or to any sequence with the same ids.
    """

    __slots__ = ("_key", "_length", "_vocab")

    def __init__(self, seed_key: Sequence[int], length: int, vocab_size: int) -> None:
        self._key = tuple(int(k) for k in seed_key)
        self._length = int(length)
        self._vocab = int(vocab_size)

    def to_numpy(self) -> np.ndarray:
        """The ids as a fresh ``int64`` array of shape ``[len(self)]``."""
        rng = np.random.default_rng(list(self._key))
        return rng.integers(MIN_TOKEN_ID, self._vocab, size=self._length, dtype=np.int64)

    def tolist(self) -> list[int]:
        return self.to_numpy().tolist()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.to_numpy()
        return a if dtype is None else a.astype(dtype)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return tuple(self.tolist()[index])
        n = self._length
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"prompt token index {index} out of range for length {n}")
        return int(self.to_numpy()[i])

    def __iter__(self) -> Iterator[int]:
        return iter(self.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PromptTokens):
            if (self._key, self._length, self._vocab) == (other._key, other._length, other._vocab):
                return True
            return self._length == other._length and self.tolist() == other.tolist()
        if isinstance(other, (tuple, list)):
            return self._length == len(other) and self.tolist() == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self.tolist()))

    def __repr__(self) -> str:
        return f"PromptTokens(len={self._length}, vocab_size={self._vocab}, key={self._key})"


@dataclass(frozen=True)
class RequestSpec:
    """One request of the load.

    ``arrival_s``: seconds from load start. ``prompt_token_ids``: the prompt (a tuple, or a lazy
    ``PromptTokens`` from ``generate``; both are ``Sequence[int]``). ``output_len``: the forced
    number of output tokens (the engine runs with ``ignore_eos``). ``is_probe``: a one-token probe
    request that measures how long a new request waits (stall), kept out of the load's metrics.
    """

    request_id: str
    arrival_s: float
    prompt_token_ids: Sequence[int]
    output_len: int
    is_probe: bool = False

    @property
    def prompt_len(self) -> int:
        """Prompt length (tokens)."""
        return len(self.prompt_token_ids)


@dataclass
class WorkloadConfig:
    """What load to send. Field names follow ``vllm bench serve``'s flags where one exists.

    Source of requests:
      ``dataset``: "random", "azure-conv" (the bundled Azure LLM inference trace 2023,
      conversation service), a path to a CSV with ``TIMESTAMP,ContextTokens,GeneratedTokens``,
      or a phased workload: a bundled one's name (``phases.BUNDLED_WORKLOADS``) or a path to a
      ``.yaml``/``.yml`` file (docs/workloads.md). A phased workload brings its own arrivals
      and lengths, as a trace does, and is time-scaled by ``trace_speed``.

    Arrivals (random dataset only; a trace brings its own times, so ``request_rate``,
    ``burstiness`` and ``arrival`` are ignored for it):
      ``request_rate`` (req/s; ``inf`` = every request at t=0; vllm's default),
      ``burstiness`` (gamma shape; 1.0 = Poisson, < 1 burstier, > 1 smoother, ``inf`` = constant),
      ``arrival``: "poisson" (gamma inter-arrival times) or "constant" (spacing 1/rate).

    Lengths (random dataset): ``input_len``/``output_len`` (tokens; vllm's defaults 1024/128)
    drawn uniformly from the integers in ``[floor(len*(1-r)), ceil(len*(1+r))]`` with
    ``r = range_ratio`` in [0, 1) (vllm ``RandomDataset``; output length at least 1).

    Trace replay: ``trace_speed`` (2.0 = twice as fast: arrivals are divided by it; inf = all at
    t=0, an offline run), ``skip``
    (start at data row ``skip``, 0-based; arrivals count from that row).

    Clipping (every dataset): ``max_input_len`` and ``max_output_len`` cap each length;
    ``max_model_len`` then shortens the prompt (and, if the output alone does not fit, the
    output) so that prompt + output <= it, as the REFERENCE §4b baseline did.

    Size: ``num_prompts`` and/or ``duration_s`` (s of arrivals); with both, whichever is reached
    first. The random dataset needs one of them; a trace with neither is replayed whole.

    Probes: with ``probe_interval_s`` set, a probe request (``probe_input_len`` prompt tokens,
    1 output token) arrives every ``probe_interval_s`` s from t = ``probe_interval_s`` up to the
    load's horizon (``duration_s`` if given, else the last load arrival).

    Token ids: uniform in ``[10, vocab_size)`` (set ``vocab_size`` to the model's), seeded by
    ``seed``; request *i*'s prompt depends only on (seed, i, its length).

    Raises ConfigError (at construction and in ``validate``) naming the value and allowed range.
    """

    dataset: str = "random"
    request_rate: float = math.inf
    burstiness: float = 1.0
    arrival: str = "poisson"
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    num_prompts: int | None = None
    duration_s: float | None = None
    trace_speed: float = 1.0
    skip: int = 0
    max_input_len: int | None = None
    max_output_len: int | None = None
    max_model_len: int | None = None
    vocab_size: int = 32000
    seed: int = 0
    probe_interval_s: float | None = None
    probe_input_len: int = 16

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check and normalise every field in place. Raises ConfigError on the first bad one."""
        ds = str(self.dataset).strip()
        if not ds:
            raise ConfigError(f"--dataset {self.dataset!r} is empty: use one of "
                              f"{', '.join(DATASET_NAMES)} or a path to a CSV file")
        self.dataset = ds
        if self.is_phased:
            from .phases import load_workload

            load_workload(ds)  # raises for a missing file, bad YAML, a bad key or value
        elif not self.is_random:
            dataset_path(ds)  # raises for an unknown name or a missing file

        rate = _num("--request-rate", self.request_rate, allow_inf=True)
        if not rate > 0:
            raise ConfigError(f"--request-rate {self.request_rate!r} must be > 0 (req/s) or inf")
        self.request_rate = rate
        b = _num("--burstiness", self.burstiness, allow_inf=True)
        if not b > 0:
            raise ConfigError(f"--burstiness {self.burstiness!r} must be > 0 "
                              "(1.0 = Poisson; < 1 burstier; > 1 smoother)")
        self.burstiness = b
        arr = str(self.arrival).strip().lower()
        if arr == "gamma":  # the same process; vllm calls it Poisson/gamma
            arr = "poisson"
        if arr not in ARRIVALS:
            raise ConfigError(f"--arrival {self.arrival!r} is not one of {', '.join(ARRIVALS)}")
        self.arrival = arr

        self.input_len = _int("--input-len", self.input_len, 1)
        self.output_len = _int("--output-len", self.output_len, 1)
        r = _num("--range-ratio", self.range_ratio)
        if not 0.0 <= r < 1.0:
            raise ConfigError(f"--range-ratio {self.range_ratio!r} is out of range: allowed [0, 1)")
        self.range_ratio = r

        if self.num_prompts is not None:
            self.num_prompts = _int("--num-prompts", self.num_prompts, 1, MAX_REQUESTS)
        if self.duration_s is not None:
            d = _num("--duration", self.duration_s)
            if not d > 0:
                raise ConfigError(f"--duration {self.duration_s!r} must be > 0 (s)")
            self.duration_s = d
        ts = _num("--trace-speed", self.trace_speed, allow_inf=True)
        if not ts > 0:
            raise ConfigError(f"--trace-speed {self.trace_speed!r} must be > 0 "
                              "(1.0 = real time, 2.0 = twice as fast, inf = all at once)")
        self.trace_speed = ts
        self.skip = _int("--skip", self.skip, 0)

        if self.max_input_len is not None:
            self.max_input_len = _int("--max-input-len", self.max_input_len, 1)
        if self.max_output_len is not None:
            self.max_output_len = _int("--max-output-len", self.max_output_len, 1)
        if self.max_model_len is not None:
            self.max_model_len = _int("--max-model-len", self.max_model_len, 2)
        self.vocab_size = _int("--vocab-size", self.vocab_size, MIN_TOKEN_ID + 1)
        self.seed = _int("--seed", self.seed, 0, 2**63 - 1)
        if self.probe_interval_s is not None:
            p = _num("--probe-interval", self.probe_interval_s)
            if not p > 0:
                raise ConfigError(f"--probe-interval {self.probe_interval_s!r} must be > 0 (s)")
            self.probe_interval_s = p
        self.probe_input_len = _int("--probe-input-len", self.probe_input_len, 1)

        if self.is_random:
            if self.num_prompts is None and self.duration_s is None:
                raise ConfigError("the random dataset needs --num-prompts or --duration "
                                  "(neither was given)")
            if self.num_prompts is None and math.isinf(rate):
                raise ConfigError("--request-rate inf sends every request at t=0, so --duration "
                                  "alone cannot bound it: give --num-prompts")
            if self.num_prompts is None and self.duration_s * rate > MAX_REQUESTS:
                raise ConfigError(f"--duration {self.duration_s} at --request-rate {rate} is about "
                                  f"{self.duration_s * rate:.0f} requests: allowed <= {MAX_REQUESTS}")

    @property
    def is_random(self) -> bool:
        return self.dataset == "random"

    @property
    def is_phased(self) -> bool:
        """A phased workload (a bundled name or a .yaml/.yml path), not a trace CSV."""
        from .phases import is_workload

        return is_workload(self.dataset)


# ---------------------------------------------------------------------------------------------
# Generation

def _clip(cfg: WorkloadConfig, prompt: int, output: int) -> tuple[int, int]:
    if cfg.max_input_len is not None:
        prompt = min(prompt, cfg.max_input_len)
    if cfg.max_output_len is not None:
        output = min(output, cfg.max_output_len)
    if cfg.max_model_len is not None and prompt + output > cfg.max_model_len:
        # Shorten the prompt first (keep the forced output); leave it at least one token.
        output = min(output, cfg.max_model_len - 1)
        prompt = min(prompt, cfg.max_model_len - output)
    return prompt, output


def _gaps(cfg: WorkloadConfig, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` inter-arrival times (s): gamma(shape=burstiness, scale=1/(rate*burstiness)), mean
    1/rate and CV² 1/burstiness (vllm ``get_request``); constant 1/rate; zeros for rate inf."""
    rate, b = cfg.request_rate, cfg.burstiness
    if math.isinf(rate):
        return np.zeros(n)
    if cfg.arrival == "constant" or math.isinf(b):
        return np.full(n, 1.0 / rate)
    return rng.gamma(shape=b, scale=1.0 / (rate * b), size=n)


def _random_arrivals(cfg: WorkloadConfig) -> np.ndarray:
    rng = np.random.default_rng([cfg.seed, _STREAM_ARRIVALS])
    if cfg.num_prompts is not None:
        t = np.cumsum(_gaps(cfg, rng, cfg.num_prompts))
        if t[-1] > 0:
            # vllm get_request rescales so the last request lands at N/rate exactly, which
            # steadies the achieved rate across seeds.
            t *= (cfg.num_prompts / cfg.request_rate) / t[-1]
        if cfg.duration_s is not None:
            t = t[t < cfg.duration_s]
        return t
    # Duration only: draw in chunks until past the horizon (no rescaling: N is not fixed).
    chunk = max(64, int(cfg.duration_s * cfg.request_rate * 1.1) + 1)
    parts, total = [], 0.0
    while total < cfg.duration_s:
        t = total + np.cumsum(_gaps(cfg, rng, chunk))
        parts.append(t)
        total = float(t[-1])
    t = np.concatenate(parts)
    return t[t < cfg.duration_s]


def _random_lengths(cfg: WorkloadConfig, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([cfg.seed, _STREAM_LENGTHS])
    r = cfg.range_ratio
    in_lo = max(1, math.floor(cfg.input_len * (1 - r)))
    in_hi = max(in_lo, math.ceil(cfg.input_len * (1 + r)))
    out_lo = max(1, math.floor(cfg.output_len * (1 - r)))
    out_hi = max(out_lo, math.ceil(cfg.output_len * (1 + r)))
    return (rng.integers(in_lo, in_hi + 1, size=n), rng.integers(out_lo, out_hi + 1, size=n))


def _trace_rows(cfg: WorkloadConfig) -> list[tuple[float, int, int]]:
    rows = load_trace_csv(dataset_path(cfg.dataset))
    if cfg.skip >= len(rows):
        raise ConfigError(f"--skip {cfg.skip} is out of range: the trace has {len(rows)} rows "
                          f"(allowed [0, {len(rows) - 1}])")
    rows = rows[cfg.skip:]
    t0 = rows[0][0]
    return _cut(cfg, (((t - t0) / cfg.trace_speed, ctx, gen) for t, ctx, gen in rows))


def _cut(cfg: WorkloadConfig, items: Iterable[tuple[float, int, int]]
         ) -> list[tuple[float, int, int]]:
    """``items`` (arrival s, prompt, output; in arrival order) up to ``cfg.duration_s`` (an
    arrival at or after it is left out) and at most ``cfg.num_prompts`` of them."""
    out = []
    for a, ctx, gen in items:
        if cfg.duration_s is not None and a >= cfg.duration_s:
            break
        out.append((a, ctx, gen))
        if cfg.num_prompts is not None and len(out) >= cfg.num_prompts:
            break
    return out


def _phased_rows(cfg: WorkloadConfig) -> list[tuple[float, int, int]]:
    """A phased workload's items, time-scaled by ``trace_speed`` from the load's start (not
    from the first arrival: a quiet first phase stays quiet) and cut as a trace is."""
    from .phases import load_workload, phase_items

    items = (x for ph in phase_items(load_workload(cfg.dataset), cfg.seed) for x in ph)
    # speed inf: all at 0
    return _cut(cfg, ((a / cfg.trace_speed if a > 0 else 0.0, ctx, gen)
                      for a, ctx, gen in items))


def _items(cfg: WorkloadConfig) -> list[tuple[float, int, int]]:
    """The load's ``(arrival_s, prompt_len, output_len)`` before clipping (probes left out)."""
    if cfg.is_random:
        arrivals = _random_arrivals(cfg)
        ins, outs = _random_lengths(cfg, len(arrivals))
        return list(zip(arrivals.tolist(), ins.tolist(), outs.tolist()))
    if cfg.is_phased:
        return _phased_rows(cfg)
    return _trace_rows(cfg)


def _probe_horizon(cfg: WorkloadConfig, specs: list[RequestSpec]) -> float:
    """Where probes stop (s): ``duration_s``; else a phased workload's end (its quiet last
    phase counts) unless ``num_prompts`` cut it short; else the last load arrival."""
    last = specs[-1].arrival_s if specs else 0.0
    if cfg.is_phased:
        from .phases import load_workload

        end = load_workload(cfg.dataset).duration_s / cfg.trace_speed
        if cfg.duration_s is not None:
            end = min(end, cfg.duration_s)
        cut = cfg.num_prompts is not None and len(specs) >= cfg.num_prompts
        return last if cut else end
    return cfg.duration_s if cfg.duration_s is not None else last


@dataclass(frozen=True)
class ClipStats:
    """What ``max_model_len`` cut from a load (after ``max_input_len``/``max_output_len``, which
    the user asked for): of ``requests`` requests, ``prompts`` had their prompt and ``outputs``
    their output shortened so that prompt + output <= ``max_model_len``; ``prompt_max`` and
    ``output_max`` are the longest such clipped lengths (tokens; 0 when none was clipped)."""

    max_model_len: int | None
    requests: int
    prompts: int = 0
    outputs: int = 0
    prompt_max: int = 0
    output_max: int = 0

    @property
    def any(self) -> bool:
        return bool(self.prompts or self.outputs)


def clip_stats(cfg: WorkloadConfig) -> ClipStats:
    """Count the requests of ``cfg``'s load (probes left out) whose lengths ``max_model_len``
    shortens in ``generate``. Prints nothing: the caller reports it. Raises ConfigError as
    ``generate`` does (bad config, unreadable or malformed trace file)."""
    cfg.validate()
    items = _items(cfg)
    n_p = n_o = p_max = o_max = 0
    if cfg.max_model_len is not None:
        only_caps = replace(cfg, max_model_len=None)
        for _, p, o in items:
            p1, o1 = _clip(only_caps, int(p), int(o))
            p2, o2 = _clip(cfg, p1, o1)
            if p2 < p1:
                n_p, p_max = n_p + 1, max(p_max, p2)
            if o2 < o1:
                n_o, o_max = n_o + 1, max(o_max, o2)
    return ClipStats(cfg.max_model_len, len(items), n_p, n_o, p_max, o_max)


def generate(cfg: WorkloadConfig) -> list[RequestSpec]:
    """The whole request stream of ``cfg``, probes included, sorted by ``arrival_s``.

    Random dataset: arrivals are cumulative sums of gamma inter-arrival times (shape
    ``burstiness``, scale ``1/(request_rate*burstiness)``, so mean interval 1/rate), rescaled when
    ``num_prompts`` is given so that the last lands at ``num_prompts/request_rate``, as
    ``vllm bench serve`` does; ``arrival="constant"`` spaces them by exactly 1/rate; rate ``inf``
    puts every request at t=0. Trace: ``arrival_s = (timestamp - first timestamp)/trace_speed``
    with the lengths from the file; ``request_rate``, ``burstiness``, ``arrival``, ``input_len``,
    ``output_len`` and ``range_ratio`` are ignored. Both: lengths clipped (see WorkloadConfig);
    stop at ``num_prompts`` or ``duration_s``, whichever comes first.

    Deterministic: the same cfg (same ``seed``) gives an equal list, token ids included.
    Request ids are ``req-<i>`` (0-based position in the load) and ``probe-<k>``.
    Raises ConfigError for a bad config or a malformed trace file.
    """
    cfg.validate()
    items = _items(cfg)

    specs: list[RequestSpec] = []
    for i, (a, p, o) in enumerate(items):
        p, o = _clip(cfg, int(p), int(o))
        ids = PromptTokens((cfg.seed, _STREAM_PROMPT, i), p, cfg.vocab_size)
        specs.append(RequestSpec(f"{REQUEST_ID_PREFIX}{i}", float(a), ids, o, False))

    if cfg.probe_interval_s is not None:
        horizon = _probe_horizon(cfg, specs)
        plen, _ = _clip(cfg, cfg.probe_input_len, 1)
        n_probes = int(math.floor(horizon / cfg.probe_interval_s + 1e-9))
        for k in range(n_probes):
            ids = PromptTokens((cfg.seed, _STREAM_PROBE, k), plen, cfg.vocab_size)
            specs.append(RequestSpec(f"{PROBE_ID_PREFIX}{k}", (k + 1) * cfg.probe_interval_s,
                                     ids, 1, True))
        # Stable sort: at equal times the load request comes before the probe.
        specs.sort(key=lambda s: s.arrival_s)
    return specs
