"""The gateway: holds no model; authenticates, admits, routes and answers for the fleet.

``process`` is one gateway's state (registry view, router, proxy, scaling meters) and its
Files and Batches; ``proxy`` is the ASGI app that takes an online request and answers it;
``forward`` sends a request to a worker and retries elsewhere; ``sniff`` reads the
``model`` from a body; ``limits`` applies the tenants' rate limits in the proxy; ``status``
is what ``GET /v1/fleet`` and the model list say. The route table and the app factory are
``api.fleet`` and ``api.gateway_app``; the pure fleet parts (router, affinity, registry,
upstream pool, scaling) are in ``fleet``.
"""
