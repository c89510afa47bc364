"""Continuous batching for generative models.

Pure logic imports no torch: ``sequence``, ``block_manager``, ``scheduler``, ``step``,
``hf_config``. The model side does: ``llama`` stacks the blocks of ``layers/`` over the
tensors of ``step_inputs``, ``weight_loader`` fills it, ``model_runner`` runs it.
"""
