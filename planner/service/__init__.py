"""The planner service: the runner (clock and I/O), the HTTP API, Prometheus metrics, the diagnostics page."""

__all__: list[str] = []
