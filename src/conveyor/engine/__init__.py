"""Continuous batching for generative models.

Pure logic (``sequence``, ``block_manager``, ``scheduler``) imports no torch;
``model_runner``, ``llama`` and ``sampling`` do.
"""
