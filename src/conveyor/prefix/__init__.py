"""Prefix-cache identity shared by the engine and the gateway (torch-free).

The engine names each full KV block by a hash chained over every token before it
(``hashing``); workers report a bounded digest of the hashes they hold in their heartbeat,
and the gateway hashes a request's prompt the same way to find the worker that already
holds its longest prefix (``fleet.affinity``).
"""
