"""The HTTP front door: `gpuchef serve` / `gpuchef top --serve` — an OpenAI-compatible API, Prometheus /metrics and a knob endpoint over the hosted engine."""
