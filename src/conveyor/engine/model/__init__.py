"""The model side of the engine (torch): the Llama family, its layers, weights and runner.

``llama`` stacks the blocks of ``layers/`` over the tensors of ``step_inputs``;
``hf_config`` reads a checkpoint's config; ``weight_loader`` fills the model from
safetensors or GGUF (``gguf_format``, ``gguf_loader``; ``gguf_import`` converts a GGUF
file into a checkpoint directory); ``decode_buckets`` plans padded decode batches;
``model_runner`` runs a step; ``lora/`` holds adapters. ``hf_config``, ``gguf_format``,
``decode_buckets`` and ``lora.registry`` import without torch.
"""
