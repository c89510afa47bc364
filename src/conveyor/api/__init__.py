"""The HTTP surface (ASGI): the two apps, their route tables and the layers in front.

``app`` builds ``serve``'s and a worker's app around a ``host.Service``; ``gateway_app`` a
gateway's around a ``gateway.process.Gateway``. Routes: ``inference`` (+ ``sse``), ``meta``,
``lora``, ``files``, ``batches``, ``usage``, ``dashboard`` and the gateway's ``fleet``; thin
handlers that parse, call the service or the gateway, and format. The layers every app
wears: ``edge``, ``middleware`` (``auth``, ``body_limit``, ``budget``, ``rate_limit``),
``slow_clients`` (+ ``connection_limits``, ``connection_budget``), ``errors``; and
``server`` (+ ``server_processes``), the uvicorn set-up every process shares.
"""
