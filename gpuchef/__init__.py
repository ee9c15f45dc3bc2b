"""gpuchef: a live terminal dashboard and profiler for LLM inference scheduling."""

__version__ = "0.1.0"
