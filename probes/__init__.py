"""Measured streams: NVML/GPM and host samplers, rolling timelines, latency metrics, the session trace."""
