"""ASGI plumbing shared by a worker's API and the gateway's proxy: no routes, no models.

``json`` is the one way Conveyor answers with JSON (errors included); ``disconnect``
notices a caller who leaves; ``timeouts`` reads the caller's own deadline. The route
tables and app factories built on these are in ``api``; the proxy is in ``gateway``.
"""
