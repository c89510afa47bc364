"""Following one request: request ids, structured logs and OpenTelemetry traces."""
