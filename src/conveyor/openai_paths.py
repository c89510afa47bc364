"""The OpenAI endpoint paths Conveyor serves a body to: the one list of batchable paths."""

from __future__ import annotations

EMBEDDINGS = "/v1/embeddings"
COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
GENERATION_ENDPOINTS = (COMPLETIONS, CHAT_COMPLETIONS)
# Every path a batch line may name (OpenAI's Batch API `url`).
BATCH_ENDPOINTS = (EMBEDDINGS, *GENERATION_ENDPOINTS)
