"""Watching the service: Prometheus metrics, and following one request through it.

``metrics`` defines every Prometheus metric Conveyor exports. Following a request:
``context`` (who a piece of work belongs to), ``logs`` and ``middleware`` (structured logs,
the edge's request line), ``tracing`` with ``settings`` (OpenTelemetry traces and their
config section), ``batches`` and ``engine_spans`` (what a model batch or an engine step
tells the requests it served).
"""
