"""The fleet's parts that the gateway process and the workers share or build on.

Routing decisions: ``router`` (power of two choices on load), ``affinity`` (prefix and
session affinity within a load bound), ``route_hint`` with ``prompt_tokens`` (the hint a
gateway reads from a request, with its own torch-free tokenizer), ``scaling`` (arrival and
service rates, replicas wanted). The worker registry: ``registry_store`` (the store's
protocol), ``registry`` (a gateway's view of it), ``heartbeat`` (a worker's rows in it).
``upstream`` is the gateway's pooled HTTP client to workers; ``credential`` with
``key_config`` the fleet key a gateway vouches for its callers with. The gateway process
itself is in ``gateway``.
"""
