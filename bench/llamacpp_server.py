"""llama-cpp-python's OpenAI server, as ``python -m llama_cpp.server`` runs it, taking the
requests ``vllm bench serve`` sends.

The served benchmark's ``llamacpp`` contender runs this with ``.venv-llamacpp``'s Python
(the same command-line options as ``python -m llama_cpp.server``). Two things in that
server refuse the load client's requests, and are changed here; nothing else is:

- its request-id middleware answers 400 to a request whose ``x-request-id`` header is not
  a UUID, and ``vllm bench serve`` names every request ``bench-<hex>-<index>``: the
  middleware keeps the header without checking it;
- it hands a chat message's content to the model's chat template as it came, and
  ``vllm bench serve`` sends it as a list of text parts, which SmolLM2's template cannot
  join to a string (a 500): text-only content is joined into one string first, as
  vLLM's and Conveyor's servers do.

It imports nothing of Conveyor (that environment has only llama-cpp-python).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any


def text_only_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each content made only of text parts joined into one string
    (other contents, images or plain strings, as they are)."""
    joined = []
    for message in messages:
        content = message.get("content")
        is_text = isinstance(content, list) and all(
            isinstance(part, dict) and part.get("type") == "text" for part in content
        )
        if is_text:
            message = {**message, "content": "".join(part["text"] for part in content)}
        joined.append(message)
    return joined


def main() -> Any:
    """Start the server with both changes."""
    from llama_cpp import llama_chat_format
    from llama_cpp.server import __main__ as server_main
    from llama_cpp.server import app

    app.RequestIdPlugin = functools.partial(app.RequestIdPlugin, validate=False)
    formatter = llama_chat_format.Jinja2ChatFormatter
    render = formatter.__call__

    def render_text(self: Any, *, messages: Sequence[dict[str, Any]], **kwargs: Any) -> Any:
        return render(self, messages=text_only_messages(messages), **kwargs)

    formatter.__call__ = render_text  # type: ignore[method-assign]
    return server_main.main()


if __name__ == "__main__":
    main()
