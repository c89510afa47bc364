"""OpenTelemetry traces: the tracer from config, server spans, child spans, propagation.

Everything here is a no-op when the current request has no tracer (tracing is off by
default), so the hot path pays one attribute check. The W3C ``traceparent`` header carries
a trace from the gateway to the worker.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from conveyor.observability.context import REQUEST_ID_HEADER, current_request
from conveyor.observability.settings import TracingConfig

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

TRACER_NAME = "conveyor"


def build_provider(config: TracingConfig, default_service_name: str) -> TracerProvider | None:
    """A provider exporting to ``config.otlp_endpoint`` in batches; None when tracing is off."""
    if config.otlp_endpoint is None:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    service_name = config.service_name or default_service_name
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name}),
        sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.otlp_endpoint)))
    return provider


def tracer_of(provider: TracerProvider | None) -> Tracer | None:
    """Conveyor's tracer from ``provider`` (None stays None: tracing off)."""
    return None if provider is None else provider.get_tracer(TRACER_NAME)


@contextmanager
def server_span(
    tracer: Tracer, name: str, headers: Mapping[str, str], attributes: dict[str, Any]
) -> Iterator[Span]:
    """The span of one incoming request, continuing the caller's ``traceparent`` if any."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = TraceContextTextMapPropagator().extract(headers)
    with tracer.start_as_current_span(
        name, context=parent, kind=trace.SpanKind.SERVER, attributes=attributes
    ) as span:
        yield span


_UNTRACED: AbstractContextManager[None] = nullcontext()


def child_span(name: str, **attributes: Any) -> AbstractContextManager[Span | None]:
    """A span under the current one when the current request is traced; else nothing (a
    shared no-op context, so an untraced request pays no generator for it)."""
    context = current_request()
    if context is None or context.tracer is None:
        return _UNTRACED
    return context.tracer.start_as_current_span(name, attributes=attributes)


def outbound_headers() -> list[tuple[str, str]]:
    """Headers that carry the current request onwards: its id and the W3C trace context."""
    context = current_request()
    if context is None:
        return []
    headers = [(REQUEST_ID_HEADER, context.request_id)]
    if context.tracer is not None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        headers.extend(carrier.items())
    return headers
