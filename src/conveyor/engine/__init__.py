"""Continuous batching for generative models.

Torch-free: ``sequence``, ``block_manager``, ``scheduler`` and ``step`` (the plain
logic), ``hf_config``, ``sampling_params``, ``outputs``, ``inbox``, ``stream`` and
``generator`` (what callers import). The model side needs torch: ``llama`` stacks the
blocks of ``layers/`` over the tensors of ``step_inputs``, ``weight_loader`` fills it,
``model_runner`` runs it, ``sampling`` picks tokens, ``llm_engine`` steps it all and
``generator_factory`` builds one from a config entry.
"""
