"""The endpoint paths Conveyor serves a body to: the one list of batchable paths.

Anthropic's Messages paths sit here too: a Message Batch runs its requests as batch lines
whose url is ``MESSAGES`` (they are not an OpenAI Batch API ``url``).
"""

from __future__ import annotations

EMBEDDINGS = "/v1/embeddings"
COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
RESPONSES = "/v1/responses"
RERANK = "/v1/rerank"
SCORE = "/v1/score"
GENERATION_ENDPOINTS = (COMPLETIONS, CHAT_COMPLETIONS)
# Every path a batch line may name (OpenAI's Batch API `url`; rerank is Conveyor's extra).
BATCH_ENDPOINTS = (EMBEDDINGS, *GENERATION_ENDPOINTS, RESPONSES, RERANK)
# Anthropic's Messages API.
MESSAGES = "/v1/messages"
MESSAGES_COUNT_TOKENS = "/v1/messages/count_tokens"
# vLLM's tokenizer routes (outside /v1, as vLLM serves them).
TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"
# Every POST path a gateway forwards to a worker hosting the body's model.
PROXIED_ENDPOINTS = (
    *BATCH_ENDPOINTS, SCORE, MESSAGES, MESSAGES_COUNT_TOKENS, TOKENIZE, DETOKENIZE,
)  # fmt: skip
