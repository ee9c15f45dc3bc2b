"""NVML in layers, as nvitop's ``api/`` keeps them (facts only, no code taken from it):

* ``library.py`` — the binding: pynvml loaded and initialised lazily (:func:`nvml_library`,
  :class:`NvmlLibrary`), "not supported" as the :data:`NA` sentinel, error reasons
  (:func:`describe_nvml_error`), ``--gpus`` parsing (:func:`parse_gpus`).
* ``sampler.py`` — :class:`GpuSample` and :class:`NvmlSampler`, the thread that reads every GPU
  at ``--sample-hz`` (GPM, PCIe and slow-field cadences are described there).
* ``fake.py`` — ``FakeNvml``, a stand-in pynvml for tests, benchmarks and demos; not exported
  here (import it from ``gpuchef.probes.nvml.fake``).

What this package exports below is what the rest of gpuchef (session, TUI, report, commands)
uses; nothing outside ``probes/`` imports ``library`` or ``sampler`` directly.
"""

from .library import (MAX_GPU_INDEX, NA, NvmlLibrary, NvmlUnavailable, describe_nvml_error,
                      nvml_library, parse_gpus)
from .sampler import (DEFAULT_SAMPLE_HZ, GPM_FIELDS, GPM_METRICS, SAMPLE_HZ_RANGE, GpuSample,
                      NvmlSampler)

__all__ = ["DEFAULT_SAMPLE_HZ", "GPM_FIELDS", "GPM_METRICS", "MAX_GPU_INDEX", "NA",
           "GpuSample", "NvmlLibrary", "NvmlSampler", "NvmlUnavailable", "SAMPLE_HZ_RANGE",
           "describe_nvml_error", "nvml_library", "parse_gpus"]
