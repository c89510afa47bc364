"""Tenants: API keys, token rate limits, usage and cost.

Pure rules (`keys`, `buckets`, `estimate`, `budget`, `usage`, `usage_report`) sit beside the
parts that do I/O (`keyring` reads the job store, `ledger` writes usage to it,
`limiter_redis` and `limiter_shares` talk to Redis); `gate` and `ticket` admit requests
against the limits; the API layer wires them in.
"""
