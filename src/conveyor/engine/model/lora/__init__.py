"""Many LoRA adapters on one base model, in mixed batches.

``peft_format`` reads a PEFT adapter directory into weights packed like the decoder's
projections; ``registry`` names adapters and keeps their host copies in an LRU;
``runtime`` keeps ``max_loras_per_batch`` of them on the device and adds each token's
own low-rank delta after the shared base matmul (``layers``).
"""
