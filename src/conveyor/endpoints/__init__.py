"""OpenAI endpoint logic shared by the HTTP API and batch jobs (no HTTP here).

One module per request kind (``embeddings``, ``completions``, ``chat``, ``rerank``,
``tokenize``, ``lora_adapters``), its body's schema beside it (``schemas`` and the
``*_schemas`` modules, ``validation``), what completions and chat share (``generation``,
``tools``, ``off_loop``, ``answers`` with ``large_json``), and ``dispatch``, which runs a
batch line's body on a ``host.Service``. Importing the package loads nothing: the gateway,
which hosts no model, imports ``validation`` and, for its OpenAPI document, the schemas.
"""
