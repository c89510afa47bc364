"""The gateway: holds no model; authenticates, admits, routes and answers for the fleet.

``process`` is one gateway's state (registry view, router, proxy, scaling meters) and its
Files and Batches; ``forward`` sends a request to a worker and retries elsewhere; ``sniff``
reads the ``model`` from a body; ``limits`` applies the tenants' rate limits in the proxy;
``status`` is what ``GET /v1/fleet`` and the model list say. The routes and the app
factory are in ``api.fleet`` and ``api.gateway_app``; the pure fleet parts (router,
affinity, registry, upstream pool, scaling) in ``fleet``.
"""
