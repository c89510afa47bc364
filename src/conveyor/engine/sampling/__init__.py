"""Picking tokens: ``params`` (what a request asks for, torch-free), ``logits`` (penalties
and temperature), ``mask`` (grammar masks, computed off the step), ``grammar`` (JSON
schemas and tool calls compiled for llguidance) and ``sampler`` (the draw itself).
"""
