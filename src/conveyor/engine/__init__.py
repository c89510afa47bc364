"""Continuous batching for generative models, in three layers and the loop over them.

``core/`` is the plain logic, free of torch (sequences, block manager, scheduler);
``model/`` the torch side (the Llama family, its layers, weight loading, the runner, LoRA);
``sampling/`` picks tokens (parameters, logits shaping, grammar masks). Here, the loop and
its I/O: ``llm_engine`` steps it all on its own thread, ``request`` is one request inside
it, ``inbox`` carries commands to it, ``outputs`` and ``stream`` carry tokens back,
``tokenizer`` turns text into ids and back, ``generator`` is what callers hold (torch-free
with ``inbox``, ``outputs`` and ``stream``), ``generator_factory`` builds one from a
config entry, and ``engine_metrics`` and ``null_metrics`` count what it does.
"""
