"""Anthropic's Messages API on the chat path (no HTTP here).

``schemas`` holds the request bodies (Anthropic's shapes), ``convert`` turns one into a chat
request the engine already runs, ``reply`` builds the ``message`` object and its stop
reason, ``events`` the streamed event sequence, and ``run`` prepares, runs and counts a
request for the HTTP routes and for batch lines alike.
"""
