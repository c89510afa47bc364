"""The ``conveyor`` command line (``main.app``), one module per command group.

``main`` has ``serve``, ``worker``, ``gateway`` and ``check-config`` and mounts the rest:
``batch`` (submit and follow batches), ``keys`` (API keys in the store), ``models``
(import, push and list models), ``plan`` (size a deployment) and ``usage`` (the usage
ledger). ``quick_serve`` picks the models ``serve`` runs with no config file and
``startup_checks`` checks the configured models before anything loads.
"""
