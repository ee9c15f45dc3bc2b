"""The vocabulary every room shares: errors, the knob table and its labels, the records the
engine sends out, workloads and their data, the tokenizer.

This package is the bottom of the import graph: it imports nothing of gpuchef outside itself
(``tests/test_layering.py`` checks), so the engine (``engine_host/``), the probes, the dashboard
and the commands all read these names from one place without importing the engine.
"""
