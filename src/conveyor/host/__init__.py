"""The model host on a worker: the models it loads and how their inputs reach them.

``service`` is the ``Service`` (loads the configured models, owns their batchers and
engines, answers callers; the library entry); ``hosted_model`` is one loaded one-shot model
with the checks, encoding and queueing of its inputs; ``model_cache`` is the memory
budget's LRU of loaded models; ``offload`` runs large inputs' CPU work on a pool of its own,
off the event loop.
"""
