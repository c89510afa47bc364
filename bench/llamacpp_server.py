"""llama-cpp-python's OpenAI server, as ``python -m llama_cpp.server`` runs it, taking any
``x-request-id``.

The served benchmark's ``llamacpp`` contender runs this with ``.venv-llamacpp``'s Python
(the same command-line options as ``python -m llama_cpp.server``). The server's request-id
middleware answers 400 to a request whose ``x-request-id`` header is not a UUID, and
``vllm bench serve`` names every request ``bench-<hex>-<index>``: here the middleware keeps
the header without checking it. Nothing else changes. It imports nothing of Conveyor
(that environment has only llama-cpp-python).
"""

from __future__ import annotations

import functools
from typing import Any


def main() -> Any:
    """Start the server with the request-id check off."""
    from llama_cpp.server import __main__ as server_main
    from llama_cpp.server import app

    app.RequestIdPlugin = functools.partial(app.RequestIdPlugin, validate=False)
    return server_main.main()


if __name__ == "__main__":
    main()
