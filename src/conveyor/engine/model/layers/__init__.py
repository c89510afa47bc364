"""The decoder's building blocks, one per module.

Module and parameter names mirror Hugging Face's so checkpoints load by name; only q/k/v
and gate/up are packed into one matrix each (one matmul instead of three or two).
"""
