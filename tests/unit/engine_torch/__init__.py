"""Tests of the torch side of the generative engine (decoder, runner, sampling, tokenizer)."""
