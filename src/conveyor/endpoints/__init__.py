"""OpenAI endpoint logic shared by the HTTP API and batch jobs (no HTTP here).

Importing the package loads nothing: the gateway, which hosts no model, uses only
``paths``, ``schemas`` and ``validation``. ``dispatch.execute`` runs a batch line's body.
"""
