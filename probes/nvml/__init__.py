"""NVML in layers, as nvitop's ``api/`` keeps them (facts only, no code taken from it):

* ``library.py`` — the binding: pynvml loaded and initialised lazily (:func:`nvml_library`,
  :class:`NvmlLibrary`), "not supported" as the :data:`NA` sentinel, error reasons
  (:func:`describe_nvml_error`), ``--gpus`` parsing (:func:`parse_gpus`).
* ``fields.py`` — the one table of GPU fields (:class:`GpuField`: name, unit, NVML call,
  cadence, /metrics gauge); the sample type, the sampler, /metrics and the report follow it.
* ``sampler.py`` — :class:`GpuSample` and :class:`NvmlSampler`, the thread that reads every GPU
  at ``--sample-hz`` (GPM, PCIe and slow-field cadences are described there).
* ``fake.py`` — ``FakeNvml``, a stand-in pynvml for tests, benchmarks and demos; not exported
  here (import it from ``gpuchef.probes.nvml.fake``).

What this package exports below is what the rest of gpuchef (session, TUI, report, commands)
uses; nothing outside ``probes/`` imports ``library`` or ``sampler`` directly (``fields`` may be:
it imports nothing of gpuchef).
"""

from .fields import GPM_FIELDS, GPM_METRICS, GpuField
from .library import (MAX_GPU_INDEX, NA, NvmlLibrary, NvmlUnavailable, describe_nvml_error,
                      nvml_library, parse_gpus)
from .sampler import DEFAULT_SAMPLE_HZ, SAMPLE_HZ_RANGE, GpuSample, NvmlSampler

__all__ = ["DEFAULT_SAMPLE_HZ", "GPM_FIELDS", "GPM_METRICS", "MAX_GPU_INDEX", "NA", "GpuField",
           "GpuSample", "NvmlLibrary", "NvmlSampler", "NvmlUnavailable", "SAMPLE_HZ_RANGE",
           "describe_nvml_error", "nvml_library", "parse_gpus"]
