"""gpuchef's LLM engine: paged KV cache, a two-mode scheduler, Llama-family models, the host thread.

This package imports nothing else of gpuchef: the engine never knows a dashboard exists. The
names every room shares (errors, knob table, records, workloads, tokenizer) are in ``vocab/``,
which imports nothing of the engine.
"""
