"""Tenants: API keys, token rate limits, usage and cost.

Pure rules (`keys`, `buckets`, `admission`) sit beside the parts that do I/O (`keyring`
reads the job store, `limiter_redis` talks to Redis); the API layer wires them in.
"""
